#!/usr/bin/python
"""A node's share of a run for the controller, once its units have ended (the collect_run action calls it)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: run_outputs
short_description: End a run's units on a node, then pack its files and its ranks' out folder for the controller
description:
  - With I(stop_reason), first asks the run's guards to stop it, where it still runs and no
    stop was asked, as M(torchfleet.cluster.run_state) with I(state=stopped) would.
  - With I(units), then ends the run's units on the node, as M(torchfleet.cluster.rank_processes)
    or M(torchfleet.cluster.rank_containers) with I(state=absent) would, and deletes I(remove).
  - Says which of I(wanted) (top-level files of I(run_dir)) exist, and packs them.
  - Lists every other regular file below I(run_dir), the ranks' out folder, leaving out the
    top-level names that match I(own) (torchfleet's own files); packs the smallest first,
    while they fit within I(max_bytes).
  - Everything goes into one gzip'd tar, C(run/NAME) for I(wanted) and C(out/PATH) for the
    out folder. Up to I(inline_max) bytes it comes back in the result itself; a larger one
    is left beside the node's runs for the action to fetch and delete.
author: torchfleet developers (!UNKNOWN)
notes:
  - M(torchfleet.cluster.collect_run) runs it, then puts the files in place on the controller.
options:
  run_dir:
    description: The run's folder on the node.
    type: path
    required: true
  wanted:
    description: Top-level file names to look for and pack.
    type: list
    elements: str
    default: []
  own:
    description: Patterns of the top-level names that are torchfleet's.
    type: list
    elements: str
    default: []
  max_bytes:
    description: At most this many bytes of the out folder are packed; none when 0.
    type: int
    default: 0
  pack:
    description: Whether to pack; the files are only listed when false.
    type: bool
    default: true
  inline_max:
    description: An archive of at most this many bytes comes back in the result (C(archive_b64)).
    type: int
    default: 4194304
  units:
    description:
      - The run's units to end first, C(kind) C(process) (the run's folder holds their
        files) or C(container) (they carry the label C(torchfleet.run=<run_id>)), each given
        C(wait_s) seconds to end by itself (its guard stops it); then a process gets SIGTERM,
        C(grace_s) seconds and SIGKILL, a container is killed. A container's log is written
        into I(run_dir) before it is removed.
    type: dict
  remove:
    description: Files to delete once the units have ended (the node's secret environment file).
    type: list
    elements: path
    default: []
  stop_reason:
    description: Why the run is stopped, where this asks its guards to stop it; nothing is asked when unset.
    type: str
"""

EXAMPLES = r"""
- name: End the run's processes, then pack its logs and up to 100 MB of the ranks' out folder
  torchfleet.cluster.run_outputs:
    run_dir: /var/lib/torchfleet/runs/mnist-20260101-120000
    wanted: [rank-0.log, job.json]
    own: ["*.log", "*.json"]
    max_bytes: 104857600
    units: {kind: process, run_id: mnist-20260101-120000, wait_s: 30, grace_s: 10}
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
  description: Files and bytes of it packed, as C([files, bytes]).
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
  description: The archive's path on the node where it is too large to come back in the result; else null.
  returned: always
  type: str
archive_b64:
  description: The archive itself, base64, where it is at most I(inline_max) bytes; else null.
  returned: always
  type: str
containers:
  description: With I(units), each unit's last state, ordered by rank (as rank_processes and rank_containers give it).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchfleet.cluster.plugins.module_utils.run_end import DEFAULTS, end_and_pack


def main():
    module = AnsibleModule(argument_spec={
        "run_dir": {"type": "path", "required": True},
        "wanted": {"type": "list", "elements": "str", "default": DEFAULTS["wanted"]},
        "own": {"type": "list", "elements": "str", "default": DEFAULTS["own"]},
        "max_bytes": {"type": "int", "default": DEFAULTS["max_bytes"]},
        "pack": {"type": "bool", "default": DEFAULTS["pack"]},
        "inline_max": {"type": "int", "default": DEFAULTS["inline_max"]},
        "units": {"type": "dict"},
        "remove": {"type": "list", "elements": "path", "default": DEFAULTS["remove"]},
        "stop_reason": {"type": "str"},
    }, supports_check_mode=False)
    module.exit_json(**end_and_pack(module, module.params))


if __name__ == "__main__":
    main()
