#!/usr/bin/python
"""A node's share of a run's live sync: its state, and what changed in its out folder."""

from __future__ import annotations

DOCUMENTATION = r"""
module: out_sync
short_description: Read a run's state on a node, and what changed in its ranks' out folder since the controller's copy
description:
  - Reads the run's folder as M(torchfleet.cluster.run_state) with I(state=info) does (its
    guards' records, and C(job.json) where the node hosts the run's store), and with I(spec)
    its C(spec.json).
  - Lists the ranks' out folder (the run's folder less torchfleet's own files, I(own)) and
    compares each file with what the controller holds of it (I(have)). A file that only grew,
    its old end unchanged, sends its new bytes alone; any other change sends it again from
    its start; the smallest first, within I(max_bytes) per call (the rest comes at the next).
  - Read only; it never changes the node. The live sync (C(torchfleet tensorboard)) calls it
    every interval while the run runs.
author: torchfleet developers (!UNKNOWN)
options:
  run_dir:
    description: The run's folder on the node.
    type: path
    required: true
  own:
    description: Patterns of the top-level names that are torchfleet's, left out (torchfleet.outputs.own_files).
    type: list
    elements: str
    default: []
  have:
    description:
      - What the controller holds of each file, by its path below I(run_dir), as C([size, mtime_ns, digest]),
        that is its size, the node's mtime (ns) it took last, and the sha256 of its last 4096 bytes.
    type: dict
    default: {}
  max_bytes:
    description: At most this many bytes of files are sent in one call.
    type: int
    default: 4194304
  max_file_bytes:
    description: Files larger than this are not sent (the collect brings them); they are listed in C(skipped).
    type: int
    default: 67108864
  spec:
    description: Also return the run's C(spec.json).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Read what changed in the run's out folder
  torchfleet.cluster.out_sync:
    run_dir: /var/lib/torchfleet/runs/mnist-20260101-120000
    own: ["*.log", "spec.json"]
    have:
      tensorboard/rank-0/events.out.tfevents.1767268800.node-1.41.0: [1234, 1767268830123456789, "9f2c..."]
"""

RETURN = r"""
found:
  description: Whether the node holds the run's folder.
  returned: always
  type: bool
run:
  description: The run on the node, as run_state reads it (C(job_state), C(units), C(state)); null where it has none.
  returned: always
  type: dict
spec:
  description: With I(spec), the run's C(spec.json); else null.
  returned: always
  type: dict
chunks:
  description:
    - What to write into the controller's copy, each C(path), C(offset), C(data) (base64) and
      the file's C(size) and C(mtime_ns) on the node. An offset of 0 starts the file anew.
  returned: always
  type: list
  elements: dict
skipped:
  description: C([path, size]) of the files over I(max_file_bytes).
  returned: always
  type: list
  elements: list
files:
  description: Files and bytes of the out folder, as C([files, bytes]).
  returned: always
  type: list
  elements: int
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
from ansible_collections.torchfleet.cluster.plugins.module_utils.out_sync import ARGS, changes, listing, read_chunks
from ansible_collections.torchfleet.cluster.plugins.module_utils.run_folder import read_run


def main():
    module = AnsibleModule(argument_spec=ARGS, supports_check_mode=True)
    p = module.params
    run_dir = p["run_dir"]
    if not os.path.isdir(run_dir):
        module.exit_json(changed=False, found=False, run=None, spec=None, chunks=[], skipped=[], files=[0, 0])
    run = read_run(run_dir)
    spec = None
    if p["spec"]:
        try:
            with open(os.path.join(run_dir, vocab.SPEC)) as fh:
                spec = json.load(fh)
        except (OSError, ValueError):
            pass  # a start cut short: another node holds it
    files = listing(run_dir, p["own"])
    reads, skipped = changes(run_dir, files, p["have"], p["max_bytes"], p["max_file_bytes"])
    module.exit_json(changed=False, found=True, run=run, spec=spec, chunks=read_chunks(run_dir, reads),
                     skipped=skipped, files=[len(files), sum(entry[0] for entry in files.values())])


if __name__ == "__main__":
    main()
