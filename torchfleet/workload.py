"""Pack a workload (one training file, or a folder of them) on the controller for the nodes."""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import stat
import tarfile
import tempfile
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from torchfleet.errors import WorkloadError

IGNORE_FILE = ".torchfleetignore"

_SKIP_NAMES = frozenset({".git", "__pycache__"})
_MODULE = re.compile(r"[^\W\d]\w*(?:\.[^\W\d]\w*)*")
_CHUNK = 1 << 20


@dataclass(frozen=True)
class _Rule:
    pattern: str
    dir_only: bool
    anchored: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        return fnmatchcase(rel if self.anchored else posixpath.basename(rel), self.pattern)


def _rules(folder: Path) -> list[_Rule]:
    """The patterns of the folder's ignore file, none if it has none."""
    ignore = folder / IGNORE_FILE
    if not ignore.is_file():
        return []
    rules = []
    for number, line in enumerate(ignore.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("!"):
            raise WorkloadError(f"{ignore}:{number}: negated patterns ('{line}') are not supported")
        dir_only = line.endswith("/")
        pattern = line.rstrip("/")
        rule = _Rule(pattern.lstrip("/"), dir_only, "/" in pattern)
        if not rule.pattern:
            raise WorkloadError(f"{ignore}:{number}: '{line}' matches no path")
        rules.append(rule)
    return rules


def _walk(root: str, folder: str, prefix: str, rules: list[_Rule], parents: frozenset[str],
          out: list[str]) -> None:
    """Append to ``out`` the files under ``folder`` that ship; ``parents`` are the real folders above."""
    with os.scandir(folder) as entries:
        for entry in entries:
            rel = prefix + entry.name
            if entry.name in _SKIP_NAMES:
                continue
            is_dir = entry.is_dir()
            if any(rule.matches(rel, is_dir) for rule in rules):
                continue
            link = entry.is_symlink()
            real = os.path.realpath(entry.path) if link or is_dir else ""
            # Checked after the ignore rules, so a link the user ignores may point anywhere.
            if link and os.path.commonpath([root, real]) != root:
                raise WorkloadError(f"workload symlink {entry.path} points outside the workload folder, to {real}")
            if is_dir:
                if real in parents:
                    raise WorkloadError(f"workload symlink {entry.path} loops back to {real}")
                _walk(root, entry.path, rel + "/", rules, parents | {real}, out)
            # A dangling link inside the folder (an editor's lock file) is no file: left out.
            elif entry.is_file() and not entry.name.endswith(".pyc") and rel != IGNORE_FILE:
                out.append(rel)


def manifest(path: str | os.PathLike[str]) -> list[str]:
    """The sorted relative POSIX paths of the files that ship with the workload at ``path``."""
    path = Path(path)
    if path.is_file():
        return [path.name]
    if not path.is_dir():
        raise WorkloadError(f"launch_workload {path} is not a file or folder on the controller")
    root = os.path.realpath(path)
    files: list[str] = []
    _walk(root, str(path), "", _rules(path), frozenset({root}), files)
    if not files:
        raise WorkloadError(f"launch_workload {path} has no file to ship (all excluded or none there)")
    return sorted(files)


def pack(path: str | os.PathLike[str], dest: str | os.PathLike[str]) -> dict[str, Any]:
    """Write the workload to the tar ``dest``, the same bytes for the same files and modes."""
    path, dest = Path(path), Path(dest)
    files = manifest(path)
    base = path if path.is_dir() else path.parent
    root = os.path.realpath(path)
    if path.is_dir() and os.path.commonpath([root, os.path.realpath(dest)]) == root:
        # The next pack would ship this archive inside itself, and never give the same checksum.
        raise WorkloadError(f"the archive {dest} must not be inside the workload folder {path}")
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as raw:
            with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
                for rel in files:
                    with open(base / rel, "rb") as src:
                        # Stat the open file, so a file rewritten meanwhile still matches its size.
                        st = os.fstat(src.fileno())
                        # A fresh TarInfo has mtime 0, uid/gid 0 and no owner names: the host's never reach it.
                        info = tarfile.TarInfo(rel)
                        info.size = st.st_size
                        info.mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
                        tar.addfile(info, src)
            raw.flush()
            os.fsync(raw.fileno())
        digest = hashlib.sha256()
        with open(tmp, "rb") as archive:
            while chunk := archive.read(_CHUNK):
                digest.update(chunk)
        size = os.path.getsize(tmp)
        os.replace(tmp, dest)
    except BaseException:
        os.unlink(tmp)
        raise
    return {"archive": str(dest), "sha256": digest.hexdigest(), "files": files, "bytes": size}


def entrypoint_argv(workload_path: str | os.PathLike[str], entrypoint: str, python: str) -> list[str]:
    """The command a rank runs, from the workload folder: ``[python, script]`` or ``[python, "-m", module]``."""
    path = Path(workload_path)
    entrypoint = entrypoint.strip()
    if entrypoint.startswith("-m"):
        module = entrypoint[2:].strip()
        if not _MODULE.fullmatch(module):
            raise WorkloadError(f"launch_entrypoint '{entrypoint}': '{module}' is not a dotted module name",
                                variable="launch_entrypoint")
        return [python, "-m", module]
    files = manifest(path)
    if not entrypoint:
        if path.is_dir():
            raise WorkloadError(f"launch_workload {path} is a folder: set launch_entrypoint to the script "
                                "to run (e.g. train.py) or '-m package.module'", variable="launch_entrypoint")
        return [python, files[0]]
    script = posixpath.normpath(entrypoint)
    if script not in files:
        # Scripts first: they are what the user most likely meant.
        shown = sorted(files, key=lambda f: (not f.endswith(".py"), f))[:10]
        more = f" and {len(files) - len(shown)} more" if len(files) > len(shown) else ""
        raise WorkloadError(f"launch_entrypoint '{entrypoint}' is not a file of the workload {path}; "
                            f"it has: {', '.join(shown)}{more}", variable="launch_entrypoint")
    return [python, script]
