"""The check phase's verdicts on a node: what its state must be for the launch (its
runtime, the paths its ranks need, free ports, no run of the job still running, the
allocator's library, and what the launch mode itself needs). Each check is a check_input
entry naming its variable; a plan reports them and fails on none."""

from __future__ import annotations

import os
from typing import Any, Mapping

from torchfleet import modes
from torchfleet.settings import ALLOCATORS, malloc_library, node_paths

def malloc_check(malloc: Any, found: Mapping[str, Any] | None, where: str) -> list[dict[str, Any]]:
    """check_input's entry for launch_malloc's library (``found``: soname to its path, None
    where the dynamic loader has none; ``where``: the image or the python_env it was asked
    in). None for ``found`` means the runtime itself is missing, which its own check reports."""
    library = malloc_library(malloc)
    if not library or found is None:
        return []
    error = found.get("error") if isinstance(found, Mapping) else None
    package = ALLOCATORS[str(malloc)]["package"]
    return [{"that": bool(found.get(library)), "kind": "node", "variable": "launch_malloc",
             "msg": f"launch_malloc={malloc} but {where} has no {library} (ldconfig -p"
                    f"{': ' + str(error) if error else ''}); install {package} there, or set launch_malloc: default"}]


def missing_path_check(needed: Mapping[str, str]) -> dict[str, Any]:
    """A failed check_input entry for a path a node lacks (``needed``: one of node_paths)."""
    return {"that": False, "kind": "node", "variable": needed["variable"],
            "msg": f"{needed['path']} does not exist on the node ({needed['variable']})"}


def taken_port_check(port: Any, table: Mapping[str, Any], skip: bool = False) -> dict[str, Any]:
    """A check_input entry for a port that already listens on the master (passes when ``skip``)."""
    variable = "launch_master_port" if int(port) == int(table["master_port"]) else "launch_guard_port"
    return {"that": bool(skip), "kind": "node", "variable": variable,
            "msg": f"{variable} {port} is already in use on {table['master_addr']}; choose another {variable}"}


def node_checks(host: str, reading: Mapping[str, Any], ready: bool, running: list[str], table: Mapping[str, Any], *,
                bare: bool, runtime: str, settings: Mapping[str, Any], job: str, planning: bool,
                replace: bool, mode: str = "container", image_account: Mapping[str, Any] | None = None,
                libraries: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """check_input's checks of a node's state against the launch: its runtime (``runtime``:
    launch_python, or launch_image where ``bare`` is false), each path its ranks need
    (``reading``: node_probe's, with ``missing`` and ``listening``), a run of the job that
    still runs there (``running``), and the ports already taken on the master (``host``
    is the master's where ``table`` says so). A plan
    (``planning``) reports what it finds and fails on none; under ``replace`` the ports
    are checked once the replaced run has stopped. What the launch ``mode`` needs of the
    node comes too (LaunchMode.node_checks), and launch_malloc's library where the loader was asked
    (``libraries``: in the image, or on the node for a bare launch; malloc_check)."""
    if bare:
        runtime_check = {"variable": "launch_python",
                         "msg": f"launch_python {runtime} does not exist; run site.yml with torchfleet_python_env: true first"}
    else:
        runtime_check = {"variable": "launch_image", "msg": f"launch_image {runtime} is not on this node; run site.yml first"}
    checks = [{"that": planning or bool(ready), "kind": "node", **runtime_check}]
    missing = set(reading.get("missing") or [])
    checks += [missing_path_check(p) for p in node_paths(settings) if p["path"] in missing]
    checks.append({"that": planning or replace or not running, "kind": "running", "variable": "launch_job",
                   "msg": f"job {job} is still running as run {', '.join(running)}; stop it (torchfleet stop "
                          f"{running[0] if running else ''}), or launch with --replace (launch_replace=true), which "
                          "stops it first and keeps its logs"})
    # The controller refuses an id its own runs folder holds; a node may hold one that another
    # controller launched, or whose record here was removed: its state files would mix.
    taken_run = reading.get("run_taken")
    if taken_run:
        checks.append({"that": planning, "kind": "node", "variable": "launch_run_id",
                       "msg": f"launch_run_id {os.path.basename(taken_run)} is taken: {taken_run} exists on the node, "
                              "from an earlier run; choose another, or leave launch_run_id empty"})
    # Every node reports its ports; only the master's are the rendezvous's and the guards'.
    skip_ports = planning or replace or bool(running)
    taken = reading.get("listening") or [] if host == table["master_host"] else []
    checks += [taken_port_check(port, table, skip_ports) for port in taken]
    checks += modes.get(mode).node_checks(host, reading, image_account, settings, table, runtime)
    where = f"launch_python {runtime}'s node" if bare else f"launch_image {runtime}"
    checks += [dict(c, that=planning or c["that"]) for c in malloc_check(settings.get("malloc"), libraries, where)]
    return checks
