"""Choose the network interface Gloo must use on a node.

Gloo binds to the interface named in GLOO_SOCKET_IFNAME. Left to guess, it resolves the
hostname, which often gives 127.0.1.1 or docker0's 172.17.0.1 (the same on every node).
The right interface is the one the node routes MASTER_ADDR through; on the master
itself that route goes through ``lo``, so there it is the interface that owns the
address.
"""

from __future__ import annotations

import json
from typing import Any

from torchfleet.errors import InventoryError


def _load(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def gloo_interface(host: str, master_addr: str, ip_addr: Any, ip_route: Any) -> str:
    """Pick the interface from ``ip -j addr show`` and ``ip -j route get MASTER_ADDR``."""
    links = _load(ip_addr) or []
    for link in links:
        for info in link.get("addr_info", []):
            if info.get("local") == master_addr and link.get("ifname") != "lo":
                return link["ifname"]
    routes = _load(ip_route) or []
    if not routes:
        raise InventoryError(f"has no route to MASTER_ADDR {master_addr}", host, "launch_master_addr")
    dev = routes[0].get("dev")
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
