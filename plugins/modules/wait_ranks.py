#!/usr/bin/python
"""Documentation only: the wait_ranks action plugin does the work."""

from __future__ import annotations

DOCUMENTATION = r"""
module: wait_ranks
short_description: Wait for a run's ranks on a node, failing fast across nodes
description:
  - Ansible runs one copy per node, in parallel. They need no channel of their own; a unit
    that fails makes its guard abort the run through the guards' store, every other guard
    stops its unit, and each copy sees its own unit end. A unit its guard stopped is
    reported as C(peer-failed), with the run's abort as the guards recorded it.
  - Reads the ranks with M(torchfleet.cluster.rank_containers) (I(labels)) or
    M(torchfleet.cluster.rank_processes) (I(run_dir)).
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin.
options:
  labels:
    description: Labels that select this run's containers (M(torchfleet.cluster.rank_containers)).
    type: dict
  run_dir:
    description: The run's folder on the node, for bare-process ranks (M(torchfleet.cluster.rank_processes)).
    type: path
  expected:
    description: How many ranks this node should have.
    type: int
    required: true
  poll_interval:
    description: Seconds between polls.
    type: float
    default: 2
  progress_interval:
    description: Seconds between progress lines.
    type: float
    default: 10
  timeout:
    description: Seconds before the job counts as hung; 0 waits for ever.
    type: int
    default: 0
  listen_host:
    description: Return as soon as this address accepts connections on I(listen_port).
    type: str
    required: true
  listen_port:
    description: The port to watch for, such as MASTER_PORT on the master.
    type: int
    required: true
  node_dir:
    description:
      - Where the units' guards record their state; a unit whose guard says it exited 0 counts
        as done, though its guard (the store's host) stays up, and one its guard stopped names
        the run's abort.
    type: path
    required: true
  run_id:
    description: The run, in I(node_dir).
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Wait until MASTER_PORT listens, or a rank fails anywhere
  torchfleet.cluster.wait_ranks:
    labels: {torchfleet.run: mnist-20260101-120000}
    expected: 2
    listen_host: 10.0.0.11
    listen_port: 29500
    node_dir: /var/lib/torchfleet
    run_id: mnist-20260101-120000
    timeout: 120
"""

RETURN = r"""
outcome:
  description: C(succeeded), C(failed), C(peer-failed) (a rank failed on another node) or C(listening).
  returned: success
  type: str
  sample: listening
reason:
  description: Why the wait ended early, or null.
  returned: success
  type: str
containers:
  description: The ranks as last read, one entry per rank.
  returned: success
  type: list
  elements: dict
waited_s:
  description: Seconds waited.
  returned: success
  type: float
"""
