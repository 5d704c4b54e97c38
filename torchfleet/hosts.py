"""The inventory hosts torchfleet runs on, and whether two of them are one machine.

Two inventory names for one machine would both get ranks, ports and run folders there,
while the machine meant by one of them gets nothing. This runs on the controller before any
node changes: first on the addresses Ansible connects to, then on what each node says of
itself (node_probe's ``identity``).
"""

from __future__ import annotations

import socket
from typing import Any, Callable, Hashable, Mapping, Sequence

from torchfleet.errors import InventoryError

# Ansible's groups that every inventory has, whatever it holds.
IMPLICIT_GROUPS = ("all", "ungrouped")
_SSH = {"ssh", "paramiko", "paramiko_ssh", "smart", "ansible.builtin.ssh", "ansible.builtin.paramiko_ssh",
        "ansible.legacy.ssh"}
_LOCAL = {"local", "ansible.builtin.local", "ansible.legacy.local"}


def group_hosts(groups: Mapping[str, Sequence[str]], wanted: str) -> list[str]:
    """The hosts of the group torchfleet runs on (launch_hosts_group), or InventoryError
    saying that it is missing or empty and naming the groups the inventory has."""
    hosts = list(groups.get(wanted) or [])
    if hosts:
        return hosts
    found = sorted(g for g in groups if g not in IMPLICIT_GROUPS)
    listed = f"the groups found: {', '.join(found)}" if found else "the inventory has no group at all"
    what = (f"the inventory's group {wanted} has no hosts" if wanted in groups
            else f"the inventory has no group {wanted}")
    raise InventoryError(f"{what}; torchfleet runs on the hosts of that group (launch_hosts_group names another); "
                         f"{listed}", None, "launch_hosts_group")


def _resolve(address: str) -> frozenset[str]:
    """Every address a name resolves to, or the name itself where it does not resolve."""
    try:
        return frozenset(info[4][0] for info in socket.getaddrinfo(address, None, proto=socket.IPPROTO_TCP))
    except (socket.gaierror, UnicodeError):
        return frozenset({address})


def connection_target(host: str, variables: Mapping[str, Any]) -> tuple[str, frozenset[str], str]:
    """Where Ansible's connection to ``host`` goes: its kind, the addresses (resolved) and
    the port. Every local connection is this controller's."""
    connection = str(variables.get("ansible_connection") or "ssh")
    if connection in _LOCAL:
        return "local", frozenset({"localhost"}), ""
    address = str(variables.get("ansible_host") or host)
    if connection in _SSH:
        return "ssh", _resolve(address), str(variables.get("ansible_port") or 22)
    return connection, frozenset({address}), str(variables.get("ansible_port") or "")


def _shared(keys: Mapping[str, Sequence[Hashable]]) -> list[list[str]]:
    """Hosts that share a key, each set once, in inventory order."""
    by_key: dict[Hashable, list[str]] = {}
    for host, host_keys in keys.items():
        for key in host_keys:
            by_key.setdefault(key, []).append(host)
    found: list[list[str]] = []
    for hosts in by_key.values():
        if len(hosts) > 1 and hosts not in found:
            found.append(hosts)
    return found


# What two inventory names for one machine would do, and the cure.
_CONSEQUENCE = ("one machine would run the ranks of all of them, and the machines meant by the others none: give "
                "each host its own ansible_host (and ansible_port), or list the machine once")
_SAME_IDENTITY = "are one machine (their nodes report the same boot id, network namespace and machine id)"


def _refuse(shared: list[list[str]], why: Callable[[list[str]], str]) -> None:
    if not shared:
        return
    named = "; ".join(f"hosts {', '.join(hosts)}: {why(hosts)}" for hosts in shared)
    raise InventoryError(f"{named}; {_CONSEQUENCE}", shared[0][0], "ansible_host",
                         hosts=[h for hosts in shared for h in hosts])


def refuse_shared_targets(targets: Mapping[str, tuple[str, frozenset[str], str]]) -> None:
    """InventoryError naming the hosts whose connections go to one address and port."""
    keys = {h: [(kind, address, port) for address in addresses] for h, (kind, addresses, port) in targets.items()}

    def why(hosts: list[str]) -> str:
        kind, addresses, port = targets[hosts[0]]
        common = sorted(set.intersection(*(set(targets[h][1]) for h in hosts))) or sorted(addresses)
        where = "this controller" if kind == "local" else f"{common[0]}{' port ' + port if port else ''}"
        return f"connect to one machine ({kind} to {where})"

    _refuse(_shared(keys), why)


def identity_key(identity: Mapping[str, Any] | None) -> tuple[str, str, str] | None:
    """What makes a node one machine: its kernel's boot (boot_id, new at every boot, shared by
    the containers on one kernel), its network namespace (one per container, where ranks'
    ports live) and its machine-id (which containers of one image share). None when the node
    could not say."""
    identity = identity or {}
    if not identity.get("boot_id") or not identity.get("netns"):
        return None
    return str(identity["boot_id"]), str(identity["netns"]), str(identity.get("machine_id") or "")


def _same_identity(identities: Mapping[str, Mapping[str, Any] | None]) -> list[list[str]]:
    return _shared({h: [k] for h, k in ((h, identity_key(i)) for h, i in identities.items()) if k is not None})


def refuse_same_identity(identities: Mapping[str, Mapping[str, Any] | None]) -> None:
    """InventoryError naming the hosts whose nodes report one identity (identity_key)."""
    _refuse(_same_identity(identities), lambda hosts: _SAME_IDENTITY)


def same_identity_checks(identities: Mapping[str, Mapping[str, Any] | None]) -> list[dict[str, Any]]:
    """refuse_same_identity as check_input's checks, one per host (check_input names hosts
    that fail alike once, together)."""
    return [{"that": False, "msg": f"{_SAME_IDENTITY}; {_CONSEQUENCE}", "variable": "ansible_host", "host": h}
            for hosts in _same_identity(identities) for h in hosts]
