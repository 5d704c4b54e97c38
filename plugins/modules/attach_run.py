#!/usr/bin/python
"""Documentation only: the attach_run action plugin does the work, on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: attach_run
short_description: Follow a run until it ends, as its guards report it, printing progress
description:
  - The guards on the cluster supervise the run; this only looks. It holds one connection,
    to the master, whatever the number of nodes, and ends when the run does or when the
    master stops answering (the other nodes' guards then stop their ranks themselves).
  - Each call of M(torchfleet.cluster.run_state) waits on the master until the run ends or
    the next progress line is due, reading C(job.json) there every I(poll_interval) seconds,
    so one module run per progress line instead of one per poll.
  - With restarts, a master that is lost or that the run left (C(moved_to)) ends this follow;
    the launch role then follows the next node in node order with I(takeover).
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin; it runs M(torchfleet.cluster.run_state) on the task's host, the master.
options:
  node_dir:
    description: torchfleet's folder on the master.
    type: path
    required: true
  run_id:
    description: The run.
    type: str
    required: true
  poll_interval:
    description: Seconds between the master's reads of C(job.json).
    type: float
    default: 0.5
  progress_interval:
    description: Seconds between progress lines.
    type: float
    default: 10
  start_timeout:
    description: Seconds the store's host may take to write C(job.json).
    type: float
    default: 120
  stale_after:
    description: Seconds after which a C(job.json) not rewritten means its guard is gone.
    type: float
    default: 20
  takeover:
    description:
      - The task's node is followed because the master was lost or moved (C(launch_max_restarts)); the
        launch role's follow.yml delegates to each node in node order. A C(job.json) that does not appear
        within I(start_timeout) gives the outcome C(absent) (the run went on elsewhere), not C(not_started).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Follow the run until it ends, as the guards report it
  torchfleet.cluster.attach_run:
    node_dir: /var/lib/torchfleet
    run_id: mnist-20260101-120000
    progress_interval: 30
  register: launch__wait
  when: inventory_hostname == launch__spec.master_host
"""

RETURN = r"""
outcome:
  description:
    - C(finished) when the run ended (or is known lost), C(master_lost) when the master stopped answering.
    - C(moved) when the node's C(job.json) says the run moved to another master (C(moved_to), with restarts).
    - C(absent), with I(takeover) only, when the node never wrote C(job.json) within I(start_timeout).
  returned: success
  type: str
  sample: finished
state:
  description: The run's end state as C(job.json) records it (C(succeeded), C(failed), C(stopped)).
  returned: success
  type: str
  sample: succeeded
abort:
  description:
    - Why the run was stopped (C(kind), C(host), C(reason)); null when it was not. C(kind) is one of
      the run's vocabulary's abort kinds (module_utils.run_vocab); C(not_started) when the guard
      hosting the store never wrote C(job.json) within I(start_timeout).
  returned: success
  type: dict
job:
  description: The master's last C(job.json).
  returned: when the master answered
  type: dict
"""
