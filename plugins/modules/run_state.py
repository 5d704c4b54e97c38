#!/usr/bin/python
"""A node's runs as their guards left them: read, stop on request, prune."""

from __future__ import annotations

DOCUMENTATION = r"""
module: run_state
short_description: The runs in a node's run folders, as their guards record them
description:
  - With I(state=info) it reads each run's C(guard.json), every unit's C(guard-N.json) and,
    on the master, C(job.json) that the store's host writes, plus each log's last line.
  - With I(state=stopped) it writes the run's C(stop) file (every running run's, without
    I(run_id)), which every guard on the node reads on its next poll; the run stops
    everywhere, each unit recording I(reason).
  - With I(state=present) it removes the exited containers that I(leftovers) names, and the
    oldest finished run folders beyond I(keep), then
    creates the run's folder and writes I(files) into it, each whole (a temporary file, then
    a rename); one call where a start would otherwise spend a task per file. With
    I(workload), the job's workload folder is first replaced whole from its tar. With
    I(containers), it then creates and starts those containers from I(image), through
    community.docker's Docker API client, so that a start of container units is this one call.
  - The run_state action sends the workload's tar with the call, or ahead of it when it is
    large; I(files) and I(workload) are left out of the result's C(invocation), which would
    otherwise bring every node's copy of the spec and the guard back to the controller.
author: torchfleet developers (!UNKNOWN)
notes:
  - The run_state action plugin runs this module. It takes I(role) for itself, and turns
    I(workload) as given on the controller into what the module takes on the node.
options:
  role:
    description:
      - The launch role's folder, read by the action. The host's variables are checked against
        its argument spec first, as Ansible's own check would; nothing runs on the node if they
        fail. The playbooks that pass it (the run verbs, down.yml) include the role with
        C(rolespec_validate=false), since that check is a task per node.
    type: path
  node_dir:
    description: torchfleet's folder on the node (launch_node_dir).
    type: path
    required: true
  run_id:
    description: One run; every run when unset. Required with I(state=present).
    type: str
  state:
    description: What to do.
    type: str
    choices: [info, stopped, present]
    default: info
  files:
    description: With I(state=present), file name to content; names have no folder part.
    type: dict
    default: {}
  containers:
    description:
      - With I(state=present), the run's containers to create and start once the folder is made, each as the launch
        spec holds a unit (C(name), C(command), C(workdir), C(user), C(env), C(labels), C(mounts), C(devices),
        C(cpuset), C(cpuset_mems), C(oom_kill_disable)); one that exists already is left as it is.
      - Their env holds the ranks' secrets, so they are never shown.
    type: list
    elements: dict
    default: []
  image:
    description: With I(containers), the training image they run.
    type: str
  secret_files:
    description:
      - With I(state=present), file name to content of files that only I(owner) reads (mode 0400), such as the ranks' secret environment.
      - Never shown in a result or a log.
    type: dict
    default: {}
  dirs:
    description: With I(state=present), folders the ranks keep across runs (C(launch_checkpoint_dir)), made where missing, with I(owner) and I(group).
    type: list
    elements: path
    default: []
  workload:
    description:
      - With I(state=present), the workload to install before the run's folder is made. The
        action sends the tar inside the module's call up to I(inline_max) bytes, a larger one
        ahead of it into the task's temporary folder.
      - The module itself takes C(dest), C(keep), and the tar as C(data) (base64) or C(src) (a
        path on the node), as the action passes them.
    type: dict
    suboptions:
      archive:
        description: The tar on the controller (M(torchfleet.cluster.workload_pack)'s I(archive)).
        type: path
        required: true
      dest:
        description: The workload's folder on the node, replaced whole.
        type: path
        required: true
      keep:
        description: Where the node keeps the tar (its checksum decides the next send).
        type: path
        required: true
      inline_max:
        description: The largest tar sent inside the call, in bytes.
        type: int
        default: 1048576
  owner:
    description: With I(state=present), the uid that owns the run's folder.
    type: int
  group:
    description: With I(state=present), the gid that owns the run's folder.
    type: int
  reason:
    description: With I(state=stopped), why; each stopped unit records it.
    type: str
  keep:
    description: With I(state=present), how many finished runs to keep besides it.
    type: int
    default: 10
  tail_lines:
    description: Log lines to return per unit with I(run_id).
    type: int
    default: 0
  spec:
    description: With I(run_id), also return the run's C(spec.json).
    type: bool
    default: false
  record:
    description:
      - With I(run_id), also return the run as the guard hosting its store records it on this
        node, the master (C(job.json) with C(guard.json)'s units), each node's units included,
        for a status that reads the master alone. Null where that record cannot speak for the run
        (none here, not rewritten for the run's node timeout, or a run that ended).
    type: bool
    default: false
  wait:
    description:
      - With I(run_id) and I(state=info), seconds to wait on the node for the run to end before
        answering, reading its C(job.json) every I(poll) seconds. A controller that follows a run
        then makes one call per progress line, not one per poll.
    type: float
    default: 0
  poll:
    description: Seconds between the reads of C(job.json) while waiting.
    type: float
    default: 0.5
  leftovers:
    description:
      - With I(state=present), first removes the exited containers that carry every label of
        I(leftovers) (a job's rank containers of an earlier run that nothing collected), each
        one's log kept in its own run's folder under I(node_dir) (as
        M(torchfleet.cluster.rank_containers) with I(exited_only) and I(log_root)). Running
        ones are left alone.
    type: dict
"""

EXAMPLES = r"""
- name: Read one run on the node, with each log's last line
  torchfleet.cluster.run_state:
    node_dir: /var/lib/torchfleet
    run_id: mnist-20260101-120000
    tail_lines: 1
  register: run

- name: Stop every running run on the node
  torchfleet.cluster.run_state:
    node_dir: /var/lib/torchfleet
    state: stopped
    reason: stopped for maintenance

- name: Make the run's folder, sending the workload when it changed
  torchfleet.cluster.run_state:
    node_dir: /var/lib/torchfleet
    run_id: mnist-20260101-120000
    state: present
    files:
      spec.json: "{{ launch__spec.common_files['spec.json'] }}"
    workload:
      archive: .torchfleet/workloads/mnist.tar
      dest: /var/lib/torchfleet/workloads/mnist
      keep: /var/lib/torchfleet/workloads/mnist.tar
"""

RETURN = r"""
started:
  description: With I(containers), the containers it created and started.
  returned: with state=present and containers, outside check mode
  type: list
  elements: str
found:
  description: With I(run_id), whether the node has that run.
  returned: with run_id, unless state=present
  type: bool
run:
  description: With I(run_id), the run as its guards record it (C(job_state), C(units), C(logs), C(stop_requested), C(record), ...); null when not found.
  returned: with run_id, unless state=present
  type: dict
runs:
  description: Without I(run_id), every run on the node, as I(run).
  returned: with state=info and no run_id
  type: list
  elements: dict
stopped:
  description: Without I(run_id), the runs asked to stop.
  returned: with state=stopped and no run_id
  type: list
  elements: str
stopped_runs:
  description: Without I(run_id), the runs asked to stop, each with its launch mode (C(run_id), C(mode)).
  returned: with state=stopped and no run_id
  type: list
  elements: dict
leftovers:
  description: With I(leftovers), the exited containers removed, as rank_containers gives them.
  returned: with state=present and leftovers, outside check mode
  type: list
  elements: dict
removed:
  description: The finished runs pruned.
  returned: with state=present, outside check mode
  type: list
  elements: str
written:
  description: The files written into the run's folder (those whose content changed).
  returned: with state=present, outside check mode
  type: list
  elements: str
workload:
  description: The workload folder replaced, or null.
  returned: with state=present, outside check mode
  type: str
"""

import glob
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchfleet.cluster.plugins.module_utils import rank_docker, rank_start, run_reap
from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
from ansible_collections.torchfleet.cluster.plugins.module_utils.run_folder import (
    RUN_STATE_ARGS,
    PrepareError,
    ask_stop,
    one_run,
    prepare,
    read_run,
)


def main():
    module = AnsibleModule(
        argument_spec=RUN_STATE_ARGS,
        required_if=[("state", "present", ["run_id"])],
        supports_check_mode=True,
    )
    p = module.params
    invocation = {"module_args": {k: v for k, v in p.items()
                                  if k not in ("files", "workload", "secret_files", "containers")}}
    runs_dir = os.path.join(p["node_dir"], "runs")
    if p["state"] == "present":
        left = []
        if p["leftovers"] and not module.check_mode:
            left = [c for c in rank_docker.find(module, "docker", p["leftovers"]) if not c["running"]]
            if left:
                left = rank_docker.remove(module, "docker", left, p["leftovers"], 0, log_root=runs_dir)
        try:
            done = prepare(p["node_dir"], p["run_id"], p["files"], p["keep"], p["owner"], p["group"], p["workload"],
                           check=module.check_mode, dirs=p["dirs"], secret_files=p["secret_files"])
        except PrepareError as exc:
            module.fail_json(msg=str(exc), invocation=invocation)
        if left:
            done.update(changed=True, leftovers=left)
        if p["containers"] and not module.check_mode:
            try:
                done["started"] = rank_start.start(p["containers"], p["image"])
            except RuntimeError as exc:
                module.fail_json(msg=str(exc), invocation=invocation)
            done["changed"] = done["changed"] or bool(done["started"])
            # A guard cannot remove its own container: this removes those whose node comes back.
            run_reap.spawn(os.path.join(runs_dir, p["run_id"]), done["started"])
        module.exit_json(**done, invocation=invocation)
    if p["run_id"]:
        module.exit_json(**one_run(os.path.join(runs_dir, p["run_id"]), p["state"], p["reason"], p["tail_lines"],
                                   p["spec"], p["record"], p["wait"], p["poll"], module.check_mode))

    runs = [read_run(d) for d in sorted(glob.glob(os.path.join(runs_dir, "*"))) if os.path.isdir(d)]
    if p["state"] == "stopped":
        asked = [r["run_id"] for r in runs if r["state"] == vocab.RunState.RUNNING and not r["stop_requested"]]
        if not module.check_mode:
            asked = [run_id for run_id in asked if ask_stop(os.path.join(runs_dir, run_id), p["reason"])]
        modes = {r["run_id"]: r.get("mode") for r in runs}
        module.exit_json(changed=bool(asked), stopped=asked,
                         stopped_runs=[{"run_id": run_id, "mode": modes[run_id]} for run_id in asked])
    module.exit_json(changed=False, runs=runs)


if __name__ == "__main__":
    main()
