"""Node-side: a run's rank containers through the docker CLI (their labels say which).

Shared by rank_containers, which reports on them and removes them, and run_outputs, which
removes a run's containers before it packs what they left.
"""

from __future__ import annotations

import json
import os
import re
import time

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab

# The part of each rank's environment worth keeping in the run report.
REPORTED_ENV = re.compile(r"^(MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|LOCAL_RANK|LOCAL_WORLD_SIZE|NODE_RANK|"
                          r"OMP_NUM_THREADS|LD_PRELOAD|MALLOC_CONF|GLOO_\w+|SGX_\w+|TORCHFLEET_\w+|http_proxy|https_proxy|no_proxy)=")
FRACTION = re.compile(r"^(\S+?T\d\d:\d\d:\d\d)(?:\.(\d+))?Z (.*)$")


def reported_env(env, labels):
    """The part of a container's env worth a report; a secret variable (the launch names
    them in a label, with what may be shown: a redacted URL, or a placeholder) shows that."""
    shown = json.loads(labels.get("torchfleet.secret_env") or "{}")
    pairs = (e.split("=", 1) for e in env if REPORTED_ENV.match(e))
    return {name: shown.get(name, value) for name, value in pairs}


def cli(module, docker, *args, check=True):
    rc, out, err = module.run_command([docker, *args])
    if check and rc != 0:
        module.fail_json(msg=f"docker {' '.join(args[:2])} failed: {err.strip() or out.strip()}")
    return rc, out, err


def merged_log(module, docker, name, tail=None):
    """stdout and stderr of a container, merged by docker's timestamps."""
    args = ["logs", "--timestamps"]
    if tail:
        args += ["--tail", str(tail)]
    rc, out, err = cli(module, docker, *args, name, check=False)
    lines = []
    for stream, text in ((0, out), (1, err)):
        for seq, line in enumerate(text.splitlines()):
            match = FRACTION.match(line)
            if match:
                # Docker trims trailing zeros of the fraction; pad it so text order is time order.
                key = f"{match[1]}.{(match[2] or '').ljust(9, '0')}"
                lines.append((key, stream, seq, match[3]))
            else:
                lines.append(("", stream, seq, line))
    lines.sort()
    return "\n".join(entry[3] for entry in lines) + ("\n" if lines else "")


def find(module, docker, labels):
    """The containers that carry every label of ``labels`` (an empty value matches any), by rank."""
    # A bare-metal node without docker has no rank containers.
    if not module.get_bin_path(docker):
        return []
    filters = []
    for key, value in sorted(labels.items()):
        filters += ["--filter", f"label={key}={value}" if value not in (None, "") else f"label={key}"]
    _rc, out, _err = cli(module, docker, "ps", "--all", "--quiet", "--no-trunc", *filters)
    ids = out.split()
    if not ids:
        return []
    _rc, out, _err = cli(module, docker, "inspect", *ids)
    found = []
    for item in json.loads(out):
        labels_of = item["Config"].get("Labels") or {}
        state = item["State"]
        found.append(
            {
                "id": item["Id"],
                "name": item["Name"].lstrip("/"),
                "rank": int(labels_of.get("torchfleet.rank", -1)),
                "run": labels_of.get("torchfleet.run"),
                # mpirun mode: the launcher's mpirun and the workers' sshd are not ranks.
                "role": labels_of.get("torchfleet.role", "rank"),
                "status": state["Status"],
                "running": state["Running"],
                "exit_code": None if state["Running"] else state["ExitCode"],
                "oom_killed": state.get("OOMKilled", False),
                "started_at": state.get("StartedAt"),
                "finished_at": None if state["Running"] else state.get("FinishedAt"),
                "cpuset": item["HostConfig"].get("CpusetCpus") or None,
                "cpuset_mems": item["HostConfig"].get("CpusetMems") or None,
                "devices": [d["PathOnHost"] for d in item["HostConfig"].get("Devices") or []],
                "mounts": sorted(f"{m['Source']}:{m['Destination']}" + ("" if m.get("RW", True) else ":ro")
                                 for m in item.get("Mounts") or []),
                "oom_kill_disable": bool(item["HostConfig"].get("OomKillDisable")),
                "env": reported_env(item["Config"].get("Env") or [], labels_of),
            }
        )
    return sorted(found, key=lambda c: c["rank"])


def remove(module, docker, containers, labels, wait_s, log_dir=None, log_root=None):
    """Remove ``containers`` (as find gives them): those still running get ``wait_s`` seconds
    to end by themselves (their guards stop them), then are killed; each one's log (stdout
    and stderr in time order) is written first into ``log_dir``, or ``log_root/<run>/``.
    Their last state, with ``stopped_by_torchfleet`` and ``log``, is returned."""
    deadline = time.monotonic() + wait_s
    while any(c["running"] for c in containers) and time.monotonic() < deadline:
        time.sleep(0.5)
        containers = [c for c in find(module, docker, labels) if c["id"] in {x["id"] for x in containers}]
    running = [c["name"] for c in containers if c["running"]]
    if running:
        cli(module, docker, "kill", *running, check=False)
    ids = {c["id"] for c in containers}
    finals = [c for c in find(module, docker, labels) if c["id"] in ids]
    for c in finals:
        c["stopped_by_torchfleet"] = c["name"] in running
        folder = os.path.join(log_root, c["run"] or "unknown") if log_root else log_dir
        if folder:
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, vocab.unit_log(c["role"], c["rank"]))
            with open(path, "w") as fh:
                fh.write(merged_log(module, docker, c["name"]))
            c["log"] = path
    if finals:
        cli(module, docker, "rm", "--force", *[c["id"] for c in finals])
    return finals
