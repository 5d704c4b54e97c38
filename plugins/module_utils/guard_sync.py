"""Bringing the newest checkpoint to every node of a new attempt, through the guards' TCPStore:
no controller, no port of its own. Shipped beside guard.py into each run's folder
(run_vocab.GUARD_SOURCES); the guard calls it between an attempt's plan and its ranks' start.

    manifest(folder) -> {relative name: [size, mtime_ns]}
        Every regular file under ``folder``, recursively, no path part of which starts with
        "." (a temporary file is dot-named by contract, so a half-written one is never seen).
    sync(store, attempt, host, hosts, folder, timeout, say=None) -> dict
        Called by one guard per node of the attempt (``hosts``, in node order). Each publishes
        its manifest; the source is the host whose newest file is newest (the first in node
        order on a tie). Every other host gets the source's files that it lacks or holds with
        another size or mtime, written to a dot-named temporary file, fsync'd, given the
        source's mtime and renamed into place; files the source lacks are left alone. Each
        needed file crosses the store once, in CHUNK-sized keys, at most WINDOW of them held
        at a time. Every host returns once every host is done, with
        {"source": host or None, "copied": [names this host received], "bytes": n, "seconds": s},
        after one summary line to ``say`` (default: standard output). A host silent for
        ``timeout`` seconds is named in a TimeoutError; a host that fails raises SyncError
        and posts why, and every other host then raises PeerError (a SyncError) with it.

The store is the guard's (guard_store.SignedStore): set, get and read sign and check each
value's MAC under the run's key, so that a manifest, a part or a failure that is not the
run's is never acted on; check, add and delete_key are the TCPStore's own. Waits are short
polls, so that the store's one socket is never held for long.
"""

from __future__ import annotations

import json
import os
import sys
import time

CHUNK = 4 << 20
WINDOW = 4  # chunks in the store at once: what the store's host holds for a transfer
POLL = 0.1  # the longest pause between two looks at the store


class SyncError(RuntimeError):
    """A host of the attempt could not send or receive the checkpoint."""


class PeerError(SyncError):
    """Another host of the attempt failed, for the reason it posted."""


def manifest_key(attempt: int, host: str) -> str:
    return f"ckpt/{attempt}/manifest/{host}"


def count_key(attempt: int, stage: str) -> str:
    return f"ckpt/{attempt}/{stage}"  # a counter: hosts with a manifest out, hosts done, chunks sent


def done_key(attempt: int, host: str) -> str:
    return f"ckpt/{attempt}/done/{host}"


def chunk_key(attempt: int, seq: int) -> str:
    return f"ckpt/{attempt}/chunk/{seq}"


def got_key(attempt: int, host: str) -> str:
    return f"ckpt/{attempt}/got/{host}"  # chunks this host has read so far


def failed_key(attempt: int) -> str:
    return f"ckpt/{attempt}/failed"


def manifest(folder: str) -> dict[str, list]:
    found: dict[str, list] = {}
    if not os.path.isdir(folder):
        return found
    for top, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            path = os.path.join(top, name)
            if name.startswith(".") or os.path.islink(path) or not os.path.isfile(path):
                continue
            stat = os.stat(path)
            found[os.path.relpath(path, folder).replace(os.sep, "/")] = [stat.st_size, stat.st_mtime_ns]
    return found


def plan(manifests: dict[str, dict], hosts: list[str]) -> tuple[str | None, dict[str, list[str]]]:
    """The source, and what each other host needs from it (the same answer on every host)."""
    newest = {h: max((entry[1] for entry in manifests[h].values()), default=-1) for h in hosts}
    source = max(hosts, key=lambda h: (newest[h], -hosts.index(h)))
    if newest[source] < 0:
        return None, {}
    files = manifests[source]
    return source, {h: sorted(n for n in files if manifests[h].get(n) != files[n]) for h in hosts if h != source}


def sync(store, attempt: int, host: str, hosts: list[str], folder: str, timeout: float, say=None) -> dict:
    started = time.monotonic()
    try:
        store.set(manifest_key(attempt, host), json.dumps(manifest(folder)))
        _arrive(store, attempt, "manifests", hosts, timeout, manifest_key, "publish its manifest")
        manifests = {h: json.loads(store.get(manifest_key(attempt, h))) for h in hosts}
        source, needs = plan(manifests, hosts)
        copied, received = [], 0
        if any(needs.values()):
            files, chunks, seq = manifests[source], {}, 0  # chunks: name -> its chunks' numbers, in sending order
            for name in sorted(set().union(*needs.values())):
                count = -(-files[name][0] // CHUNK)
                chunks[name], seq = list(range(seq, seq + count)), seq + count
            if host == source:
                _send(store, attempt, folder, files, chunks, needs, timeout)
            elif needs[host]:
                copied = needs[host]
                received = _receive(store, attempt, host, folder, files, chunks, copied, source, timeout)
            store.set(done_key(attempt, host), "1")
            _arrive(store, attempt, "done", hosts, timeout, done_key, "finish its part", grace=True)
    except Exception as exc:
        if not isinstance(exc, PeerError):
            try:
                store.set(failed_key(attempt), f"{host}: {exc}")
            except Exception:  # noqa: BLE001 - the store is gone too: each host names what it waited for
                pass
        raise
    seconds = round(time.monotonic() - started, 3)
    takers = [h for h in hosts if needs.get(h)]
    line = ("no checkpoint on any node, nothing to copy" if source is None
            else f"{host} has the newest checkpoint, sent to {', '.join(takers) or 'no node'}" if host == source
            else f"received {len(copied)} file(s), {received} bytes, from {source}" if copied
            else f"up to date with {source}")
    (say or (lambda text: sys.stdout.write(text + "\n")))(f"checkpoint sync, attempt {attempt}: {line} ({seconds:g}s)")
    return {"source": source, "copied": copied, "bytes": received, "seconds": seconds}


def _poll(store, attempt: int, timeout: float, ready, missing, what: str, grace: bool = False) -> None:
    """Until ready() returns (True, _); its second value is progress, and ``timeout`` runs from
    its last change. A wait on a host that itself waits on another (grace) lasts a little
    longer, so that the host really at fault is named by the one waiting on it."""
    limit = timeout + (min(timeout, 5.0) if grace else 0.0)
    last, mark, pause = time.monotonic(), None, 0.005
    while True:
        done, progress = ready()
        if done:
            return
        failed = store.read(failed_key(attempt))
        if failed is not None:
            raise PeerError(f"checkpoint sync of attempt {attempt} failed on {failed.decode()}")
        if progress != mark:
            last, mark, pause = time.monotonic(), progress, 0.005
        elif time.monotonic() - last > limit:
            raise TimeoutError(f"checkpoint sync of attempt {attempt}: {', '.join(missing())} did not {what} "
                               f"within {limit:g}s")
        time.sleep(pause)
        pause = min(POLL, pause * 2)


def _arrive(store, attempt, stage, hosts, timeout, key, what, grace=False) -> None:
    """Count this host in at ``stage`` and wait for all of them; chunks sent count as progress."""
    store.add(count_key(attempt, stage), 1)

    def ready():
        count = store.add(count_key(attempt, stage), 0)
        return count >= len(hosts), (count, store.add(count_key(attempt, "sent"), 0))
    _poll(store, attempt, timeout, ready, lambda: [h for h in hosts if not store.check([key(attempt, h)])], what, grace)


def _send(store, attempt, folder, files, chunks, needs, timeout) -> None:
    takers = {seq: [h for h, names in needs.items() if name in names] for name, seqs in chunks.items() for seq in seqs}
    held = []

    def release(seq: int) -> None:  # once every host that needs a chunk has read it, it leaves the store
        def ready():
            got = {h: store.add(got_key(attempt, h), 0) for h in takers[seq]}
            behind[:] = [h for h in takers[seq] if got[h] < _upto(chunks, needs[h], seq)]
            return not behind, got
        behind: list[str] = []
        _poll(store, attempt, timeout, ready, lambda: behind, "read the checkpoint")
        store.delete_key(chunk_key(attempt, seq))
        held.remove(seq)

    try:
        for name, seqs in chunks.items():
            with open(os.path.join(folder, name), "rb") as fh:
                stat = os.fstat(fh.fileno())
                if [stat.st_size, stat.st_mtime_ns] != files[name]:
                    raise SyncError(f"{name} changed during the checkpoint sync")
                for seq in seqs:
                    if seq >= WINDOW:
                        release(seq - WINDOW)
                    store.set(chunk_key(attempt, seq), fh.read(CHUNK))
                    held.append(seq)
                    store.add(count_key(attempt, "sent"), 1)
        for seq in list(held):
            release(seq)
    finally:
        for seq in held:  # a transfer that failed leaves no chunk behind in the store's memory
            try:
                store.delete_key(chunk_key(attempt, seq))
            except Exception:  # noqa: BLE001 - the store is gone, and its memory with it
                break


def _upto(chunks: dict[str, list[int]], names: list[str], seq: int) -> int:
    """How many chunks a host that needs ``names`` has read once it has read chunk ``seq``."""
    return sum(1 for name in names for s in chunks[name] if s <= seq)


def _receive(store, attempt, host, folder, files, chunks, names, source, timeout) -> int:
    received = 0
    for name in names:
        parts = name.split("/")
        if os.path.isabs(name) or any(p in ("", "..") or p.startswith(".") for p in parts):
            raise SyncError(f"{source} offered {name!r}, which is not a checkpoint folder's file name")
        path = os.path.join(folder, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temp = os.path.join(os.path.dirname(path), f".{parts[-1]}.sync-{attempt}-{os.getpid()}")
        try:
            with open(temp, "wb") as fh:
                for seq in chunks[name]:
                    got: list[bytes | None] = [None]

                    def arrived(key=chunk_key(attempt, seq)):
                        got[0] = store.read(key)  # a part without the run's MAC is waited past
                        return got[0] is not None, None
                    _poll(store, attempt, timeout, arrived, lambda: [source], "send the checkpoint's next part",
                          grace=True)
                    data = got[0]
                    fh.write(data)
                    received += len(data)
                    store.add(got_key(attempt, host), 1)
                fh.flush()
                os.fsync(fh.fileno())
            if os.path.getsize(temp) != files[name][0]:
                raise SyncError(f"{name} from {source} arrived with {os.path.getsize(temp)} of {files[name][0]} bytes")
            os.utime(temp, ns=(files[name][1], files[name][1]))
            os.replace(temp, path)
        finally:
            if os.path.exists(temp):
                os.unlink(temp)
        fd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself on the disk before the ranks start
        finally:
            os.close(fd)
    return received
