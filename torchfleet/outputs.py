"""What comes back of the ranks' out folders (TORCHFLEET_OUT_DIR) into runs/RUN/out/HOST/.

A node's ranks share one out folder, the run's folder on the node (a container sees it as
/out), so it comes back per node. torchfleet's own files there (logs, checksums, the model,
guard records, heartbeats, the spec) are left out: report.run_files names those worth
keeping, which come back into runs/RUN/ itself, in the same archive. The node lists and
packs (module_utils/out_folder.py); this module says what is torchfleet's, puts an archive
in place and words what the limit left.
"""

from __future__ import annotations

import filecmp
import os
import posixpath
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Mapping

from torchfleet import report
from torchfleet.inputs import RUN_CHECKPOINTS
from torchfleet import run_vocab as vocab

VARIABLE = "launch_collect_out_max_mb"
MB = 1 << 20
# launch_collect_out_max_mb's bound: a TiB per node.
MAX_MB = 1 << 20
# The run folder's files that torchfleet writes whatever the mode: the spec, the guard and
# the run's end with the modules they import (and Python's cache of them, a folder), its config and locks, the
# mpirun environment files (one of them secret), the store's key, the stop request, the run's state (on
# the master) and the run's own checkpoint folder (large, and for the nodes).
OWN = (vocab.SPEC, *vocab.NODE_SOURCES, "__pycache__", vocab.GUARD_CONFIG, vocab.GUARD_LOCKS, "node.env",
       vocab.SECRET_ENV, vocab.STORE_KEY, vocab.STOP, vocab.JOB, RUN_CHECKPOINTS)


def own_files(spec: Mapping[str, Any], host: str) -> list[str]:
    """Patterns of the top-level names in ``host``'s run folder that are torchfleet's: the
    files report.run_files brings back (its ranks' logs and checksums, its guard records,
    and on the master model.pt: a second copy would double the largest download), every
    unit's log, process files and heartbeat, and OWN; each also while it is written (NAME.tmp*)."""
    names = {name for name, _ in report.run_files(spec, host)} | set(OWN)
    for unit in spec["units"]:
        if unit["host"] != host:
            continue
        if unit.get("kind") == "process":
            names |= {vocab.process_file(unit["name"], kind) for kind in vocab.ProcessFile}
        ranks = unit.get("ranks") or []
        names.add(vocab.unit_log(unit["role"], ranks[0] if ranks else None))
        beat = (unit.get("env") or {}).get("TORCHFLEET_HEARTBEAT")
        if beat:
            names.add(posixpath.basename(beat))
    names = sorted(n.replace("[", "[[]") for n in names)
    return names + [f"{n}.tmp*" for n in names]


def collect_plan(spec: Mapping[str, Any], host: str) -> dict[str, Any]:
    """What collect_run needs of the run's spec on ``host``: the run's id, the node's ranks,
    its files worth bringing (``wanted``: name on the node to name in runs/RUN/), the patterns
    of torchfleet's own files (``own``) and how its units end (``end``: report.run_end). Each
    node's task carries its own part: at 48 nodes, the whole spec templated into each node's
    task cost the controller more CPU than the node's module run."""
    return {"run_id": spec["run_id"], "ranks": sorted(int(r["rank"]) for r in spec["ranks"] if r["host"] == host),
            "wanted": dict(report.run_files(spec, host)), "own": own_files(spec, host), "end": report.run_end(spec)}


def collect_plans(spec: Mapping[str, Any], hosts: list[str]) -> dict[str, dict[str, Any]]:
    """collect_plan for each of ``hosts``, computed once for the play."""
    return {host: collect_plan(spec, host) for host in hosts}


def unpack(archive: str | Path, run_dir: str | Path, wanted: Mapping[str, str],
           out_dir: str | Path) -> tuple[list[str], list[str] | None]:
    """Put a node's archive (run_outputs': ``run/NAME`` for its files of the run, ``out/PATH``
    for its ranks' out folder) in place. Each ``run/NAME`` that ``wanted`` names (the node's
    name, mapped to the name in ``run_dir``) is streamed into a temporary file beside its
    destination and renamed over it; the out folder is unpacked into a temporary folder
    renamed over ``out_dir`` (runs/RUN/out/HOST) at the end, where the archive holds any of
    it. A reader never sees half a file or half a folder. Only regular files with plain
    relative paths are taken (the archive comes from a node). What is already there as it
    came is left as it is, so that a collect that brings nothing new changes nothing.
    Returns the names placed anew in ``run_dir``, and the out folder's paths where it was
    placed anew ([] where it came as it was, None where the archive has none)."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    part: Path | None = None
    placed, out = [], []
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for member in tar:
                name = PurePosixPath(member.name)
                if not member.isreg() or name.is_absolute() or ".." in name.parts or len(name.parts) < 2:
                    continue
                top, rest = name.parts[0], name.parts[1:]
                if top == "run" and len(rest) == 1 and rest[0] in wanted:
                    if _write_whole(tar, member, run_dir / wanted[rest[0]]):
                        placed.append(wanted[rest[0]])
                elif top == "out":
                    if part is None:
                        out_dir.parent.mkdir(parents=True, exist_ok=True)
                        part = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.part-", dir=out_dir.parent))
                    dest = part.joinpath(*rest)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    with tar.extractfile(member) as src, open(dest, "wb") as fh:
                        shutil.copyfileobj(src, fh, 1 << 20)
                    os.utime(dest, (member.mtime, member.mtime))
                    out.append(str(PurePosixPath(*rest)))
        if part is not None:
            if _same_tree(part, out_dir):
                shutil.rmtree(part)
                return sorted(placed), []
            part.chmod(0o755)
            _replace_dir(part, out_dir)
    except BaseException:
        if part is not None:
            shutil.rmtree(part, ignore_errors=True)
        raise
    return sorted(placed), (sorted(out) if part is not None else None)


def _write_whole(tar: tarfile.TarFile, member: tarfile.TarInfo, dest: Path) -> bool:
    """The member in place of ``dest``, unless ``dest`` holds it already; whether it was placed."""
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.part-", dir=dest.parent)
    try:
        with tar.extractfile(member) as src, os.fdopen(fd, "wb") as fh:
            shutil.copyfileobj(src, fh, 1 << 20)
        if dest.is_file() and filecmp.cmp(tmp, dest, shallow=False):
            os.unlink(tmp)
            return False
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
        return True
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _same_tree(new: Path, old: Path) -> bool:
    """Whether two folders hold the same files with the same bytes."""
    if not old.is_dir():
        return False
    files = lambda root: sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())  # noqa: E731
    names = files(new)
    return names == files(old) and all(filecmp.cmp(new / n, old / n, shallow=False) for n in names)


def _replace_dir(new: Path, dest: Path) -> None:
    """Rename ``new`` to ``dest``; an older ``dest`` is first renamed aside, then removed."""
    if dest.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{dest.name}.old-", dir=dest.parent))
        os.replace(dest, old / dest.name)
        os.replace(new, dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, dest)


def record(host: str, plan: Mapping[str, Any], node_run_dir: str, out_dir: str, found: Mapping[str, Any],
           max_mb: int) -> dict[str, Any]:
    """What came back of ``host``'s out folder, for summary.json, from run_outputs' result
    ``found`` (``plan``: the node's collect_plan); with ``message`` where the limit left files on the node."""
    files, size = found["total"]
    taken, taken_bytes = found["taken"]
    left, left_bytes = found["left"]
    entry = {"host": host, "ranks": list(plan["ranks"]), "dir": out_dir if taken else None, "files": files, "bytes": size,
             "taken_files": taken, "taken_bytes": taken_bytes, "left_files": left, "left_bytes": left_bytes,
             "left_largest": [list(f) for f in found.get("left_largest") or []], "max_mb": max_mb,
             "node_dir": node_run_dir, "message": None}
    if left:
        entry["message"] = left_message(plan["run_id"], entry)
    return entry


def left_message(run_id: str, entry: Mapping[str, Any]) -> str:
    """Which node (and ranks) kept what, under which limit, and the two ways to get it."""
    ranks = entry["ranks"]
    who = f"{entry['host']} (rank{'s' if len(ranks) != 1 else ''} {', '.join(map(str, ranks)) or '-'})"
    largest = ", ".join(f"{path} ({_mb(size)})" for path, size in entry["left_largest"][:3])
    need = -(-entry["bytes"] // MB) or 1
    return (f"{who}: {entry['left_files']} of the out folder's {entry['files']} files ({_mb(entry['left_bytes'])} "
            f"of {_mb(entry['bytes'])}) stayed on the node, over {VARIABLE}={entry['max_mb']}"
            f"{'; the largest: ' + largest if largest else ''}. They are in {entry['host']}:{entry['node_dir']} "
            f"(until the node prunes the run); to bring the whole folder back: "
            f"torchfleet collect {run_id} -e {VARIABLE}={need}")


def _mb(size: int) -> str:
    return f"{size / MB:.1f} MB"
