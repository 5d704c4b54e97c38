"""The WireGuard overlay's addresses, and what the launch's reachability probe found.

Everything here is pure, so it runs on the controller and is unit-tested. Addresses are
allocated once and then kept in a state file on the controller, keyed by inventory
hostname: a node keeps its overlay address when the inventory's order or the ranks change.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any, Iterable, Mapping

from torchfleet.errors import InventoryError

NETWORK_VAR = "overlay_network"
ADDRESS_VAR = "overlay_address"
TRANSPORT_VAR = "launch_transport"


def _network(network: Any) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(str(network), strict=True)
    except ValueError as exc:
        raise InventoryError(f"{NETWORK_VAR}={network!r} is not a network in CIDR form: {exc}",
                             None, NETWORK_VAR) from None
    if net.version != 4:
        raise InventoryError(f"{NETWORK_VAR}={network} must be an IPv4 network", None, NETWORK_VAR)
    if net.num_addresses < 4:
        raise InventoryError(f"{NETWORK_VAR}={network} is too small; use /30 or larger", None, NETWORK_VAR)
    return net


def _usable(net: ipaddress.IPv4Network, address: Any) -> bool:
    """Whether ``address`` is a host address of ``net`` (not its network or broadcast address)."""
    try:
        ip = ipaddress.ip_address(str(address))
    except ValueError:
        return False
    return ip in net and ip not in (net.network_address, net.broadcast_address)


def allocate(network: Any, hosts: Iterable[str], explicit: Mapping[str, Any] | None = None,
             previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Give every host an overlay address; return the new state ``{network, addresses}``.

    ``explicit`` holds the hosts' ``overlay_address`` variables (empty values are ignored),
    ``previous`` the state file's ``addresses``. An explicit address always wins; then a
    host keeps its previous address when it is still inside ``network`` and nobody else
    claims it; the remaining hosts get the lowest free addresses, in name order, so the
    result never depends on the inventory's order. Hosts that left the inventory keep
    their entry, so a node that comes back gets its old address and nobody else takes it.
    """
    net = _network(network)
    hosts = list(hosts)
    if len(set(hosts)) != len(hosts):
        dup = sorted({h for h in hosts if hosts.count(h) > 1})
        raise InventoryError(f"hosts listed twice: {', '.join(dup)}", dup[0], None)
    explicit = {h: str(a).strip() for h, a in (explicit or {}).items() if h in hosts and a not in (None, "")}
    taken: dict[str, str] = {}
    for host in sorted(explicit):
        address = explicit[host]
        if not _usable(net, address):
            raise InventoryError(
                f"{ADDRESS_VAR}={address!r} is not a host address inside {NETWORK_VAR}={net}", host, ADDRESS_VAR)
        if address in taken:
            raise InventoryError(f"{ADDRESS_VAR}={address} is also set on {taken[address]}; every node needs "
                                 "its own overlay address", host, ADDRESS_VAR)
        taken[address] = host

    result: dict[str, str] = {h: a for a, h in taken.items()}
    old = {str(h): str(a) for h, a in (previous or {}).items()}
    # Current hosts first, so a host that left cannot keep an address a present host had.
    for host in sorted(old, key=lambda h: (h not in hosts, h)):
        address = old[host]
        if host in result or not _usable(net, address) or address in taken:
            continue
        taken[address] = host
        result[host] = address
    free = (str(ip) for ip in net.hosts() if str(ip) not in taken)
    for host in sorted(h for h in hosts if h not in result):
        address = next(free, None)
        if address is None:
            raise InventoryError(f"{NETWORK_VAR}={net} has no free address left for this node "
                                 f"({len(taken)} are allocated); choose a larger network", host, NETWORK_VAR)
        taken[address] = host
        result[host] = address
    return {"network": str(net), "addresses": dict(sorted(result.items()))}


def check_endpoints(network: Any, endpoints: Mapping[str, Any]) -> str:
    """Refuse an overlay network that holds a node's cluster address (its WireGuard endpoint).

    Its encrypted packets would then be routed into the overlay itself. Returns the network.
    """
    net = _network(network)
    for host, address in sorted(endpoints.items()):
        try:
            inside = ipaddress.ip_address(str(address)) in net
        except ValueError:
            raise InventoryError(f"endpoint {address!r} is not an IP address", host, "overlay_endpoint") from None
        if inside:
            raise InventoryError(
                f"its cluster address {address} lies inside {NETWORK_VAR}={net}; the overlay needs a "
                "network of its own", host, NETWORK_VAR)
    return str(net)


def load_state(text: Any) -> dict[str, Any]:
    """The state file's content; empty or missing means no allocation yet."""
    if text in (None, "") or (isinstance(text, list) and not text):
        return {"network": None, "addresses": {}}
    data = json.loads(text) if isinstance(text, str) else dict(text)
    addresses = data.get("addresses") or {}
    if not isinstance(addresses, Mapping):
        raise InventoryError("the overlay state file's addresses must be a mapping", None, "overlay_state_dir")
    return {"network": data.get("network"), "addresses": dict(addresses)}


def interface_address(host: str, interface: str, ip_addr: Any) -> str:
    """The overlay address of ``interface`` from ``ip -j addr show``; fails naming the host when it is down."""
    links = json.loads(ip_addr) if isinstance(ip_addr, str) else (ip_addr or [])
    link = next((item for item in links if item.get("ifname") == interface), None)
    if link is None:
        raise InventoryError(f"the overlay interface {interface} does not exist (the overlay is down); "
                             "run site.yml to bring it back", host, TRANSPORT_VAR)
    if "UP" not in link.get("flags", []):
        raise InventoryError(f"the overlay interface {interface} is down; run site.yml to bring it back",
                             host, TRANSPORT_VAR)
    inet = [info["local"] for info in link.get("addr_info", []) if info.get("family") == "inet"]
    if not inet:
        raise InventoryError(f"the overlay interface {interface} has no IPv4 address; run site.yml",
                             host, TRANSPORT_VAR)
    return inet[0]


def unreachable_pairs(results: Mapping[str, Mapping[str, Any]], max_age: int) -> list[str]:
    """The node pairs that cannot talk over the overlay, one sentence each, sorted.

    ``results`` maps each node to its probe result: ``peers`` maps every other node to
    ``{configured, handshake_age, connected, error}``. A pair works only when the node has
    the peer configured, has had a handshake with it within ``max_age`` seconds and opened
    a TCP connection to it over the overlay.
    """
    problems = []
    hosts = sorted(results)
    for host in hosts:
        peers = results[host].get("peers") or {}
        for peer in hosts:
            if peer == host:
                continue
            seen = peers.get(peer)
            if not seen or not seen.get("configured"):
                problems.append(f"{host} -> {peer}: {peer} is not a WireGuard peer of {host} (run site.yml)")
                continue
            why = []
            age = seen.get("handshake_age")
            if age is None:
                why.append("no WireGuard handshake ever")
            elif int(age) > max_age:
                why.append(f"last WireGuard handshake {int(age)} s ago (more than {max_age} s)")
            if not seen.get("connected"):
                why.append(f"TCP over the overlay failed ({seen.get('error') or 'no connection'})")
            if why:
                problems.append(f"{host} -> {peer}: " + "; ".join(why))
    return problems
