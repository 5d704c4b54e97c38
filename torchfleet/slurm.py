"""What the slurm role writes into slurm.conf, from the inventory and each node's readings.

slurmd compares the hardware a node line claims with what it finds itself (hwloc: the
CPUs its cpuset allows; sysconf: the physical memory), and slurmctld drains a node that
claims more than it has. So each line is computed from the node's own readings, counted
the way slurmd counts: sockets, cores per socket as whole cores over sockets, threads per
core as CPUs over cores, and memory in MiB rounded down.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping

from torchfleet import cpus, ranks
from torchfleet.errors import InventoryError

CONTROLLER_VAR = "slurm_controller"
# Slurm's own rule for ClusterName (lower case, as slurmctld folds it) and partition names.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
# Node states (sinfo %T) in which a node serves jobs; anything else (down, drained, not
# responding, unknown) means the node is not ready.
SERVING = {"idle", "allocated", "mixed", "completing"}


def controller(hosts: Iterable[Mapping[str, Any]], chosen: str | None = None) -> str:
    """The host that runs slurmctld: ``chosen`` (slurm_controller) when set, else the master,
    node rank 0 in the launch's order. Each host mapping has ``name`` and optionally
    ``node_rank`` (torchfleet_node_rank)."""
    order = ranks.node_order(hosts)
    names = [h["name"] for h in order]
    if chosen in (None, ""):
        return names[0]
    if chosen not in names:
        raise InventoryError(
            f"{CONTROLLER_VAR}={chosen!r} is not one of the Slurm nodes ({', '.join(names)})",
            None, CONTROLLER_VAR)
    return str(chosen)


def check_names(cluster_name: str, partition: str) -> None:
    """Refuse a cluster or partition name that Slurm would reject or rewrite."""
    for variable, value in (("slurm_cluster_name", cluster_name), ("slurm_partition", partition)):
        if not NAME_RE.match(str(value)):
            raise InventoryError(
                f"{variable}={value!r} must be lower-case letters, digits, '-' or '_', starting with a "
                "letter or digit, at most 40 characters", None, variable)


def memory_mib(meminfo: str, host: str | None = None) -> int:
    """MemTotal of ``/proc/meminfo`` in MiB, rounded down, as slurmd reads RealMemory."""
    match = re.search(r"^MemTotal:\s+(\d+)\s+kB", meminfo, re.MULTILINE)
    if not match:
        raise InventoryError("its /proc/meminfo has no MemTotal line", host, "slurm_memory_reserve_mib")
    return int(match.group(1)) // 1024


def hardware(host: str, lscpu: str, meminfo: str, allowed: Iterable[int] | None = None,
             reserve_mib: int = 0) -> dict[str, int]:
    """A node's CPUs, Sockets, CoresPerSocket, ThreadsPerCore and RealMemory, from its
    ``lscpu -p`` table, the CPUs it lets processes use (``allowed``: none means all) and
    ``/proc/meminfo``; ``reserve_mib`` is kept back from RealMemory."""
    allowed_set = set(allowed or [])
    rows = [r for r in cpus.parse_lscpu(lscpu) if r["online"] and (not allowed_set or r["cpu"] in allowed_set)]
    if not rows:
        raise InventoryError("has no online CPU it may use", host, "slurm_group")
    cores = {(r["socket"], r["core"]) for r in rows}
    sockets = {r["socket"] for r in rows}
    real = memory_mib(meminfo, host) - int(reserve_mib)
    if real < 1:
        raise InventoryError(f"slurm_memory_reserve_mib={reserve_mib} leaves no memory for jobs "
                             f"(the node has {memory_mib(meminfo, host)} MiB)", host, "slurm_memory_reserve_mib")
    per_socket = max(1, len(cores) // len(sockets))
    threads = max(1, len(rows) // len(cores))
    # slurmctld replaces a CPUs that is not the product; on a node whose sockets or cores
    # differ (some CPUs offline) the product under-claims, which Slurm accepts, never over.
    return {"cpus": len(sockets) * per_socket * threads, "sockets": len(sockets), "cores_per_socket": per_socket,
            "threads_per_core": threads, "real_memory": real}


def node_line(node: Mapping[str, Any]) -> str:
    """A NodeName line of slurm.conf from a node of ``conf_nodes``."""
    return (f"NodeName={node['hostname']} NodeAddr={node['address']} CPUs={node['cpus']} "
            f"Sockets={node['sockets']} CoresPerSocket={node['cores_per_socket']} "
            f"ThreadsPerCore={node['threads_per_core']} RealMemory={node['real_memory']} State=UNKNOWN")


def conf_nodes(nodes: Iterable[Mapping[str, Any]], chosen: str | None = None, reserve_mib: int = 0) -> dict[str, Any]:
    """The controller and node lines of slurm.conf.

    Each node has ``name`` (inventory name), ``node_rank`` (or None), ``hostname`` (the
    short name slurmd knows itself by), ``address`` (its cluster address), ``lscpu``,
    ``allowed`` and ``meminfo`` (its readings). Returns ``controller`` (name, hostname,
    address), ``nodes`` (each with its hardware), ``lines`` and ``node_list``.
    """
    nodes = [dict(n) for n in nodes]
    name = controller(nodes, chosen)
    seen: dict[str, str] = {}
    out = []
    for node in ranks.node_order(nodes):
        host = node["name"]
        if not node.get("hostname"):
            raise InventoryError("has no hostname in its facts (ansible_hostname)", host, "slurm_group")
        if node["hostname"] in seen:
            raise InventoryError(f"has the hostname {node['hostname']!r}, as {seen[node['hostname']]} does; "
                                 "slurmd finds its node line by hostname, so each needs its own", host, "slurm_group")
        seen[node["hostname"]] = host
        out.append({"name": host, "hostname": node["hostname"], "address": node["address"],
                    **hardware(host, node["lscpu"], node["meminfo"], node.get("allowed"), reserve_mib)})
    head = next(n for n in out if n["name"] == name)
    return {
        "controller": {"name": name, "hostname": head["hostname"], "address": head["address"]},
        "nodes": out,
        "lines": [node_line(n) for n in out],
        "node_list": ",".join(n["hostname"] for n in out),
    }


def unready(sinfo: str, hostnames: Iterable[str]) -> dict[str, str]:
    """The nodes of ``hostnames`` that do not serve jobs, with their state, from
    ``sinfo -h -N -o '%N %T'`` (a node in several partitions is listed once per partition);
    a node sinfo does not list is "missing"."""
    states: dict[str, str] = {}
    for line in sinfo.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            states[fields[0]] = fields[1].lower()
    return {h: states.get(h, "missing") for h in hostnames if states.get(h, "missing") not in SERVING}
