"""site.yml's skip of the roles already in place on a node.

A role's input on a host is one digest: the host's values of the role's variables, the
role's own files (and those of the roles it depends on), the code its tasks run (the
collection's plugins and this package, by content), and, for a role that
sends the controller's files to the nodes, those files' sizes and modification times. A node
keeps a record of the roles that converged there: each one's digest, and what shows it is
still in place (its checks, as the node saw them then). site.yml's probe reads that record
and looks at the same things again; a role whose digest and checks both hold is skipped.

The lookup role_inputs, the filter site_plan and the modules node_probe and site_record
call these functions.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import posixpath
import secrets
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import yaml

FORMAT = 1
# The record's name under the node's torchfleet folder (launch_node_dir).
RECORD_NAME = "site.json"
# The controller's key for the digests, under its state folder: a digest written on a node
# then says nothing of the values behind it (a registry password among them).
KEY_NAME = "site-digest.key"
# The variable that runs every role whatever the records say.
FORCE_VAR = "site_force"


def _engine_checks(values: Mapping[str, Any]) -> dict[str, Any]:
    paths = ["/etc/docker/daemon.json"] if values.get("container_runtime_manage_config") else []
    return {"engine": True, "images": [], "paths": paths}


def _image_checks(values: Mapping[str, Any]) -> dict[str, Any]:
    return {"engine": True, "images": [str(values["image_name"])], "paths": []}


def _dataset_checks(values: Mapping[str, Any]) -> dict[str, Any]:
    folder = str(values["dataset_dir"])
    return {"engine": False, "images": [], "paths": [posixpath.join(folder, str(f)) for f in values["dataset_files"]]}


def _python_env_checks(values: Mapping[str, Any]) -> dict[str, Any]:
    # The interpreter (a link to the system's: gone with it), and the folder whose entries
    # pip or conda add and remove, so an install or removal changes its modification time.
    if values.get("python_env_manager") == "conda":
        env = posixpath.join(str(values["python_env_conda_prefix"]), "envs", str(values["python_env_conda_env_name"]))
        paths = [posixpath.join(env, "bin", "python"), posixpath.join(env, "conda-meta")]
    else:
        prefix = str(values["python_env_prefix"])
        paths = [posixpath.join(prefix, "bin", "python"), posixpath.join(prefix, "pyvenv.cfg"),
                 posixpath.join(prefix, "lib", "python3*", "site-packages")]
    return {"engine": False, "images": [], "paths": paths}


# The roles that may be skipped: their state is the node's own, and a few cheap readings
# show it is still there (engine: the engine answers; images: each name still names the
# image ID it named; paths: each file or folder has the size and modification time it had,
# a glob standing for what it matched then).
CHECKS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "container_runtime": _engine_checks,
    "image": _image_checks,
    "dataset": _dataset_checks,
    "python_env": _python_env_checks,
}

# The roles that always run, and why no record can stand for them.
ALWAYS = {
    "overlay": "its peers' keys are made on the nodes, and its interface is not kept across a restart without systemd",
    "tls_pki": "a certificate's renewal depends on the date",
    "ssh_mesh": "its files name every node's address and keys",
    "slurm": "slurm.conf names every node's readings, and its daemons must be up",
}

# The variables that name controller files a role sends or reads: their state is input.
CONTROLLER_FILES = {
    "image": ("image_archive", "image_build_context"),
    "dataset": ("dataset_src",),
    "python_env": ("python_env_wheelhouse", "python_env_conda_installer_file", "python_env_conda_environment_file"),
}

_SKIPPED_DIRS = {"__pycache__"}
# The collection a wheel bundles inside the package: its plugins count once, as the plugins.
_BUNDLED = "collections"


def path_state(path: str | os.PathLike[str], skip: Iterable[str] = ()) -> list[list[Any]] | None:
    """A file's size and modification time, or those of every file under a folder (relative
    paths, sorted; the top-level entries named in ``skip`` left out); None where there is
    nothing. Cheap: a 1.3 GB archive is not read."""
    if not str(path) or not os.path.exists(path):
        return None
    if not os.path.isdir(path):
        st = os.stat(path)
        return [["", st.st_size, st.st_mtime_ns]]
    found = []
    top = os.fspath(path)
    for folder, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS and not (folder == top and d in skip))
        for name in files:
            full = os.path.join(folder, name)
            try:
                st = os.stat(full)
            except OSError:  # a dangling link
                continue
            found.append([os.path.relpath(full, path), st.st_size, st.st_mtime_ns])
    return sorted(found)


def role_folders(roles_dir: str | os.PathLike[str], role: str) -> list[Path]:
    """The role's folder and those of the roles it depends on (meta/main.yml), each once."""
    found: list[Path] = []

    def visit(name: str) -> None:
        folder = Path(roles_dir) / name
        if folder in found:
            return
        found.append(folder)
        meta = folder / "meta" / "main.yml"
        data = yaml.safe_load(meta.read_text()) if meta.is_file() else None
        for dep in (data or {}).get("dependencies") or []:
            visit(dep["role"] if isinstance(dep, Mapping) else str(dep))

    visit(role)
    return found


def content_hash(folders: Iterable[str | os.PathLike[str]], skip: Iterable[str] = ()) -> str:
    """SHA-256 of every file's relative path and content under ``folders``."""
    digest = hashlib.sha256()
    for folder in folders:
        digest.update(f"{Path(folder).name}\0".encode())
        for rel, _size, _mtime in path_state(folder, skip) or []:
            digest.update(f"{rel}\0".encode())
            digest.update(hashlib.sha256((Path(folder) / rel).read_bytes()).digest())
    return digest.hexdigest()


def code_state(folders: Iterable[str | os.PathLike[str]]) -> list[Any]:
    """The code the roles' tasks run (plugins, this package), by content: an edit makes every
    role run again, as a new release does, while the same release installed elsewhere (a
    wheel, a galaxy install, a new clone) does not. A few milliseconds for both."""
    return [content_hash([folder], skip=(_BUNDLED,)) for folder in folders]


def package_folder() -> Path:
    """This package's own folder (its filters run in every role)."""
    return Path(__file__).parent


def digest_key(state_dir: str | os.PathLike[str]) -> bytes:
    """The controller's key for the digests, made on first use. Every host's worker may ask
    at once: the first link wins and the others read it."""
    path = Path(state_dir) / KEY_NAME
    try:
        return bytes.fromhex(path.read_text().strip())
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{KEY_NAME}.{os.getpid()}.{secrets.token_hex(4)}")
    tmp.write_text(secrets.token_hex(32) + "\n")
    tmp.chmod(0o600)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    return bytes.fromhex(path.read_text().strip())


def digest(key: bytes, role: str, values: Mapping[str, Any], content: str, code: Sequence[Any],
           files: Mapping[str, Any], version: str) -> str:
    """HMAC-SHA256, under the controller's key, of everything a role's run depends on."""
    text = json.dumps([FORMAT, version, role, values, content, code, files], sort_keys=True, default=str,
                      separators=(",", ":"))
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def role_input(role: str, values: Mapping[str, Any], *, key: bytes, content: str, code: Sequence[Any],
               version: str) -> dict[str, Any] | None:
    """A skippable role's digest on a host (its variables' ``values`` there) and the checks
    its record keeps; None for a role that always runs."""
    if role not in CHECKS:
        return None
    files = {name: path_state(str(values.get(name) or "")) for name in CONTROLLER_FILES.get(role, ())}
    return {"digest": digest(key, role, values, content, code, files, version), "checks": CHECKS[role](values)}


def drift(entry: Mapping[str, Any], observed: Mapping[str, Any]) -> str | None:
    """Why a role recorded as ``entry`` is no longer in place by what the node shows now
    (``observed``, as node_probe reads it); None where every check holds."""
    if entry.get("engine") and not observed.get("engine"):
        return "the container engine does not answer"
    images = observed.get("images") or {}
    for name, was in sorted((entry.get("images") or {}).items()):
        now = images.get(name)
        if now is None or now != was:  # absent, or absent even when the role last ran
            return f"the image {name} is {now or 'absent'}, where it was {was or 'absent'}"
    paths = observed.get("paths") or {}
    for path, was in sorted((entry.get("paths") or {}).items()):
        now = paths.get(path)
        if now != was:
            return f"{path} is gone" if now is None else f"{path} changed (size, modification time)"
    return None


def _reason(role: str, given: Mapping[str, Any] | None, entry: Mapping[str, Any] | None,
            observed: Mapping[str, Any], force: bool) -> str | None:
    if force:
        return f"{FORCE_VAR} is set"
    if role in ALWAYS or role not in CHECKS:
        return f"it always runs: {ALWAYS.get(role, 'no record can show it is in place')}"
    if not given:
        return "its input could not be read"
    if not entry:
        return "the node has no record of it"
    if entry.get("digest") != given["digest"]:
        return "its input changed since it last ran here"
    return drift(entry, observed)


def selected(role: str, run_tags: Sequence[str] | None = None, skip_tags: Sequence[str] | None = None) -> bool:
    """Whether --tags and --skip-tags let the role's include run (site.yml tags each one
    with its name)."""
    run_tags, skip_tags = list(run_tags or ["all"]), list(skip_tags or [])
    return ("all" in run_tags or role in run_tags) and role not in skip_tags and "all" not in skip_tags


def plan(wanted: Mapping[str, Any], inputs: Mapping[str, Any], probe: Mapping[str, Any] | None,
         force: bool = False, run_tags: Sequence[str] | None = None,
         skip_tags: Sequence[str] | None = None) -> dict[str, Any]:
    """Which of the ``wanted`` roles (name -> whether the node gets it, in site.yml's order)
    run on a node, each with why (``run``, ``why``), and the records to write once they have
    run (``record``: those skippable roles that the tags let run). ``inputs``: role_inputs'
    answer for the host; ``probe``: node_probe's ``site_record`` there."""
    probe = probe or {}
    recorded = probe.get("recorded") or {}
    entries = recorded.get("roles") if recorded.get("format") == FORMAT else None
    observed = probe.get("observed") or {}
    run, why, record = [], {}, {}
    for role, on in wanted.items():
        if not on:
            continue
        reason = _reason(role, inputs.get(role), (entries or {}).get(role), observed, force)
        if reason is None:
            continue
        run.append(role)
        why[role] = reason
        if inputs.get(role) and selected(role, run_tags, skip_tags):
            record[role] = inputs[role]
    return {"run": run, "why": why, "record": record}
