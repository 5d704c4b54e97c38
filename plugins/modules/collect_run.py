#!/usr/bin/python
"""Documentation only: the collect_run action plugin does the work, on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: collect_run
short_description: End a run on a node, and bring its logs, checksums, guard records, run state and model to the controller
description:
  - One module run (M(torchfleet.cluster.run_outputs)) per node. With I(stop_reason) it asks
    the run's guards to stop it, where it still runs; with I(end_units) it gives the run's
    units the run's own wait to end (its spec's C(guard.stop_wait); their guards stop them),
    stops what is left (C(guard.stop_grace) between SIGTERM and SIGKILL), keeping each one's
    log, and deletes the node's secret environment file. Then it packs the node's files of
    the run (torchfleet.report.run_files says which) and the rest of the ranks' out folder,
    the smallest files first within I(out_max_mb), into one archive.
  - An archive of up to 4 MiB comes back in the module's result; a larger one is streamed
    by the connection into a temporary file, then deleted on the node. Each file is renamed
    into place whole, and the out folder is unpacked into a temporary folder that is renamed
    over C(out/<host>) in the controller's run folder.
  - A reader of the controller's run folder never sees half a log, half a model or half an
    out folder, and nothing large is held in memory.
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin; it needs the torchfleet package in the Python that runs Ansible.
options:
  node_run_dir:
    description: The run's folder on the node.
    type: path
    required: true
  run_dir:
    description: The run's folder on the controller (made if missing).
    type: path
    required: true
  plan:
    description:
      - What the run's launch spec says of this node (torchfleet.outputs.collect_plan, as the
        filter torchfleet.cluster.collect_plans gives it for each node).
      - C(run_id), C(ranks), C(wanted) (the files it holds of the run, by their names on the
        node and on the controller), C(own) (the patterns of torchfleet's own files) and
        C(end) (how its units end).
    type: dict
    required: true
  out_max_mb:
    description: At most this many MB of the ranks' out folder come back (launch_collect_out_max_mb, 0 to 1048576).
    type: int
    default: 1024
  end_units:
    description: End the run's units on the node first, as the run's spec says (I(plan)'s C(end), torchfleet.report.run_end).
    type: bool
    default: false
  stop_reason:
    description: Ask the run's guards to stop it first, with this reason, where it still runs and no stop was asked.
    type: str
"""

EXAMPLES = r"""
- name: End the run on each node, then bring its logs, checksums and guard records, and the master's run state and model
  torchfleet.cluster.collect_run:
    node_run_dir: /var/lib/torchfleet/runs/mnist-20260101-120000
    run_dir: runs/mnist-20260101-120000
    plan: "{{ launch__collect_plans[inventory_hostname] }}"
    out_max_mb: 1024
    end_units: true
"""

RETURN = r"""
fetched:
  description: The files brought, by their names in the controller's run folder.
  returned: success
  type: list
  elements: str
  sample: [rank-0.log, checksum-rank-0.txt, guard-0.json, job.json, model.pt]
out:
  description: >-
    What came back of the node's out folder (torchfleet.outputs.record): files and bytes in all,
    taken and left, the largest left, and a message where the limit left files on the node.
  returned: success
  type: dict
containers:
  description: With I(end_units), each unit's last state, ordered by rank (as rank_processes and rank_containers give it).
  returned: always
  type: list
  elements: dict
"""
