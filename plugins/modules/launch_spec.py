#!/usr/bin/python
"""Documentation only: the launch_spec action plugin does the work, on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: launch_spec
short_description: Build the launch spec of a job (torchfleet.spec)
description:
  - Reads what each node's own tasks found (M(torchfleet.cluster.launch_input)'s C(launch__input),
    M(torchfleet.cluster.node_probe)'s reading) through hostvars, plans each node's CPU pinning
    (torchfleet.cpus.plan), checks them together, and returns the spec every start task applies
    and the plan shows.
  - With restarts on (C(job.guard.max_restarts) above 0) and no launch_checkpoint_dir, each node's
    checkpoint folder is the run's own, C(<launch_node_dir>/runs/<run id>/checkpoints)
    (torchfleet.inputs.checkpoint_dir); the node's entry in C(nodes) carries it for the start to make.
  - Fails with C(torchfleet_error) (host, variable) on bad input, a launch_run_id that is not a
    plain name (torchfleet.inputs.RUN_ID), a launch_min_nodes (C(job.guard.min_nodes)) above the
    launch's number of nodes, restarts under a launch mode that cannot restart its ranks, and
    two hosts whose nodes report one identity (M(torchfleet.cluster.node_probe)'s C(identity);
    torchfleet.hosts). The inventory's own checks,
    and the warnings about variables that look like torchfleet's, come before, from
    M(torchfleet.cluster.inventory_check).
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin; it needs the torchfleet package in the Python that runs Ansible.
options:
  hosts:
    description: The play's nodes.
    type: list
    elements: str
    required: true
  group:
    description: The launch group's hosts.
    type: list
    elements: str
    required: true
  table:
    description: M(torchfleet.cluster.rank_plan)'s rank table.
    type: dict
    required: true
  job:
    description: The job-wide settings (C(run_id), C(job), C(mode), ...).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Build the job's launch spec
  torchfleet.cluster.launch_spec:
    hosts: "{{ ansible_play_hosts }}"
    group: "{{ groups['train'] }}"
    table: "{{ launch__plan.plan }}"
    job: {run_id: mnist-20260101-120000, job: mnist, mode: docker}
  run_once: true
  register: launch__spec_result
"""

RETURN = r"""
spec:
  description: The launch spec, secrets redacted.
  returned: success
  type: dict
nodes:
  description: Each node's entry, secrets redacted.
  returned: success
  type: dict
common_files:
  description: The files every node's run folder gets (C(spec.json), C(guard.py)), name to content.
  returned: success
  type: dict
unit_index:
  description: Each host's units, as indexes into the spec's units.
  returned: success
  type: dict
listen_hosts:
  description: The hosts with a unit that listens (MASTER_PORT, mpirun's sshd), where the start waits until it answers.
  returned: success
  type: list
  elements: str
"""
