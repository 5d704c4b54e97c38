#!/usr/bin/python
"""Check that this node reaches every other node over the WireGuard overlay (TCP and handshake)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: overlay_probe
short_description: TCP connections and WireGuard handshakes between every pair of nodes
description:
  - Run on every node at once. Each node listens on its overlay address at I(port) and
    connects to every peer's overlay address at the same port, retrying until
    I(timeout); it keeps listening until every peer has connected to it or the time is up.
    Then it reads each peer's latest handshake with C(wg show).
  - Reports, per peer, whether the peer is configured (one of its allowed IPs holds the
    peer's address), the handshake's age and the connection's outcome; no key is returned.
    It never fails on an unreachable peer; the caller decides.
options:
  interface:
    description: The overlay interface.
    type: str
    required: true
  address:
    description: This node's overlay address.
    type: str
    required: true
  peers:
    description: The other nodes' overlay addresses, by inventory hostname.
    type: dict
    required: true
  port:
    description: The TCP port each node listens on during the probe.
    type: int
    required: true
  timeout:
    description: Seconds to wait for every connection.
    type: float
    default: 10
author: torchfleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Check that every node reaches every other over the overlay
  torchfleet.cluster.overlay_probe:
    interface: wg0
    address: 10.77.0.1
    peers: {node-2: 10.77.0.2, node-3: 10.77.0.3}
    port: 51900
    timeout: 20
  register: probe
"""

RETURN = r"""
peers:
  description: Per peer host, C(configured), C(handshake_age) (seconds, or null), C(connected) and C(error).
  returned: always
  type: dict
"""

import ipaddress
import socket
import threading
import time

from ansible.module_utils.basic import AnsibleModule


def listen(address, port, expected, deadline, accepted):
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind((address, port))
    server.listen(64)
    server.settimeout(0.2)

    def serve():
        try:
            while time.monotonic() < deadline and not expected <= accepted:
                try:
                    conn, (peer, _port) = server.accept()
                except socket.timeout:
                    continue
                accepted.add(peer)
                conn.close()
        finally:
            server.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread


def connect(address, port, deadline):
    error = "no attempt"
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=max(0.2, min(2.0, deadline - time.monotonic()))):
                return True, ""
        except OSError as exc:
            error = str(exc) or type(exc).__name__
            time.sleep(0.2)
    return False, error


def handshakes(module, interface):
    """Each allowed network of the interface's peers, with that peer's latest handshake (0: never)."""
    _rc, dump, _err = module.run_command(["wg", "show", interface, "dump"])
    rows = []
    for line in dump.splitlines()[1:]:
        fields = line.split("\t")
        if len(fields) < 8:
            continue
        for allowed in fields[3].split(","):
            if allowed and allowed != "(none)":
                rows.append((ipaddress.ip_network(allowed, strict=False), int(fields[4])))
    return rows


def main():
    module = AnsibleModule(
        argument_spec={
            "interface": {"type": "str", "required": True},
            "address": {"type": "str", "required": True},
            "peers": {"type": "dict", "required": True},
            "port": {"type": "int", "required": True},
            "timeout": {"type": "float", "default": 10},
        },
        supports_check_mode=True,
    )
    params = module.params
    peers = [{"host": str(host), "address": str(address)} for host, address in sorted(params["peers"].items())]
    deadline = time.monotonic() + params["timeout"]
    accepted = set()
    try:
        server = listen(params["address"], params["port"], {p["address"] for p in peers}, deadline, accepted)
    except OSError as exc:
        module.fail_json(msg=f"cannot listen on {params['address']}:{params['port']} for the overlay probe: {exc}",
                         peers={})
    outcomes = {}
    threads = []
    for peer in peers:
        def attempt(peer=peer):
            outcomes[peer["host"]] = connect(peer["address"], params["port"], deadline)
        threads.append(threading.Thread(target=attempt, daemon=True))
        threads[-1].start()
    for thread in threads + [server]:
        thread.join(max(0.0, deadline - time.monotonic()) + 3)
    rows = handshakes(module, params["interface"])
    now = int(time.time())
    result = {}
    for peer in peers:
        ip = ipaddress.ip_address(peer["address"])
        seen = [stamp for network, stamp in rows if ip in network]
        connected, error = outcomes.get(peer["host"], (False, "no attempt"))
        result[peer["host"]] = {
            "configured": bool(seen),
            "handshake_age": now - max(seen) if seen and max(seen) > 0 else None,
            "connected": connected,
            "error": error,
        }
    module.exit_json(changed=False, peers=result)


if __name__ == "__main__":
    main()
