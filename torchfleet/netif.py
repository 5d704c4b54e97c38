"""Choose the network interface Gloo must use on a node.

Gloo binds to the interface named in GLOO_SOCKET_IFNAME. Left to guess, it resolves the
hostname, which often gives 127.0.1.1 or docker0's 172.17.0.1 (the same on every node).
The right interface is the one the node routes MASTER_ADDR through; on the master
itself that route goes through ``lo``, so there it is the interface that owns the
address.

The node's routing tables are read once, before MASTER_ADDR is known (node_probe), and the
route is looked up here as ``ip route get`` would under the kernel's default rules: the
local table, then main, then default, the longest prefix and then the lowest metric in
each. Policy rules beyond those are not followed.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from torchfleet.errors import InventoryError


def _load(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


# The tables the kernel's default rules look up, in their order (ip rule show).
_TABLES = ("local", "main", "default")


def route_device(ip_routes: Any, address: str) -> str | None:
    """The device ``ip route get ADDRESS`` would name, from ``ip -j route show table all``
    (node_probe's ``routes``, each with its ``family``, 4 or 6):
    ``lo`` for a local address, None where no route leads there (or it is unreachable,
    blackholed or prohibited). A ``throw`` route sends the lookup on to the next table."""
    target = ipaddress.ip_address(address)
    for table in _TABLES:
        best = None
        for route in _load(ip_routes) or []:
            if route.get("table", "main") != table:
                continue
            dst = route.get("dst", "default")
            if route.get("family", target.version) != target.version:
                continue
            try:
                network = ipaddress.ip_network(("0.0.0.0/0" if target.version == 4 else "::/0")
                                               if dst == "default" else dst, strict=False)
            except ValueError:
                continue
            if network.version != target.version or target not in network:
                continue
            key = (network.prefixlen, -int(route.get("metric", 0)))
            if best is None or key > best[0]:
                best = (key, route)
        if best is None:
            continue
        route = best[1]
        kind = route.get("type", "unicast")
        if kind == "throw":
            continue
        if kind == "local":
            return "lo"
        if kind != "unicast":
            return None
        return route.get("dev") or next((hop.get("dev") for hop in route.get("nexthops") or []), None)
    return None


def gloo_interface(host: str, master_addr: str, ip_addr: Any, ip_routes: Any) -> str:
    """Pick the interface from ``ip -j addr show`` and ``ip -j route show table all``."""
    links = _load(ip_addr) or []
    for link in links:
        for info in link.get("addr_info", []):
            if info.get("local") == master_addr and link.get("ifname") != "lo":
                return link["ifname"]
    dev = route_device(ip_routes, master_addr)
    if dev is None:
        raise InventoryError(f"has no route to MASTER_ADDR {master_addr}", host, "launch_master_addr")
    if not dev or dev == "lo":
        raise InventoryError(
            f"routes MASTER_ADDR {master_addr} through loopback; the master's address must be "
            "a cluster address, not a local alias",
            host,
            "torchfleet_cluster_address",
        )
    return dev


def address_network(host: str, address: str, ip_addr: Any) -> str:
    """The network (CIDR) that ``address`` sits in on this node, from ``ip -j addr show``.

    Open MPI's out-of-band channel wants it (oob_tcp_if_include): left alone, it may pick
    docker0, whose 172.17.0.1 every node shares.
    """
    import ipaddress

    for link in _load(ip_addr) or []:
        for info in link.get("addr_info", []):
            if info.get("local") == address:
                return str(ipaddress.ip_interface(f"{address}/{info['prefixlen']}").network)
    raise InventoryError(f"has no interface holding {address}", host, "torchfleet_cluster_address")
