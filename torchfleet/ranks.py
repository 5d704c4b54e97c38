"""The rank table: which process gets which rank on which node, and its environment.

Everything here is pure so it can run on the controller before any node is changed.
"""

from __future__ import annotations

import ipaddress
from typing import Any, Iterable, Mapping

from torchfleet.errors import InventoryError

NODE_RANK_VAR = "torchfleet_node_rank"
PROCS_VAR = "torchfleet_procs_per_node"
ADDRESS_VAR = "torchfleet_cluster_address"
NETWORK_VAR = "torchfleet_cluster_network"
PORT_VAR = "launch_master_port"


def _int(value: Any, host: str | None, variable: str, minimum: int) -> int:
    # bool is an int in Python; True as a rank is always a typo.
    if isinstance(value, bool):
        raise InventoryError(f"{variable} must be an integer, got {value!r}", host, variable)
    try:
        number = int(str(value).strip())
    except ValueError:
        raise InventoryError(f"{variable} must be an integer, got {value!r}", host, variable) from None
    if number < minimum:
        raise InventoryError(f"{variable} must be >= {minimum}, got {number}", host, variable)
    return number


def master_port(value: Any) -> int:
    port = _int(value, None, PORT_VAR, 1)
    if port > 65535:
        raise InventoryError(f"{PORT_VAR}={port} is not a TCP port (1-65535)", None, PORT_VAR)
    return port


def node_order(hosts: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Order nodes by explicit node rank, or by inventory order when none is set.

    Each host mapping has ``name`` and optionally ``node_rank``.
    """
    hosts = [dict(h) for h in hosts]
    if not hosts:
        raise InventoryError("the launch group has no hosts, so there is no master (node rank 0)")
    names = [h["name"] for h in hosts]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise InventoryError(f"hosts listed twice: {', '.join(dup)}")
    explicit = [h for h in hosts if h.get("node_rank") not in (None, "")]
    if not explicit:
        return [dict(h, node_rank=i) for i, h in enumerate(hosts)]
    if len(explicit) != len(hosts):
        missing = [h["name"] for h in hosts if h.get("node_rank") in (None, "")]
        raise InventoryError(
            f"{NODE_RANK_VAR} is set on {', '.join(h['name'] for h in explicit)} but not on "
            f"{', '.join(missing)}: set it on every host of the group or on none",
            missing[0],
            NODE_RANK_VAR,
        )
    seen: dict[int, str] = {}
    for h in hosts:
        rank = _int(h["node_rank"], h["name"], NODE_RANK_VAR, 0)
        if rank in seen:
            raise InventoryError(
                f"{NODE_RANK_VAR}={rank} is also set on {seen[rank]}; every node needs its own rank",
                h["name"],
                NODE_RANK_VAR,
            )
        seen[rank] = h["name"]
        h["node_rank"] = rank
    wanted = set(range(len(hosts)))
    if set(seen) != wanted:
        missing = sorted(wanted - set(seen))
        extra = sorted(set(seen) - wanted)
        what = "no master: nothing has node rank 0" if 0 in missing else f"node ranks {missing} are missing"
        raise InventoryError(
            f"{what}; {NODE_RANK_VAR} must run 0..{len(hosts) - 1} without gaps "
            f"(out of range: {', '.join(f'{seen[r]}={r}' for r in extra)})",
            seen[extra[0]] if extra else None,
            NODE_RANK_VAR,
        )
    return sorted(hosts, key=lambda h: h["node_rank"])


def cluster_address(
    host: str,
    explicit: str | None = None,
    network: str | None = None,
    ansible_host: str | None = None,
    ipv4_addresses: Iterable[str] = (),
    default_ipv4: str | None = None,
) -> dict[str, str]:
    """Pick the address other nodes use to reach ``host``.

    Order: an explicit address, the node's address inside the cluster network, the
    address Ansible connects to (when it is an IP of the node), the default route's
    address. Loopback is always refused: a hostname that resolves to 127.0.1.1 is the
    classic reason a job hangs at init_process_group.
    """
    ipv4_addresses = [a for a in ipv4_addresses if a]
    candidates: list[tuple[str, str]] = []
    if explicit:
        candidates.append((str(explicit), ADDRESS_VAR))
    elif network:
        try:
            net = ipaddress.ip_network(str(network), strict=False)
        except ValueError as exc:
            raise InventoryError(f"{NETWORK_VAR}={network!r} is not a network: {exc}", host, NETWORK_VAR) from None
        inside = [a for a in ipv4_addresses if ipaddress.ip_address(a) in net]
        if not inside:
            raise InventoryError(
                f"no address of this node is inside {NETWORK_VAR}={network} "
                f"(it has {', '.join(ipv4_addresses) or 'none'})",
                host,
                NETWORK_VAR,
            )
        candidates.append((inside[0], NETWORK_VAR))
    else:
        if ansible_host and _is_ip(ansible_host) and ansible_host in ipv4_addresses:
            candidates.append((ansible_host, "ansible_host"))
        if default_ipv4:
            candidates.append((default_ipv4, "ansible_default_ipv4"))
    if not candidates:
        raise InventoryError(
            f"cannot tell this node's cluster address; set {ADDRESS_VAR} or {NETWORK_VAR}", host, ADDRESS_VAR
        )
    address, source = candidates[0]
    if not _is_ip(address):
        raise InventoryError(f"{ADDRESS_VAR}={address!r} is not an IP address", host, ADDRESS_VAR)
    if ipaddress.ip_address(address).is_loopback:
        raise InventoryError(
            f"cluster address {address} (from {source}) is a loopback address, which other nodes "
            f"cannot reach; set {ADDRESS_VAR} or {NETWORK_VAR}",
            host,
            ADDRESS_VAR if source == ADDRESS_VAR else NETWORK_VAR,
        )
    return {"address": address, "source": source}


def cluster_address_of(host: str, host_vars: Mapping[str, Any]) -> str:
    """cluster_address from a node's Ansible variables and facts."""
    default = host_vars.get("ansible_default_ipv4") or {}
    return cluster_address(
        host,
        explicit=host_vars.get(ADDRESS_VAR),
        network=host_vars.get(NETWORK_VAR),
        ansible_host=host_vars.get("ansible_host"),
        ipv4_addresses=host_vars.get("ansible_all_ipv4_addresses") or [],
        default_ipv4=default.get("address"),
    )["address"]


def likely_master(names: Iterable[str], node_ranks: Mapping[str, Any]) -> str | None:
    """The node a launch from this inventory makes the master (node rank 0): the one a status
    or a stop asks first. None where the inventory cannot say (its node ranks are set on some
    hosts only, or twice), and every node is asked."""
    try:
        return node_order([{"name": n, "node_rank": node_ranks.get(n)} for n in names])[0]["name"]
    except InventoryError:
        return None


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(str(text))
    except ValueError:
        return False
    return True


def rank_table(hosts: Iterable[Mapping[str, Any]], port: Any = 29500) -> dict[str, Any]:
    """Build the rank table.

    Each host mapping has ``name``, ``address``, and optionally ``node_rank`` and
    ``procs`` (processes on that node, default 1). Global ranks are numbered node by
    node, so node 0 holds rank 0, the master.
    """
    nodes = node_order(hosts)
    port = master_port(port)
    ranks: list[dict[str, Any]] = []
    for node in nodes:
        name = node["name"]
        procs = _int(node.get("procs", 1) if node.get("procs") not in (None, "") else 1, name, PROCS_VAR, 1)
        if not node.get("address"):
            raise InventoryError("has no cluster address", name, ADDRESS_VAR)
        for local in range(procs):
            ranks.append(
                {
                    "rank": len(ranks),
                    "host": name,
                    "address": node["address"],
                    "node_rank": node["node_rank"],
                    "local_rank": local,
                    "local_world_size": procs,
                }
            )
    master = nodes[0]
    return {
        "master_host": master["name"],
        "master_addr": master["address"],
        "master_port": port,
        "world_size": len(ranks),
        "num_nodes": len(nodes),
        "ranks": ranks,
    }


# What the launch sets for every rank (torchfleet.spec); neither launch_extra_env nor
# launch_secret_env may change it.
RANK_ENV_NAMES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                  "NODE_RANK", "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")
