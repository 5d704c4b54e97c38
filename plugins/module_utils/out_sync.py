"""Node-side: what changed in a run's out folder since the controller's copy of it, for the
live sync (torchfleet tensorboard, torchfleet/livesync.py), which calls out_sync every
interval while a run runs.

The controller says what it holds of each file (``have``: its size, the node's mtime it
last took, and a digest of its last TAIL bytes). A file the node holds as it was is left
alone. A file that only grew, its old end unchanged (event files, logs, metrics appended
to), sends only its new bytes; any other change sends the file again from its start. What
is sent is the smallest first, within a budget per call: a file larger than what is left
of it sends a part, and the next call goes on from there. Files over ``max_file_bytes``
(checkpoints) are left to the collect, as are torchfleet's own files (``own``, as the
collect leaves them out) and every dot-named path (a writer's temporary file).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import os
import stat

# Bytes before a file's old end that must be unchanged for its growth to be sent alone.
TAIL = 4096
# out_sync's options, as its documentation gives them.
ARGS = {
    "run_dir": {"type": "path", "required": True},
    "own": {"type": "list", "elements": "str", "default": []},
    "have": {"type": "dict", "default": {}},
    "max_bytes": {"type": "int", "default": 4 << 20},
    "max_file_bytes": {"type": "int", "default": 64 << 20},
    "spec": {"type": "bool", "default": False},
}


def listing(run_dir, own):
    """{path relative to ``run_dir``: [size, mtime_ns]} of every regular file below it. Links
    are neither followed nor listed; nor is any path with a dot-named part, nor a top-level
    name (a file's or a folder's) that matches a pattern of ``own``."""
    files = {}
    for root, dirs, names in os.walk(run_dir):
        top = os.path.samefile(root, run_dir)
        dirs[:] = [d for d in dirs if not d.startswith(".")
                   and not (top and any(fnmatch.fnmatchcase(d, pattern) for pattern in own))]
        for name in names:
            if name.startswith(".") or (top and any(fnmatch.fnmatchcase(name, pattern) for pattern in own)):
                continue
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                files[os.path.relpath(path, run_dir)] = [st.st_size, st.st_mtime_ns]
    return files


def tail_digest(path, end):
    """sha256 of the TAIL bytes of ``path`` that end at ``end`` (fewer at a file's start)."""
    start = max(0, end - TAIL)
    with open(path, "rb") as fh:
        fh.seek(start)
        return hashlib.sha256(fh.read(end - start)).hexdigest()


def start_of(path, size, mtime_ns, held, digest=tail_digest):
    """Where the controller's copy ``held`` ([size, mtime_ns, digest] or None) of a file now
    ``size`` bytes long goes on from: its own size where the file only grew past it, its old
    end unchanged; 0 where the file must come again whole; None where it is as taken."""
    if held is None:
        return 0
    held_size, held_mtime, held_digest = held
    if held_size == size and held_mtime == mtime_ns:
        return None
    if 0 < held_size < size:
        try:
            if digest(path, held_size) == held_digest:
                return held_size
        except OSError:
            return None  # gone since it was listed: the next call says so
    return 0


def changes(run_dir, files, have, max_bytes, max_file_bytes, digest=tail_digest):
    """What to send of ``files`` (listing's) against ``have``: (reads, skipped). Each read is
    (path, offset, length, size, mtime_ns), the smallest remainder first, their lengths within
    ``max_bytes`` (a file that does not fit in what is left sends a part of it; a file whose
    content is as taken but whose mtime moved sends nothing and its new mtime). ``skipped``:
    [path, size] of the files over ``max_file_bytes``."""
    pending, skipped = [], []
    for path in sorted(files):
        size, mtime_ns = files[path]
        if size > max_file_bytes:
            skipped.append([path, size])
            continue
        start = start_of(os.path.join(run_dir, path), size, mtime_ns, have.get(path), digest)
        if start is not None:
            pending.append((size - start, path, start, size, mtime_ns))
    reads, budget = [], max_bytes
    for remaining, path, start, size, mtime_ns in sorted(pending):
        if budget <= 0 and remaining:
            break
        length = min(remaining, budget)
        reads.append((path, start, length, size, mtime_ns))
        budget -= length
    return reads, skipped


def read_chunks(run_dir, reads):
    """The chunks of ``reads`` as the controller applies them: path, offset, data (base64),
    the file's size and mtime_ns on the node, and the digest of the copy's new end, which
    the controller sends back as its ``have``. A file that shrank since it was listed sends
    what it has from the offset."""
    chunks = []
    for path, offset, length, size, mtime_ns in reads:
        full = os.path.join(run_dir, path)
        try:
            with open(full, "rb") as fh:
                fh.seek(offset)
                data = fh.read(length)
                end = offset + len(data)
                fh.seek(max(0, end - TAIL))
                digest = hashlib.sha256(fh.read(end - max(0, end - TAIL))).hexdigest()
        except OSError:
            continue
        chunks.append({"path": path, "offset": offset, "data": base64.b64encode(data).decode(), "size": size,
                       "mtime_ns": mtime_ns, "digest": digest})
    return chunks
