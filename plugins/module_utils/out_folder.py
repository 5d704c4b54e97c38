"""Node-side: what the collect step brings back of the ranks' out folder (TORCHFLEET_OUT_DIR,
which is the run's folder on the node, shared by the node's ranks).

Every regular file under it except torchfleet's own top-level files; the smallest first while
they fit under the limit, so that metrics and event files come back and only large files
(checkpoints) can stay behind; packed into one archive, with the run's own files worth
keeping, that the controller takes whole.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import tarfile


def listing(run_dir, own):
    """(path relative to ``run_dir``, size) of every regular file below it, sorted. Links are
    neither followed nor listed; a top-level name (a file's or a folder's) that matches a
    pattern of ``own`` is torchfleet's and left out."""
    files = []
    for root, dirs, names in os.walk(run_dir):
        top = os.path.samefile(root, run_dir)
        if top:
            dirs[:] = [d for d in dirs if not any(fnmatch.fnmatchcase(d, pattern) for pattern in own)]
        for name in names:
            if top and any(fnmatch.fnmatchcase(name, pattern) for pattern in own):
                continue
            try:
                st = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                files.append((os.path.relpath(os.path.join(root, name), run_dir), st.st_size))
    return sorted(files)


def pick(files, max_bytes):
    """(taken, left) of ``files`` ((path, size) pairs): the smallest first while their sum
    stays within ``max_bytes``, none at all when it is 0; each list sorted by path."""
    taken, left, used = [], [], 0
    for path, size in sorted(files, key=lambda f: (f[1], f[0])):
        if max_bytes > 0 and used + size <= max_bytes:
            taken.append((path, size))
            used += size
        else:
            left.append((path, size))
    return sorted(taken), sorted(left)


def archive(run_dir, members, dest):
    """Pack ``members`` ((path relative to ``run_dir``, name in the archive) pairs) into the
    gzip'd tar ``dest``, file by file (never the whole in memory). A file that went away
    since it was listed is skipped; the names packed are returned."""
    packed = []
    # Level 1: logs and metrics shrink several times over, and checkpoints barely at any level.
    with tarfile.open(dest, "w:gz", compresslevel=1) as tar:
        for path, name in members:
            try:
                fd = os.open(os.path.join(run_dir, path), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue
            with os.fdopen(fd, "rb") as fh:
                info = tar.gettarinfo(arcname=name, fileobj=fh)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, fh)
            packed.append(name)
    return packed
