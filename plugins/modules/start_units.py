#!/usr/bin/python
"""Documentation only: the start_units action plugin does the work."""

from __future__ import annotations

DOCUMENTATION = r"""
module: start_units
short_description: A node's start of a run, in one task
description:
  - Makes the run's folder on the node (M(torchfleet.cluster.run_state) with I(state=present)), with the ranks'
    secret environment in it where they read it from a file (mode 0400), then starts the node's units by the kind
    the launch spec gives them there.
  - I(kind=container), in the same M(torchfleet.cluster.run_state) call that makes the folder, after removing the
    exited containers that earlier runs of the job left, each unit's container created and started through
    community.docker's Docker API client; I(kind=process), one M(torchfleet.cluster.rank_processes) call, which
    makes the folder too; I(kind=scheduler), the folder only (the master then submits the job with
    M(torchfleet.cluster.scheduler_job)). Either way, one module run on the node.
  - With I(listen_timeout) (a detached launch), a node whose unit others start after (the master's rendezvous,
    mpirun's sshd) then waits until it listens, as M(torchfleet.cluster.wait_ranks) does.
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin, run by the launch role once per node.
options:
  kind:
    description: What runs the node's units.
    type: str
    choices: [container, process, scheduler]
    required: true
  run:
    description:
      - The run's folder as M(torchfleet.cluster.run_state) makes it.
      - C(node_dir), C(run_id), C(files), C(dirs), C(keep), C(owner), C(group), C(workload).
    type: dict
    required: true
  units:
    description: The node's units, as the launch spec holds them.
    type: list
    elements: dict
    default: []
  image:
    description: The training image of I(kind=container) units.
    type: str
  job:
    description: The job's name (its leftovers' label, and each process's record).
    type: str
    required: true
  secret_env:
    description: The ranks' secret environment, never shown.
    type: dict
    default: {}
  secret_env_file:
    description: Whether the ranks read I(secret_env) from a file in the run's folder rather than their environment.
    type: bool
    default: false
  listen_timeout:
    description: For a detached launch, how long a unit that others start after may take to listen; without it the task does not wait.
    type: int
"""

EXAMPLES = r"""
- name: Make the run's folder and start this node's units
  torchfleet.cluster.start_units:
    kind: container
    run: "{{ run_folder }}"
    units: "{{ units }}"
    image: torchfleet/train:2.13.0-cpu
    job: mnist
"""

RETURN = r"""
started:
  description: The names of the units started.
  returned: success
  type: list
  elements: str
workload:
  description: Where a changed workload was unpacked on the node, or null.
  returned: success
  type: str
listen:
  description: With I(listen_timeout) on a node with a unit that others start after, how the wait ended (C(outcome), C(reason)).
  returned: when waited
  type: dict
"""
