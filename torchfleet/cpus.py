"""CPU pinning from a node's real topology.

The BigDL guide pins every node to the same hand-picked "--cpuset-cpus=20-24"; this
computes each rank's set from ``lscpu -p`` instead: whole physical cores, one
hyper-thread each unless asked otherwise, never shared between ranks, never offline,
outside the node's own affinity or reserved for the system. A rank's cores come from one
NUMA node when they fit, else from one socket and as few NUMA nodes as possible, else
from as few sockets as possible. Its memory nodes are the online memory nodes that hold
its CPUs and that the node's cgroup allows.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Mapping

from torchfleet.errors import InventoryError

CPULIST_RE = re.compile(r"^\d+(-\d+)?(,\d+(-\d+)?)*$")
# lscpu's parsable columns when its output has no header line.
DEFAULT_COLUMNS = ["CPU", "CORE", "SOCKET", "NODE"]


def parse_lscpu(text: str) -> list[dict[str, Any]]:
    """Rows of ``lscpu -p`` in any of its forms: plain, with named columns (``-p=...``), and
    ``--all``, where an offline CPU has empty fields or ONLINE=N. Unknown values (empty or
    "-") are None: a CPU whose Node field is empty belongs to no known NUMA node."""
    columns = DEFAULT_COLUMNS
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("#"):
            names = [n.strip().upper() for n in line[1:].split(",")]
            if names[0] == "CPU":
                columns = names
            continue
        if not line:
            continue
        fields = dict(zip(columns, line.split(",")))

        def value(name):
            text = fields.get(name, "").strip()
            return None if text in ("", "-") else int(text)

        online = fields.get("ONLINE", "Y").strip().upper() not in ("N", "NO")
        row = {"cpu": int(fields["CPU"]), "core": value("CORE"), "socket": value("SOCKET"),
               "node": value("NODE")}
        row["online"] = online and row["core"] is not None
        rows.append(row)
    if not rows:
        raise ValueError("no CPU rows in lscpu output")
    return rows


def parse_cpulist(text: str | Iterable[int] | None, host: str | None = None,
                  variable: str | None = None, label: str | None = None) -> list[int]:
    """``0-3,8,10-11`` to [0, 1, 2, 3, 8, 10, 11]; anything else is an input error naming
    ``host`` and ``variable`` (``label`` in the message, such as one entry of a list)."""
    if text is None or text == "":
        return []
    if not isinstance(text, str):
        return sorted({int(c) for c in text})
    compact = re.sub(r"\s+", "", text)
    bad = InventoryError(f"{label or variable} is {text!r}, which is not a CPU list such as '0-3,8'", host, variable)
    if not CPULIST_RE.match(compact):
        raise bad
    cpus: set[int] = set()
    for part in compact.split(","):
        lo, _, hi = part.partition("-")
        if hi and int(hi) < int(lo):
            raise bad
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


def summary(topology: list[dict[str, Any]]) -> dict[str, int]:
    """Counts of the online CPUs, their cores, sockets and known NUMA nodes."""
    online = [r for r in topology if r["online"]]
    cores: dict[tuple, int] = {}
    for r in online:
        cores[(r["socket"], r["core"])] = cores.get((r["socket"], r["core"]), 0) + 1
    return {
        "cpus": len(online),
        "cores": len(cores),
        "sockets": len({r["socket"] for r in online}),
        "numa_nodes": len({r["node"] for r in online if r["node"] is not None}),
        "threads_per_core": max(cores.values(), default=1),
    }


def _cores(topology, allowed, reserved, use_hyperthreads):
    """Usable physical cores in CPU order: socket, node and the CPUs a rank may use."""
    cores: dict[tuple, dict[str, Any]] = {}
    for row in sorted(topology, key=lambda r: r["cpu"]):
        if not row["online"]:
            continue
        core = cores.setdefault((row["socket"], row["core"]), {"socket": row["socket"], "node": row["node"], "all": []})
        core["all"].append(row["cpu"])
    usable = []
    for core in cores.values():
        mine = [c for c in core["all"] if not allowed or c in allowed]
        # A core with a reserved sibling is the system's: sharing it would let the
        # system's work steal the rank's pipeline.
        if not mine or any(c in reserved for c in mine):
            continue
        usable.append({"socket": core["socket"], "node": core["node"], "cpus": mine if use_hyperthreads else mine[:1]})
    return usable


def _node_key(core):
    # CPUs of no known node stay together by socket.
    return ("node", core["node"]) if core["node"] is not None else ("socket", core["socket"])


def _socket_key(core):
    return core["socket"]


def _groups(cores, key: Callable) -> list[list[dict]]:
    groups: dict[Any, list] = {}
    for core in cores:
        groups.setdefault(key(core), []).append(core)
    return list(groups.values())


def _take(cores, count, keys):
    """``count`` of ``cores``, spanning as few groups of each key (outermost first) as can be:
    one group where one fits (the fullest that fits, keeping larger ones for later ranks),
    else the largest groups whole and the rest from the one that fits it best."""
    if not keys or len(cores) == count:
        return cores[:count]
    groups = _groups(cores, keys[0])
    fitting = [g for g in groups if len(g) >= count]
    if fitting:
        return _take(min(fitting, key=len), count, keys[1:])
    chosen, rest, need = [], sorted(groups, key=len, reverse=True), count
    while need:
        fitting = [g for g in rest if len(g) >= need]
        if fitting:
            return chosen + _take(min(fitting, key=len), need, keys[1:])
        group = rest.pop(0)
        chosen += group
        need -= len(group)
    return chosen


def _memory(rows, memory_nodes, mems_allowed) -> str:
    """The memory nodes of a rank: those holding its CPUs, online with memory, and allowed."""
    nodes = {r["node"] for r in rows if r["node"] is not None}
    if memory_nodes is not None:
        nodes &= set(memory_nodes)
    if mems_allowed is not None:
        nodes &= set(mems_allowed)
    return format_cpulist(nodes)


def _node_list(text, host, variable):
    return None if text is None else parse_cpulist(text, host, variable)


def allocate(
    host: str,
    topology: list[dict[str, Any]],
    ranks: int,
    cores_per_rank: int | None = None,
    use_hyperthreads: bool = False,
    reserved: Iterable[int] | str | None = None,
    allowed: Iterable[int] | str | None = None,
    memory_nodes: Iterable[int] | str | None = None,
    mems_allowed: Iterable[int] | str | None = None,
) -> list[dict[str, Any]]:
    """One entry per local rank: cpuset, cpuset_mems ("" binds no memory) and omp_num_threads.

    ``allowed`` is the node's own affinity, ``memory_nodes`` its online memory nodes and
    ``mems_allowed`` its cgroup's memory nodes; None means not known, so not limiting.
    """
    if ranks < 1:
        raise InventoryError(f"needs at least one rank, got {ranks}", host, "torchfleet_procs_per_node")
    if cores_per_rank is not None and cores_per_rank < 1:
        raise InventoryError(
            f"cpu_pinning_cores_per_rank={cores_per_rank} must be 1 or more (0 in the role splits the cores evenly)",
            host, "cpu_pinning_cores_per_rank")
    reserved_set = set(parse_cpulist(reserved, host, "cpu_pinning_reserved_cpus"))
    allowed_set = set(parse_cpulist(allowed, host, "allowed CPUs"))
    memory = _node_list(memory_nodes, host, "memory nodes")
    mems = _node_list(mems_allowed, host, "cgroup memory nodes")
    cores = _cores(topology, allowed_set, reserved_set, use_hyperthreads)
    facts = summary(topology)
    have = (
        f"the node has {facts['cores']} cores ({facts['cpus']} CPUs) on {facts['sockets']} socket(s) and "
        f"{facts['numa_nodes']} NUMA node(s); {len(cores)} cores are usable"
        + (f" after reserving CPUs {format_cpulist(reserved_set)}" if reserved_set else "")
    )
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

    by_cpu = {r["cpu"]: r for r in topology}
    free = list(cores)
    plan = []
    for _ in range(ranks):
        in_node = [g for g in _groups(free, _node_key) if len(g) >= cores_per_rank]
        if in_node:
            chosen = _take(min(in_node, key=len), cores_per_rank, [_socket_key])
        else:
            chosen = _take(free, cores_per_rank, [_socket_key, _node_key])
        for core in chosen:
            free.remove(core)
        cpus = sorted(c for core in chosen for c in core["cpus"])
        plan.append(
            {
                "cpuset": format_cpulist(cpus),
                "cpuset_mems": _memory([by_cpu[c] for c in cpus], memory, mems),
                # One OpenMP thread per CPU: with hyper-threads, every sibling works.
                "omp_num_threads": len(cpus),
            }
        )
    return plan


def check_explicit(
    host: str,
    topology: list[dict[str, Any]],
    cpusets: list[str],
    ranks: int,
    allowed: Iterable[int] | str | None = None,
    reserved: Iterable[int] | str | None = None,
    memory_nodes: Iterable[int] | str | None = None,
    mems_allowed: Iterable[int] | str | None = None,
) -> list[dict[str, Any]]:
    """Validate a user's per-rank cpusets against the topology and the node's limits: every
    CPU online, allowed and not reserved, and no physical core in two ranks' sets."""
    variable = "cpu_pinning_cpusets"
    if len(cpusets) != ranks:
        raise InventoryError(f"{variable} has {len(cpusets)} entries for {ranks} ranks", host, variable)
    allowed_set = set(parse_cpulist(allowed, host, "allowed CPUs"))
    reserved_set = set(parse_cpulist(reserved, host, "cpu_pinning_reserved_cpus"))
    memory = _node_list(memory_nodes, host, "memory nodes")
    mems = _node_list(mems_allowed, host, "cgroup memory nodes")
    by_cpu = {r["cpu"]: r for r in topology}
    owner: dict[tuple, tuple[int, int]] = {}
    plan = []
    for index, text in enumerate(cpusets):
        name = f"{variable}[{index}]"
        cpus = parse_cpulist(text, host, variable, name)

        def refuse(bad, why):
            raise InventoryError(f"{name}={text!r} names CPUs {format_cpulist(bad) or '(none)'} {why}", host, variable)

        missing = [c for c in cpus if c not in by_cpu]
        if not cpus or missing:
            refuse(missing, f"that the node lacks (it has {format_cpulist(by_cpu)})")
        if offline := [c for c in cpus if not by_cpu[c]["online"]]:
            refuse(offline, "that are offline on the node")
        if allowed_set and (outside := [c for c in cpus if c not in allowed_set]):
            refuse(outside, f"outside the CPUs the node lets processes use ({format_cpulist(allowed_set)})")
        if taken := [c for c in cpus if c in reserved_set]:
            refuse(taken, "that cpu_pinning_reserved_cpus leaves to the system")
        for c in cpus:
            core = (by_cpu[c]["socket"], by_cpu[c]["core"])
            other, other_cpu = owner.get(core, (index, c))
            if other != index:
                what = f"CPU {c}; ranks" if other_cpu == c else f"a physical core (CPUs {c} and {other_cpu}), and ranks"
                raise InventoryError(f"{name} and [{other}] share {what} never share a core", host, variable)
            owner.setdefault(core, (index, c))
        plan.append(
            {
                "cpuset": format_cpulist(cpus),
                "cpuset_mems": _memory([by_cpu[c] for c in cpus], memory, mems),
                # The user chose every CPU in the set, so each gets a thread.
                "omp_num_threads": len(cpus),
            }
        )
    return plan


# The cpu_pinning role's variables (roles/cpu_pinning/defaults says what each means), which
# the launch reads to plan the pinning (launch_input, then launch_spec).
PINNING_VARIABLES = ("cpu_pinning_enabled", "cpu_pinning_use_hyperthreads", "cpu_pinning_cores_per_rank",
                     "cpu_pinning_reserved_cpus", "cpu_pinning_cpusets")


def settings(values: Mapping[str, Any], host: str) -> dict[str, Any]:
    """A node's pinning settings from its (templated, type-checked) cpu_pinning variables;
    a negative core count is refused, naming the host."""
    cores = int(values.get("cpu_pinning_cores_per_rank") or 0)
    if cores < 0:
        raise InventoryError(f"cpu_pinning_cores_per_rank={cores} must be 0 (split the cores evenly) or more",
                             host, "cpu_pinning_cores_per_rank")
    return {"enabled": bool(values.get("cpu_pinning_enabled", True)),
            "use_hyperthreads": bool(values.get("cpu_pinning_use_hyperthreads")), "cores_per_rank": cores,
            "reserved": str(values.get("cpu_pinning_reserved_cpus") or ""),
            "cpusets": [str(c) for c in values.get("cpu_pinning_cpusets") or []]}


def plan(host: str, topology: Mapping[str, Any], ranks: int, pinning: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each local rank's cpuset, memory nodes and threads, from a node's readings
    (``topology``: lscpu's table, its allowed CPUs and memory nodes) and its ``settings``;
    empty when pinning is off."""
    if not pinning.get("enabled", True):
        return []
    table = parse_lscpu(topology["lscpu"])
    limits = {"allowed": topology.get("allowed"), "memory_nodes": topology.get("memory_nodes"),
              "mems_allowed": topology.get("mems_allowed")}
    if pinning.get("cpusets"):
        return check_explicit(host, table, list(pinning["cpusets"]), ranks, reserved=pinning.get("reserved"), **limits)
    return allocate(host, table, ranks, cores_per_rank=pinning.get("cores_per_rank") or None,
                    use_hyperthreads=bool(pinning.get("use_hyperthreads")), reserved=pinning.get("reserved"), **limits)
