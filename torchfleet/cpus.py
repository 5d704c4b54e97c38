"""CPU pinning from a node's real topology.

The BigDL guide pins every node to the same hand-picked "--cpuset-cpus=20-24"; this
computes each rank's set from ``lscpu -p`` instead: whole physical cores, one
hyper-thread each unless asked otherwise, all from one NUMA node when they fit, never
shared between ranks, and never the CPUs reserved for the system.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Iterable

from torchfleet.errors import InventoryError


def parse_lscpu(text: str) -> list[dict[str, int]]:
    """Rows of ``lscpu -p=CPU,CORE,SOCKET,NODE`` (or plain ``lscpu -p``)."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split(",")
        cpu, core, socket = (int(f) for f in fields[:3])
        node = int(fields[3]) if len(fields) > 3 and fields[3] != "" else 0
        rows.append({"cpu": cpu, "core": core, "socket": socket, "node": node})
    if not rows:
        raise ValueError("no CPU rows in lscpu output")
    return rows


def parse_cpulist(text: str | Iterable[int] | None) -> list[int]:
    """``0-3,8,10-11`` to [0, 1, 2, 3, 8, 10, 11]."""
    if text is None or text == "":
        return []
    if not isinstance(text, str):
        return sorted({int(c) for c in text})
    cpus: set[int] = set()
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """[0, 1, 2, 3, 8] to ``0-3,8``."""
    cpus = sorted(set(cpus))
    parts, start = [], None
    for i, cpu in enumerate(cpus):
        if start is None:
            start = cpu
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            parts.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(parts)


def summary(topology: list[dict[str, int]]) -> dict[str, int]:
    cores = {(r["socket"], r["core"]) for r in topology}
    return {
        "cpus": len(topology),
        "cores": len(cores),
        "sockets": len({r["socket"] for r in topology}),
        "numa_nodes": len({r["node"] for r in topology}),
        "threads_per_core": max(1, len(topology) // max(1, len(cores))),
    }


def _cores(topology, allowed, reserved, use_hyperthreads):
    """Physical cores, in topology order: (node, [cpus usable on that core])."""
    cores: "OrderedDict[tuple[int, int], dict[str, Any]]" = OrderedDict()
    for row in sorted(topology, key=lambda r: r["cpu"]):
        key = (row["socket"], row["core"])
        cores.setdefault(key, {"node": row["node"], "cpus": []})["cpus"].append(row["cpu"])
    usable = []
    for core in cores.values():
        cpus = [c for c in core["cpus"] if (not allowed or c in allowed) and c not in reserved]
        # A core with a reserved sibling is the system's: sharing it would let the
        # system's work steal the rank's pipeline.
        if len(cpus) != len([c for c in core["cpus"] if not allowed or c in allowed]):
            continue
        if cpus:
            usable.append({"node": core["node"], "cpus": cpus if use_hyperthreads else cpus[:1]})
    return usable


def allocate(
    host: str,
    topology: list[dict[str, int]],
    ranks: int,
    cores_per_rank: int | None = None,
    use_hyperthreads: bool = False,
    reserved: Iterable[int] | str | None = None,
    allowed: Iterable[int] | str | None = None,
) -> list[dict[str, Any]]:
    """One entry per local rank: cpuset, cpuset_mems and omp_num_threads."""
    reserved_set = set(parse_cpulist(reserved))
    allowed_set = set(parse_cpulist(allowed))
    cores = _cores(topology, allowed_set, reserved_set, use_hyperthreads)
    facts = summary(topology)
    have = (
        f"the node has {facts['cores']} cores ({facts['cpus']} CPUs) on {facts['sockets']} socket(s) and "
        f"{facts['numa_nodes']} NUMA node(s); {len(cores)} cores are usable"
        + (f" after reserving CPUs {format_cpulist(reserved_set)}" if reserved_set else "")
    )
    if ranks < 1:
        raise InventoryError(f"needs at least one rank, got {ranks}", host, "torchfleet_procs_per_node")
    if cores_per_rank is None:
        cores_per_rank = len(cores) // ranks
        if cores_per_rank < 1:
            raise InventoryError(
                f"{ranks} ranks need a core each, but {have}", host, "torchfleet_procs_per_node")
    elif cores_per_rank * ranks > len(cores):
        raise InventoryError(
            f"cpu_pinning_cores_per_rank={cores_per_rank} for {ranks} ranks asks for "
            f"{cores_per_rank * ranks} cores, but {have}",
            host,
            "cpu_pinning_cores_per_rank",
        )

    free = list(cores)
    plan = []
    for _ in range(ranks):
        by_node: "OrderedDict[int, list]" = OrderedDict()
        for core in free:
            by_node.setdefault(core["node"], []).append(core)
        # The fullest-fitting NUMA node first keeps large nodes whole for later ranks.
        fitting = [cs for cs in by_node.values() if len(cs) >= cores_per_rank]
        if fitting:
            chosen = min(fitting, key=len)[:cores_per_rank]
        else:
            chosen = free[:cores_per_rank]
        for core in chosen:
            free.remove(core)
        cpus = [c for core in chosen for c in core["cpus"]]
        plan.append(
            {
                "cpuset": format_cpulist(cpus),
                "cpuset_mems": format_cpulist({core["node"] for core in chosen}),
                "omp_num_threads": len(chosen),
            }
        )
    return plan


def check_explicit(host: str, topology: list[dict[str, int]], cpusets: list[str], ranks: int) -> list[dict[str, Any]]:
    """Validate a user's per-rank cpusets against the topology."""
    if len(cpusets) != ranks:
        raise InventoryError(
            f"cpu_pinning_cpusets has {len(cpusets)} entries for {ranks} ranks", host, "cpu_pinning_cpusets")
    by_cpu = {r["cpu"]: r for r in topology}
    seen: dict[int, int] = {}
    plan = []
    for index, text in enumerate(cpusets):
        cpus = parse_cpulist(text)
        missing = [c for c in cpus if c not in by_cpu]
        if not cpus or missing:
            raise InventoryError(
                f"cpu_pinning_cpusets[{index}]={text!r} names CPUs {format_cpulist(missing) or '(none)'} "
                f"that the node lacks (it has {format_cpulist(by_cpu)})",
                host,
                "cpu_pinning_cpusets",
            )
        for c in cpus:
            if c in seen:
                raise InventoryError(
                    f"cpu_pinning_cpusets[{index}] and [{seen[c]}] share CPU {c}; ranks never share a core",
                    host,
                    "cpu_pinning_cpusets",
                )
            seen[c] = index
        plan.append(
            {
                "cpuset": format_cpulist(cpus),
                "cpuset_mems": format_cpulist({by_cpu[c]["node"] for c in cpus}),
                "omp_num_threads": len({(by_cpu[c]["socket"], by_cpu[c]["core"]) for c in cpus}),
            }
        )
    return plan
