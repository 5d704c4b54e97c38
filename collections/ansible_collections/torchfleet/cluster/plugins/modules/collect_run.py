#!/usr/bin/python
"""Documentation only: the collect_run action plugin does the work, on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: collect_run
short_description: Bring a node's logs, checksums, guard records, run state and model of a run to the controller
description:
  - One module run (M(torchfleet.cluster.run_outputs)) finds which of the node's files of
    the run exist (torchfleet.report.run_files says which to look for) and packs the rest of
    the ranks' out folder, the smallest files first within I(out_max_mb), into one archive;
    each file, then the archive, is streamed by the connection into a temporary file beside
    its destination and renamed over it. The archive is unpacked into a temporary folder
    that is renamed over C(out/<host>) in the controller's run folder.
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
  spec:
    description: The run's launch spec; it says which files this node holds.
    type: dict
    required: true
  out_max_mb:
    description: At most this many MB of the ranks' out folder come back (launch_collect_out_max_mb, 0 to 1048576).
    type: int
    default: 1024
"""

EXAMPLES = r"""
- name: Bring each node's logs, checksums and guard records, and the master's run state and model
  torchfleet.cluster.collect_run:
    node_run_dir: /var/lib/torchfleet/runs/mnist-20260101-120000
    run_dir: runs/mnist-20260101-120000
    spec: "{{ launch__spec }}"
    out_max_mb: 1024
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
"""
