"""Inventory variables that look like torchfleet's but are not read by it.

Guides name things ``rank``, ``cpuset`` or ``MASTER_PORT``; Ansible accepts any variable, so
such a name is silently ignored and the run goes ahead with the default. This finds them.
It reads only names (and the roles' own files), so it runs on the controller before any
node is touched.
"""

from __future__ import annotations

import difflib
import functools
from pathlib import Path
from typing import Any, Iterable

import yaml

from torchfleet.ranks import ADDRESS_VAR, NETWORK_VAR, NODE_RANK_VAR, PROCS_VAR

# Names from torchrun, docker, the BigDL guide and OpenMP docs -> the variable meant.
ALIASES: dict[str, str] = {
    "rank": NODE_RANK_VAR,
    "node_rank": NODE_RANK_VAR,
    "NODE_RANK": NODE_RANK_VAR,
    "cpuset": "cpu_pinning_cpusets",
    "cpusets": "cpu_pinning_cpusets",
    "cpuset_cpus": "cpu_pinning_cpusets",
    "cpu_set": "cpu_pinning_cpusets",
    "master_port": "launch_master_port",
    "MASTER_PORT": "launch_master_port",
    "master_addr": ADDRESS_VAR,
    "MASTER_ADDR": ADDRESS_VAR,
    "cluster_address": ADDRESS_VAR,
    "world_size": PROCS_VAR,
    "nproc_per_node": PROCS_VAR,
    "procs_per_node": PROCS_VAR,
    "nprocs": PROCS_VAR,
    # torchfleet_image works too, but launch_image is the one the launch role documents.
    "image": "launch_image",
    "docker_image": "launch_image",
    "omp_num_threads": "launch_omp_num_threads",
    "OMP_NUM_THREADS": "launch_omp_num_threads",
    "workload": "launch_workload",
    "mode": "launch_mode",
    "launch_type": "launch_mode",
}

# One per role, plus the inventory-level torchfleet_; a name under one of these is meant
# for torchfleet, so an unknown one is a typo rather than the user's own variable.
PREFIXES: tuple[str, ...] = (
    "launch_",
    "torchfleet_",
    "cpu_pinning_",
    "image_",
    "dataset_",
    "tls_pki_",
    "ssh_mesh_",
    "python_env_",
    "overlay_",
    "container_runtime_",
    "local_cluster_",
    "kubelet_cpu_manager_",
    "image_archive_",
)

# Read by the code, site.yml or a role's defaults (via default()) without being a role
# variable, so neither defaults/main.yml nor argument_specs.yml lists them.
INVENTORY_NAMES: frozenset[str] = frozenset(
    {
        NODE_RANK_VAR,
        PROCS_VAR,
        ADDRESS_VAR,
        NETWORK_VAR,
        "torchfleet_image",
        "torchfleet_dataset_dir",
        "torchfleet_state_dir",
        "torchfleet_containers",
        "torchfleet_python_env",
        "torchfleet_local_cluster",
        "overlay_enabled",
        "gloo_tls",
        "sgx_devices",
        "cpu_pinning",
    }
)


def _load(path: Path) -> Any:
    # libyaml's loader where PyYAML has it: every playbook's first play reads these files.
    with path.open(encoding="utf-8") as f:
        return yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def known_names(roles_dir: str | Path) -> set[str]:
    """Every variable torchfleet reads: the roles' defaults and argument specs, plus the
    inventory-level names."""
    names = set(INVENTORY_NAMES)
    roles = Path(roles_dir)
    for defaults in sorted(roles.glob("*/defaults/main.yml")):
        names.update(_load(defaults) or {})
    for specs in sorted(roles.glob("*/meta/argument_specs.yml")):
        entry_points = (_load(specs) or {}).get("argument_specs") or {}
        for entry in entry_points.values():
            names.update((entry or {}).get("options") or {})
    return names


def _internal(name: str) -> bool:
    # Roles keep their own facts under <role>__ and a leading _; users never set these.
    return name.startswith("_") or any(name.startswith(prefix + "_") for prefix in PREFIXES)


def _warning(hosts: list[str], name: str, meant: str | None) -> dict[str, Any]:
    hint = f"did you mean {meant}?" if meant else "no torchfleet variable has a name like it"
    return {
        "host": hosts[0],
        "hosts": hosts,
        "variable": name,
        "meant": meant,
        "message": f"host{'s' if len(hosts) > 1 else ''} {', '.join(hosts)}: {name} is not a torchfleet variable "
                   f"and is ignored; {hint}",
    }


def unprefixed(known: Iterable[str]) -> dict[str, str]:
    """Each known variable by its name without its role's prefix (``command`` for
    launch_command), the launch role's first. Only names with an underscore or of 6 letters
    or more: short words (name, port, state) are too often a user's own variables."""
    found: dict[str, str] = {}
    names = sorted(known)
    for prefix in PREFIXES:
        for name in names:
            bare = name[len(prefix):]
            if name.startswith(prefix) and ("_" in bare or len(bare) >= 6):
                found.setdefault(bare, name)
    return found


@functools.lru_cache(maxsize=4)
def _index(known: frozenset[str]) -> tuple[list[str], dict[str, str]]:
    # Once per inventory check, not once per host.
    return sorted(known), unprefixed(known)


def lookalikes(host: str, names: Iterable[str], known: set[str]) -> list[dict[str, Any]]:
    """Warnings for the host's variables that torchfleet would silently ignore: names from
    guides (``rank``), a variable without its role's prefix (``command``) and misspelt
    torchfleet names (``launch_master_prot``)."""
    candidates, bare = _index(frozenset(known))
    warnings = []
    for name in sorted(set(names)):
        if name in known or _internal(name):
            continue
        if name in ALIASES:
            warnings.append(_warning([host], name, ALIASES[name]))
        elif name in bare:
            warnings.append(_warning([host], name, bare[name]))
        elif name.startswith(PREFIXES):
            close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.75)
            warnings.append(_warning([host], name, close[0] if close else None))
    return warnings


def merged(warnings: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One warning per variable and meaning, naming every host it is about (a group's
    variable is every node's)."""
    hosts: dict[tuple[str, str | None], list[str]] = {}
    for w in warnings:
        hosts.setdefault((w["variable"], w["meant"]), []).extend(w.get("hosts") or [w["host"]])
    return [_warning(h, name, meant) for (name, meant), h in hosts.items()]
