#!/usr/bin/python
"""Start, watch and stop ranks that run as bare processes on a node (no containers)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: rank_processes
short_description: Bare-process ranks, supervised by systemd or by pid files
description:
  - With I(state=started) it starts one process per entry of I(ranks). Where systemd runs,
    each is a transient unit (systemd-run); elsewhere a background process in its own
    session, tracked by a pid file, whose exit code a wrapper writes when it ends.
    Output goes to C(<run_dir>/<name>.log).
  - With I(state=status) it reports each one's state, exit code and last log line, in the
    shape rank_containers uses, so wait_ranks and job_report treat both alike.
  - With I(state=absent) it kills what still runs (the whole process group or unit).
  - With I(run), I(state=started) first makes the run's folder as run_state's
    I(state=present) does (the workload, pruning, the files), so that a process-mode
    node's start is one call. I(run)'s files and workload stay out of the result.
author: torchfleet developers (!UNKNOWN)
notes:
  - The rank_processes action plugin runs this module. It takes I(role) for itself, and
    sends the workload that C(run.workload) names on the controller along with the call,
    as M(torchfleet.cluster.run_state)'s action does.
options:
  role:
    description:
      - The launch role's folder, read by the action. The host's variables are checked against
        its argument spec first, as M(torchfleet.cluster.run_state)'s I(role); nothing runs on
        the node if they fail.
    type: path
  run_dir:
    description: The run's folder on the node; with I(state=absent), every run under it when I(recurse).
    type: path
    required: true
  state:
    description: What to do.
    type: str
    choices: [started, status, absent]
    default: status
  ranks:
    description: For I(state=started), one entry per process with rank, name, role, argv, env, cwd and cpuset.
    type: list
    elements: dict
    default: []
  run:
    description:
      - For I(state=started), the run's folder to make first; run_state's options
        C(node_dir), C(run_id), C(files), C(keep), C(owner), C(group), C(dirs) and C(workload).
      - C(workload) is given as to M(torchfleet.cluster.run_state) (C(archive), C(dest), C(keep)
        and C(inline_max)); the action sends the tar.
    type: dict
  secret_env:
    description:
      - For I(state=started), environment every process gets that must not show on a command
        line (systemd-run's --setenv) or in a file others can read. Each process's shell reads
        it from a file of mode 0600, then deletes the file.
    type: dict
    default: {}
  secret_files:
    description:
      - With I(run), file name to content of files of the run's folder that only its owner reads
        (mode 0400), such as the run's store key; never shown in a result or a log.
    type: dict
    default: {}
  recurse:
    description: With I(state=absent), stop the processes of every run below I(run_dir).
    type: bool
    default: false
  job:
    description: With I(recurse), only the processes of this job.
    type: str
  wait_s:
    description: With I(state=absent), seconds to let running processes end by themselves (their guards stop them) before they are stopped.
    type: float
    default: 0
  grace_s:
    description:
      - With I(state=absent), seconds between SIGTERM and SIGKILL; required there. The run's own
        grace (its spec's C(guard.stop_grace)), or launch_stop_grace for C(torchfleet down).
    type: float
  tail_lines:
    description: How many log lines to return for a process that exited non-zero.
    type: int
    default: 15
"""

EXAMPLES = r"""
- name: Start the node's ranks as bare processes, in the run's new folder
  torchfleet.cluster.rank_processes:
    run_dir: /var/lib/torchfleet/runs/mnist-20260101-120000
    state: started
    ranks:
      - {rank: 0, name: rank-0, argv: [/opt/torchfleet/venv/bin/python, mnist.py], env: {RANK: "0", WORLD_SIZE: "2"}}
    run:
      node_dir: /var/lib/torchfleet
      run_id: mnist-20260101-120000
      workload:
        archive: .torchfleet/workloads/mnist.tar
        dest: /var/lib/torchfleet/workloads/mnist
        keep: /var/lib/torchfleet/workloads/mnist.tar

- name: Stop them, giving each 10 seconds after SIGTERM
  torchfleet.cluster.rank_processes:
    run_dir: /var/lib/torchfleet/runs/mnist-20260101-120000
    state: absent
    grace_s: 10
"""

RETURN = r"""
containers:
  description: One entry per process, ordered by rank (named like rank_containers' result).
  returned: always
  type: list
  elements: dict
"""

import os
import shlex
import subprocess

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
from ansible_collections.torchfleet.cluster.plugins.module_utils.rank_files import end, find, systemd
from ansible_collections.torchfleet.cluster.plugins.module_utils.run_folder import PrepareError, prepare, write_whole


def _tail(path, lines):
    try:
        with open(path, errors="replace") as fh:
            return "".join(fh.readlines()[-lines:]).rstrip("\n")
    except OSError:
        return ""


# The supervising shell sends the rank's output to its log, reads the secret environment
# (and deletes its file), and records the rank's exit code, also when a signal kills the
# rank (128 + signal, as a shell reports it).
WRAPPER = ('exec >>"$0" 2>&1; '
           'if [ -n "$TF_SECRETS" ]; then set -a; . "$TF_SECRETS"; set +a; rm -f "$TF_SECRETS"; unset TF_SECRETS; fi; '
           '"$@"; code=$?; echo $code > "$TF_EXIT.tmp" && mv "$TF_EXIT.tmp" "$TF_EXIT"')


def write_secrets(path, secret_env):
    """The secret environment as shell assignments, in a file only its owner can read."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.writelines(f"{name}={shlex.quote(str(value))}\n" for name, value in secret_env.items())


def start(module, run_dir, entry, secret_env=None):
    files = {kind: vocab.process_file(os.path.join(run_dir, entry["name"]), kind) for kind in vocab.ProcessFile}
    argv = [str(a) for a in entry["argv"]]
    if entry.get("cpuset"):
        argv = ["taskset", "--cpu-list", str(entry["cpuset"])] + argv
    env = {k: str(v) for k, v in (entry.get("env") or {}).items()}
    env["TF_EXIT"] = files[vocab.ProcessFile.EXIT]
    if secret_env:
        write_secrets(files[vocab.ProcessFile.SECRET], secret_env)
        env["TF_SECRETS"] = files[vocab.ProcessFile.SECRET]
    cwd = entry.get("cwd") or run_dir
    write_whole(files[vocab.ProcessFile.META], f"{entry['rank']} {entry.get('role', 'rank')} {entry.get('job', '-')}\n")
    shell = ["sh", "-c", WRAPPER, files[vocab.ProcessFile.LOG]] + argv
    if systemd():
        # A transient unit: systemd supervises it, and stopping it kills its whole cgroup.
        unit = f"torchfleet-{os.path.basename(run_dir)}-{entry['name']}"
        cmd = ["systemd-run", "--unit", unit, "--collect", "--quiet", "--working-directory", cwd]
        module.run_command(cmd + [f"--setenv={k}={v}" for k, v in env.items()] + ["--"] + shell, check_rc=True)
        write_whole(files[vocab.ProcessFile.UNIT], unit + "\n")
        return
    # Without systemd: its own session, so nothing ties it to Ansible's connection, and
    # the shell leads a process group that stop() kills whole. Popen, since run_command
    # waits for its child to end (tests/sanity/ignore-2.19.txt).
    proc = subprocess.Popen(shell, cwd=cwd, env=dict(os.environ, **env), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    write_whole(files[vocab.ProcessFile.PID], f"{proc.pid}\n")


def main():
    module = AnsibleModule(
        argument_spec={
            "run_dir": {"type": "path", "required": True},
            "state": {"type": "str", "choices": ["started", "status", "absent"], "default": "status"},
            "ranks": {"type": "list", "elements": "dict", "default": []},
            "run": {"type": "dict"},
            "secret_env": {"type": "dict", "default": {}, "no_log": True},
            "secret_files": {"type": "dict", "default": {}, "no_log": True},
            "recurse": {"type": "bool", "default": False},
            "job": {"type": "str"},
            "tail_lines": {"type": "int", "default": 15},
            "wait_s": {"type": "float", "default": 0},
            "grace_s": {"type": "float"},
        },
        required_if=[("state", "absent", ["grace_s"])],
        supports_check_mode=False,
    )
    run_dir, state = module.params["run_dir"], module.params["state"]
    if state == "started":
        run = module.params["run"]
        if run:
            shown = {k: v for k, v in module.params.items() if k not in ("run", "secret_env", "secret_files")}
            invocation = {"module_args": dict(shown, run={k: v for k, v in run.items() if k not in ("files", "workload")})}
            try:
                prepare(run["node_dir"], run["run_id"], run.get("files") or {}, int(run.get("keep", 10)),
                        run.get("owner"), run.get("group"), run.get("workload"), dirs=run.get("dirs") or [],
                        secret_files=module.params["secret_files"])
            except (PrepareError, KeyError, ValueError) as exc:
                module.fail_json(msg=f"cannot make the run's folder: {exc}", invocation=invocation)
        os.makedirs(run_dir, exist_ok=True)
        for entry in module.params["ranks"]:
            start(module, run_dir, entry, module.params["secret_env"])
        module.exit_json(changed=True, containers=find(module, run_dir),
                         **({"invocation": invocation} if run else {}))

    if not os.path.isdir(run_dir):
        module.exit_json(changed=False, containers=[])
    recurse = module.params["recurse"]
    job = module.params["job"]
    entries = find(module, run_dir, recurse, job)
    if state == "status":
        # A vanished rank is left out, so the watcher sees fewer than it expects.
        entries = [e for e in entries if not e["vanished"]]
        for e in entries:
            recent = _tail(e["log"], module.params["tail_lines"])
            e["last_line"] = recent.splitlines()[-1] if recent else ""
            if e["exit_code"] not in (None, 0):
                e["log_tail"] = recent
        module.exit_json(changed=False, containers=entries)

    finals, signalled = end(module, run_dir, module.params["wait_s"], module.params["grace_s"], recurse, job)
    module.exit_json(changed=signalled, containers=finals)


if __name__ == "__main__":
    main()
