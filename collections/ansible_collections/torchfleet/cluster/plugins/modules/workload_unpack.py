#!/usr/bin/python
"""Unpack a workload's tar into its folder, replacing the earlier copy whole."""

from __future__ import annotations

import os
import shutil
import tarfile
import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: workload_unpack
short_description: Mirror a packed workload into its folder on the node
description:
  - Unpacks I(src) (workload_pack's tar) beside I(dest), then swaps it in for the earlier
    copy, which goes whole: files deleted on the controller go too, and a rank never sees
    half a workload. One call where the file and unarchive modules took three.
  - Members that would land outside I(dest) (an absolute path, C(..), a link, a device)
    are refused, and the earlier copy is left as it was.
  - With I(keep), the tar is then moved there (the node's copy, whose checksum the next
    launch compares before it sends the workload again). workload_sync runs this module.
options:
  src: {description: The tar on the node., type: path, required: true}
  dest: {description: The workload's folder., type: path, required: true}
  keep: {description: Where the tar is kept once unpacked; its folder is created., type: path}
  mode: {description: The folder's mode., type: str, default: "0755"}
"""


def _safe(members, root):
    root = os.path.realpath(root)
    for m in members:
        target = os.path.realpath(os.path.join(root, m.name))
        if not (m.isfile() or m.isdir()) or not (target == root or target.startswith(root + os.sep)):
            raise ValueError(f"{m.name}: not a plain file or folder inside the workload")
    return members


def unpack(src, dest, mode=0o755, keep=None):
    """Unpack ``src`` into a fresh folder beside ``dest`` and swap it in; then move ``src``
    to ``keep``. Raises OSError, tarfile.TarError or ValueError, leaving ``dest`` as it was."""
    dest = dest.rstrip("/")
    parent = os.path.dirname(dest)
    os.makedirs(parent, exist_ok=True)
    fresh = tempfile.mkdtemp(prefix=".unpack-", dir=parent)
    try:
        with tarfile.open(src) as tar:
            members = _safe(tar.getmembers(), fresh)
            # Python's own member filter where it has one (3.12, and late 3.8-3.11 releases).
            tar.extractall(fresh, members=members, **({"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}))
        os.chmod(fresh, mode)
        old = None
        if os.path.lexists(dest):
            old = tempfile.mkdtemp(prefix=".old-", dir=parent)
            os.rename(dest, os.path.join(old, "w"))
        os.rename(fresh, dest)
    except BaseException:
        shutil.rmtree(fresh, ignore_errors=True)
        raise
    if old:
        shutil.rmtree(old, ignore_errors=True)
    if keep:
        os.makedirs(os.path.dirname(keep), exist_ok=True)
        shutil.move(src, keep)
        os.chmod(keep, 0o600)


def main():
    module = AnsibleModule(argument_spec={"src": {"type": "path", "required": True},
                                          "dest": {"type": "path", "required": True},
                                          "keep": {"type": "path"},
                                          "mode": {"type": "str", "default": "0755"}})
    p = module.params
    try:
        unpack(p["src"], p["dest"], int(p["mode"], 8), p["keep"])
    except (OSError, tarfile.TarError, ValueError) as exc:
        module.fail_json(msg=f"cannot unpack {p['src']} into {p['dest']}: {exc}")
    module.exit_json(changed=True, dest=p["dest"].rstrip("/"))


if __name__ == "__main__":
    main()
