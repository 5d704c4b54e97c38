#!/usr/bin/python
"""Documentation only: the job_report action plugin does the work, on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: job_report
short_description: Summarise a finished run on the controller, and fail naming the rank that broke it
description:
  - Writes the run's C(summary.json) (and a loss plot where the logs hold losses) into
    I(run_dir), prints the per-rank table, and fails when the run did, naming the rank
    that failed first and why, with C(torchfleet_error).
  - With restarts (C(launch_max_restarts)), C(summary.json) holds every attempt (C(attempts), from
    C(job.json), each with the step its rank 0 resumed from), a failure names every attempt's cause,
    and a run that succeeded after a restart says in which attempt.
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin; it runs on the controller and needs the torchfleet package in the Python that runs Ansible.
options:
  run_id:
    description: The run's id.
    type: str
    required: true
  run_dir:
    description: The run's folder on the controller, holding the fetched logs.
    type: path
    required: true
  spec:
    description: The launch spec (M(torchfleet.cluster.launch_spec)); each rank's part is recorded in C(summary.json).
    type: dict
    required: true
  finals:
    description: Each rank's final state, as M(torchfleet.cluster.rank_containers) or M(torchfleet.cluster.rank_processes) reported it.
    type: list
    elements: dict
    required: true
  reason:
    description: Why the run was stopped, when no guard said (a start that failed).
    type: str
  abort:
    description: Why the guards stopped the run (C(kind), C(host), C(reason)), as the controller saw it; else C(job.json)'s.
    type: dict
  master_listened:
    description: Whether MASTER_PORT opened; when not, the other ranks were never started.
    type: bool
    default: true
  outputs:
    description: What came back of each node's out folder, as M(torchfleet.cluster.collect_run) returned it (C(out)).
    type: list
    elements: dict
    default: []
  lost:
    description:
      - The nodes the controller could not reach at the end. A rank there of which the
        controller has no end ends as the cluster's supervision recorded it (the master's
        C(job.json)); the report names these nodes and says their logs are still on them.
    type: list
    elements: str
    default: []
  stop_asked:
    description:
      - A stop was asked for (C(torchfleet stop)); a run that ended stopped is then what was
        asked, and the task does not fail.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Write the summary and fail naming the rank that broke the run
  torchfleet.cluster.job_report:
    run_id: mnist-20260101-120000
    run_dir: runs/mnist-20260101-120000
    spec: "{{ launch__spec }}"
    finals: "{{ ansible_play_hosts_all | map('extract', hostvars) | map(attribute='launch__removed', default={})
      | map(attribute='containers', default=[]) | flatten }}"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
summary:
  description: The run's summary, as written to C(summary.json).
  returned: success
  type: dict
table:
  description: The per-rank table's lines, as printed.
  returned: success
  type: list
  elements: str
summary_file:
  description: Where C(summary.json) was written.
  returned: always
  type: str
  sample: runs/mnist-20260101-120000/summary.json
plot:
  description: The loss plot's path, or null where the logs hold no losses.
  returned: success
  type: str
failed_rank:
  description: The rank that failed first, or null when none did (the run was stopped).
  returned: failure
  type: int
abort:
  description: Why the run was stopped (C(kind), C(host), C(reason)).
  returned: failure
  type: dict
torchfleet_error:
  description: C(kind), C(host) and C(variable) (null) of the failure, for the API and the CLI.
  returned: failure
  type: dict
"""
