"""Node-side: a job's workload folder, replaced whole from workload_pack's tar (run_state)."""

from __future__ import annotations

import base64
import os
import shutil
import tarfile
import tempfile


def _safe(members, root):
    root = os.path.realpath(root)
    for m in members:
        target = os.path.realpath(os.path.join(root, m.name))
        if not (m.isfile() or m.isdir()) or not (target == root or target.startswith(root + os.sep)):
            raise ValueError(f"{m.name}: not a plain file or folder inside the workload")
    return members


def unpack(src, dest, mode=0o755, keep=None):
    """Unpack ``src`` into a fresh folder beside ``dest`` and swap it in, so that files
    deleted on the controller go too and a rank never sees half a workload; then move
    ``src`` to ``keep``. Members outside ``dest`` (absolute, ``..``, a link, a device) are
    refused. Raises OSError, tarfile.TarError or ValueError, leaving ``dest`` as it was."""
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


def install(workload):
    """Unpack a workload as run_state receives it: ``dest`` and ``keep``, and the tar either
    as ``data`` (base64, a small one sent with the call) or at ``src`` (on the node)."""
    src = workload.get("src")
    if not src:
        parent = os.path.dirname(workload["dest"].rstrip("/"))
        os.makedirs(parent, exist_ok=True)
        fd, src = tempfile.mkstemp(prefix=".send-", suffix=".tar", dir=parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(base64.b64decode(workload["data"]))
    try:
        unpack(src, workload["dest"], keep=workload.get("keep"))
    finally:
        if os.path.exists(src) and src != workload.get("keep"):
            os.unlink(src)
