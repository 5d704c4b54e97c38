"""Node-side: the record of the roles that converged on a node (torchfleet.site_state says
what it holds), and the readings its checks compare. Shared by node_probe, which reads the
record and looks again, and site_record, which writes it."""

from __future__ import annotations

import glob
import json
import os


def stat(path):
    """A file's or folder's [size, modification time in ns], or None where there is none."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def expand(paths):
    """Each path, a glob standing for what it matches now (itself where it matches nothing)."""
    found = []
    for path in paths:
        matches = sorted(glob.glob(path)) if glob.has_magic(path) else []
        found.extend(matches or [path])
    return found


def image_id(module, docker, name):
    """(whether the engine answered, the ID that ``name`` names there or None)."""
    rc, out, err = module.run_command([docker, "image", "inspect", "--format", "{{.Id}}", name])
    if rc == 0:
        return True, out.strip().splitlines()[0]
    return "no such image" in (err + out).lower(), None


def engine_answers(module, docker):
    rc, _out, _err = module.run_command([docker, "version", "--format", "{{.Server.Version}}"])
    return rc == 0


def observe(module, engine, images, paths):
    """What the node shows now: whether the engine answers (None where not asked), the ID
    each image name names, and each path's stat."""
    docker = module.get_bin_path("docker") if engine or images else None
    seen = {"engine": None, "images": {}, "paths": {path: stat(path) for path in paths}}
    answered = False
    for name in images:
        if docker:
            up, seen["images"][name] = image_id(module, docker, name)
            answered = answered or up
        else:
            seen["images"][name] = None
    if engine:
        seen["engine"] = bool(docker) and (answered or engine_answers(module, docker))
    return seen


def read(path):
    """The record at ``path``, or None where there is none or it cannot be read."""
    try:
        with open(path) as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def recorded_checks(record):
    """What a record asks to look at again: (engine, image names, paths), over every role."""
    roles = ((record or {}).get("roles") or {}).values()
    roles = [entry for entry in roles if isinstance(entry, dict)]
    return (any(entry.get("engine") for entry in roles),
            sorted({name for entry in roles for name in entry.get("images") or {}}),
            sorted({path for entry in roles for path in entry.get("paths") or {}}))


def entry(module, digest, checks):
    """A role's record: its digest, and what its checks read now (globs expanded)."""
    paths = expand(checks.get("paths") or [])
    seen = observe(module, bool(checks.get("engine")), list(checks.get("images") or []), paths)
    return {"digest": digest, "engine": bool(checks.get("engine")), "images": seen["images"], "paths": seen["paths"]}


def write(path, record):
    """Write ``record`` (JSON, 0600) in place of what ``path`` holds, at once."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(record, fh, sort_keys=True, indent=1)
        fh.write("\n")
    os.replace(tmp, path)
