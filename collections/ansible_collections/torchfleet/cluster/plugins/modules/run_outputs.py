#!/usr/bin/python
"""A node's share of a run for the controller (the collect_run action calls it)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: run_outputs
short_description: Find a run's files on a node, and pack its ranks' out folder under a size limit
description:
  - Says which of I(wanted) (top-level files the action fetches one by one) exist in I(run_dir).
  - Lists every other regular file below I(run_dir), the ranks' out folder, leaving out the
    top-level names that match I(own) (torchfleet's own files); packs the smallest first,
    while they fit within I(max_bytes), into the gzip'd tar I(archive).
author: torchfleet developers (!UNKNOWN)
notes:
  - M(torchfleet.cluster.collect_run) runs it, then brings the files and the archive back.
options:
  run_dir:
    description: The run's folder on the node.
    type: path
    required: true
  wanted:
    description: Top-level file names to look for.
    type: list
    elements: str
    default: []
  own:
    description: Patterns of the top-level names that are torchfleet's.
    type: list
    elements: str
    default: []
  max_bytes:
    description: At most this many bytes of the out folder are packed.
    type: int
    default: 0
  archive:
    description: Where to write the archive; the out folder is only listed when unset.
    type: path
"""

EXAMPLES = r"""
- name: Find the run's logs, and pack up to 100 MB of the ranks' out folder
  torchfleet.cluster.run_outputs:
    run_dir: /var/lib/torchfleet/runs/mnist-20260101-120000
    wanted: [rank-0.log, job.json]
    own: ["*.log", "*.json"]
    max_bytes: 104857600
    archive: /tmp/out.tar.gz
"""

RETURN = r"""
found:
  description: The names of I(wanted) that exist.
  returned: always
  type: list
  elements: str
total:
  description: Files and bytes of the out folder, as C([files, bytes]).
  returned: always
  type: list
  elements: int
taken:
  description: Files and bytes packed, as C([files, bytes]).
  returned: always
  type: list
  elements: int
left:
  description: Files and bytes left out by the limit, as C([files, bytes]).
  returned: always
  type: list
  elements: int
left_largest:
  description: The largest of them (at most 20), as C([path, size]) pairs.
  returned: always
  type: list
  elements: list
archive:
  description: The archive's path; null where nothing was packed.
  returned: always
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchfleet.cluster.plugins.module_utils.out_folder import archive, listing, pick

# How many of the files left behind a result names; the count and bytes cover them all.
LARGEST = 20


def main():
    module = AnsibleModule(argument_spec={
        "run_dir": {"type": "path", "required": True},
        "wanted": {"type": "list", "elements": "str", "default": []},
        "own": {"type": "list", "elements": "str", "default": []},
        "max_bytes": {"type": "int", "default": 0},
        "archive": {"type": "path"},
    }, supports_check_mode=True)
    p = module.params
    if not os.path.isdir(p["run_dir"]):
        module.exit_json(changed=False, found=[], total=[0, 0], taken=[0, 0], left=[0, 0], left_largest=[],
                         archive=None)
    found = [n for n in p["wanted"] if os.path.isfile(os.path.join(p["run_dir"], n))]
    files = listing(p["run_dir"], p["own"])
    taken, left = pick(files, max(p["max_bytes"], 0))
    packed = []
    if p["archive"] and taken:
        packed = archive(p["run_dir"], [path for path, _size in taken], p["archive"])
    sizes = dict(taken)
    module.exit_json(changed=False, found=found, total=[len(files), sum(s for _path, s in files)],
                     taken=[len(packed), sum(sizes[path] for path in packed)],
                     left=[len(left), sum(s for _path, s in left)],
                     left_largest=[list(f) for f in sorted(left, key=lambda f: (-f[1], f[0]))[:LARGEST]],
                     archive=p["archive"] if packed else None)


if __name__ == "__main__":
    main()
