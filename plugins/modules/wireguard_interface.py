#!/usr/bin/python
"""Bring a node's WireGuard interface to the configured state, creating it when missing."""

from __future__ import annotations

DOCUMENTATION = r"""
module: wireguard_interface
short_description: A WireGuard interface (kernel or wireguard-go) in the configured state
description:
  - Creates the interface when it is missing (a node restart, a crashed wireguard-go),
    with the kernel module when the node has one and C(wireguard-go) otherwise. Under
    systemd the C(wg-quick@NAME) unit owns it and is restarted; without a service manager
    C(wireguard-go -f NAME) runs in the background in its own session (its own daemon
    mode exits at once in some containers).
  - Then sets the private key from I(private_key), applies the peers and port of I(conf)
    (a wg-quick file) with C(wg syncconf), which keeps live sessions of unchanged peers,
    and sets the address, the MTU and the link up.
  - Reports a change only when the live state differs afterwards. Returns no key.
options:
  name:
    description: The interface.
    type: str
    required: true
  conf:
    description: The wg-quick configuration (its name must be NAME.conf).
    type: path
    required: true
  private_key:
    description: The node's private key file.
    type: path
    required: true
  address:
    description: The interface address with its prefix length, e.g. 10.77.0.1/24.
    type: str
    required: true
  mtu:
    description: The interface MTU.
    type: int
    required: true
  implementation:
    description: C(kernel), C(userspace) (wireguard-go), or C(auto) (the kernel when it can).
    type: str
    choices: [auto, kernel, userspace]
    default: auto
  service:
    description: C(systemd) (the wg-quick@NAME unit makes the interface) or C(process).
    type: str
    choices: [systemd, process]
    default: process
  wireguard_go:
    description: The wireguard-go binary.
    type: str
    default: wireguard-go
  log:
    description: Where a background wireguard-go writes its output.
    type: path
    default: /var/log/torchfleet-wireguard.log
author: torchfleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Bring the overlay interface up, with wireguard-go where the kernel has no WireGuard
  torchfleet.cluster.wireguard_interface:
    name: wg0
    conf: /etc/wireguard/wg0.conf
    private_key: /etc/wireguard/wg0.key
    address: 10.77.0.1/24
    mtu: 1420
"""

RETURN = r"""
implementation:
  description: What runs the interface, C(kernel) or C(userspace).
  returned: success
  type: str
created:
  description: Whether the interface had to be created.
  returned: success
  type: bool
"""

import json
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule


def _run(module, argv, data=None, check=True):
    rc, out, err = module.run_command(argv, data=data, binary_data=data is not None)
    if check and rc != 0:
        module.fail_json(msg=f"{' '.join(argv[:4])} failed: {(err or out).strip()}")
    return rc, out, err


def _link(module, name):
    rc, out, _err = _run(module, ["ip", "-j", "-d", "addr", "show", "dev", name], check=False)
    if rc != 0 or not out.strip():
        return None
    return json.loads(out)[0]


def snapshot(module, name):
    """The interface's live state, without its private key or the counters that change by themselves."""
    link = _link(module, name)
    if link is None:
        return None
    _rc, dump, _err = _run(module, ["wg", "show", name, "dump"], check=False)
    lines = [line.split("\t") for line in dump.splitlines() if line]
    device = lines[0][1:3] if lines else []
    peers = sorted((p[0], p[1], p[2], ",".join(sorted(p[3].split(","))), p[7]) for p in lines[1:] if len(p) >= 8)
    return {
        "up": "UP" in link.get("flags", []),
        "mtu": link.get("mtu"),
        "kind": (link.get("linkinfo") or {}).get("info_kind"),
        "addresses": sorted(f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])
                            if a.get("family") == "inet"),
        "device": device,
        "peers": peers,
    }


def _wait_for(module, name, seconds=10.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _link(module, name) is not None:
            return
        time.sleep(0.1)
    module.fail_json(msg=f"the interface {name} did not appear within {seconds:.0f} s")


def create(module, name):
    params = module.params
    if params["service"] == "systemd":
        _run(module, ["systemctl", "restart", f"wg-quick@{name}"])
        _wait_for(module, name)
        return
    if params["implementation"] != "userspace":
        rc, _out, err = _run(module, ["ip", "link", "add", "dev", name, "type", "wireguard"], check=False)
        if rc == 0:
            return
        if params["implementation"] == "kernel":
            module.fail_json(msg=f"no WireGuard kernel module: ip link add {name} type wireguard: {err.strip()}")
    binary = module.get_bin_path(params["wireguard_go"], required=True)
    # Its own session and no pipe back to Ansible: it outlives this module, as a daemon would
    # (Popen, since run_command waits for its child; tests/sanity/ignore-2.19.txt).
    with open(params["log"], "ab") as log:
        subprocess.Popen([binary, "-f", name], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                         start_new_session=True, close_fds=True)
    _wait_for(module, name)


def apply(module, name):
    params = module.params
    _rc, stripped, _err = _run(module, ["wg-quick", "strip", params["conf"]])
    with open(params["private_key"]) as fh:
        key = fh.read().strip()
    # Ansible masks it in anything this module returns, error messages included.
    module.no_log_values.add(key)
    # syncconf clears a key its input lacks, which would drop every session; the key goes
    # in through stdin, so it touches no other file and no command line.
    conf = stripped.replace("[Interface]\n", f"[Interface]\nPrivateKey = {key}\n", 1)
    _run(module, ["wg", "syncconf", name, "/dev/stdin"], data=conf)
    state = snapshot(module, name)
    for address in state["addresses"]:
        if address != params["address"]:
            _run(module, ["ip", "addr", "del", address, "dev", name])
    if params["address"] not in state["addresses"]:
        _run(module, ["ip", "addr", "add", params["address"], "dev", name])
    if state["mtu"] != params["mtu"]:
        _run(module, ["ip", "link", "set", "dev", name, "mtu", str(params["mtu"])])
    if not state["up"]:
        _run(module, ["ip", "link", "set", "dev", name, "up"])


def main():
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "str", "required": True},
            "conf": {"type": "path", "required": True},
            "private_key": {"type": "path", "required": True},
            "address": {"type": "str", "required": True},
            "mtu": {"type": "int", "required": True},
            "implementation": {"type": "str", "choices": ["auto", "kernel", "userspace"], "default": "auto"},
            "service": {"type": "str", "choices": ["systemd", "process"], "default": "process"},
            "wireguard_go": {"type": "str", "default": "wireguard-go"},
            "log": {"type": "path", "default": "/var/log/torchfleet-wireguard.log"},
        },
        supports_check_mode=True,
    )
    name = module.params["name"]
    before = snapshot(module, name)
    if module.check_mode:
        # Without the interface nothing can be compared; with it, only creation is certain.
        module.exit_json(changed=before is None, created=before is None,
                         implementation=(before or {}).get("kind") or "unknown")
    if before is None:
        create(module, name)
    apply(module, name)
    after = snapshot(module, name)
    module.exit_json(changed=before != after, created=before is None,
                     implementation="kernel" if after["kind"] == "wireguard" else "userspace")


if __name__ == "__main__":
    main()
