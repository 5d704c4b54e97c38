#!/usr/bin/python
"""Read, in one call, what a launch needs to know of a node; changes nothing."""

from __future__ import annotations

DOCUMENTATION = r"""
module: node_probe
short_description: One read-only look at a node for a launch
description:
  - Every launch task costs the controller a process per node, so the launch reads what it
    needs of a node in one call, before MASTER_ADDR is known. This one returns the node's
    usable CPUs, addresses and routing tables (the controller looks up the route to
    MASTER_ADDR in them), and on request the paths it lacks, the ports that listen, and
    the runs of a job whose bare-process ranks still run.
  - site.yml reads each node with it once too, before anything changes - which machine the node is,
    and its record of the roles that converged there - and skips every role whose record holds.
author: torchfleet developers (!UNKNOWN)
options:
  network:
    description:
      - Read the node's addresses and routing tables (I(ip_addr), I(routes)). site.yml's probe needs
        neither.
    type: bool
    default: true
  site_record:
    description:
      - The node's record of the roles that converged there (M(torchfleet.cluster.site_record) writes it).
        It comes back as I(site_record), with what the record's checks read now.
    type: path
  facts:
    description:
      - Also set C(ansible_all_ipv4_addresses) and C(ansible_default_ipv4) as the setup
        module would, from the same C(ip) output (the address on the route to 8.8.8.8).
    type: bool
    default: false
  topology:
    description: Also return what CPU pinning needs (cpu_topology's readings) as I(topology).
    type: bool
    default: false
  python:
    description: An interpreter; I(python_ok) says whether it exists and runs.
    type: path
  paths:
    description: Paths (devices, sockets) that must exist; the missing ones come back as I(missing).
    type: list
    elements: path
    default: []
  ports:
    description: TCP ports; those that listen on any of the node's addresses come back as I(listening).
    type: list
    elements: int
    default: []
  run_root:
    description: With I(job), the folder of the node's runs, searched for that job's ranks that still run.
    type: path
  job:
    description: The job whose running runs come back as I(running_runs).
    type: str
  run_id:
    description: With I(run_root), a run id whose folder, where the node already holds one, comes back as I(run_taken).
    type: str
  checksum:
    description: A file whose SHA-256 comes back as I(sha256) (null when there is none), so an unchanged one is not sent again.
    type: path
  uid:
    description: A uid whose account on the node comes back as I(account) (the mpirun mode's mesh uid must not be a login's).
    type: int
  libraries:
    description: Shared libraries (sonames) to look up with C(ldconfig -p), as LD_PRELOAD would find them (launch_malloc).
    type: list
    elements: str
    default: []
  containers:
    description:
      - For container units, what M(torchfleet.cluster.rank_containers) with I(state=status) reads,
        in the same module run; C(labels), C(image), C(image_uid), C(image_libraries),
        C(cache_dir) and C(keep_answer) as its options. Its answer comes back as I(containers).
      - A node whose engine cannot answer (a plan before site.yml) is no failure here; the
        answer says so (C(failed), C(msg)).
    type: dict
"""

EXAMPLES = r"""
- name: Read the node for a launch, in one call
  torchfleet.cluster.node_probe:
    facts: true
    topology: true
    python: /opt/torchfleet/venv/bin/python
    ports: [29500]
    run_root: /var/lib/torchfleet/runs
    job: mnist
  register: probe
"""

RETURN = r"""
nproc:
  description: The CPUs this node lets the probe use (as nproc counts them).
  returned: always
  type: int
ip_addr:
  description: C(ip -j addr show)'s output.
  returned: with network
  type: str
routes:
  description: Every IPv4 and IPv6 route of every table (C(ip -j route show table all)), for torchfleet.netif.route_device.
  returned: with network
  type: list
site_record:
  description:
    - With I(site_record), the record (C(recorded), null where there is none) and what its checks read now
      (C(observed)), C(engine) (whether the engine answers, null where no role asks), C(images) (the image ID each
      recorded name names, null where none) and C(paths) (each recorded path's size and modification time, null where
      it is gone), for torchfleet.site_state.plan.
  returned: with site_record
  type: dict
topology:
  description: lscpu's table and the node's allowed CPUs and memory nodes, as M(torchfleet.cluster.cpu_topology) returns them.
  returned: with topology
  type: dict
python_ok:
  description: Whether I(python) is an executable file.
  returned: with python
  type: bool
missing:
  description: The I(paths) that do not exist.
  returned: always
  type: list
  elements: str
listening:
  description: The I(ports) that a socket listens on.
  returned: always
  type: list
  elements: int
running_runs:
  description: The runs of I(job) with a rank that still runs; empty without I(run_root) and I(job).
  returned: always
  type: list
  elements: str
run_taken:
  description: The folder of I(run_id) under I(run_root) where the node holds one (an earlier run's), else null.
  returned: always
  type: str
sha256:
  description: I(checksum)'s SHA-256, or null.
  returned: with checksum
  type: str
account:
  description: I(uid)'s passwd fields on the node (name, password, uid, gid, gecos, home, shell), or null.
  returned: with uid
  type: list
libraries:
  description: Each of I(libraries) with its path, or null where the loader has none; C(error) where ldconfig failed.
  returned: with libraries
  type: dict
identity:
  description:
    - Which machine this is (torchfleet.hosts.identity_key), so that two inventory hosts that reach one are refused.
    - C(boot_id), C(machine_id) (empty where the node has none) and C(netns), the inode of the network namespace.
  returned: always
  type: dict
hostname:
  description: The node's short hostname, as Slurm's NodeName and Ansible's ansible_hostname spell it.
  returned: always
  type: str
containers:
  description:
    - With I(containers), the job's containers (C(containers)), the image (C(images)), its
      C(image_account) and C(libraries), as rank_containers gives them; or C(failed) and C(msg)
      where the engine could not answer.
  returned: with containers
  type: dict
"""

import hashlib
import json
import os
import pwd
import socket

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchfleet.cluster.plugins.module_utils import loader_libraries, rank_docker, role_checks
from ansible_collections.torchfleet.cluster.plugins.module_utils.cpu_readings import topology
from ansible_collections.torchfleet.cluster.plugins.module_utils.rank_files import find

_LISTEN = "0A"


def listening_ports(tables):
    """The TCP ports in LISTEN state, from the text of /proc/net/tcp and tcp6."""
    ports = set()
    for text in tables:
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == _LISTEN:
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def default_ipv4(route_json):
    """``ansible_default_ipv4``'s address and interface, from ``ip -j route get``'s output."""
    routes = json.loads(route_json or "[]")
    if not routes:
        return {}
    return {"address": routes[0].get("prefsrc"), "interface": routes[0].get("dev")}


def routable(route):
    """Whether a route can carry MASTER_ADDR's traffic: broadcast and multicast entries cannot,
    nor IPv6 link-local ones (a docker host has one per container), which only fill the result."""
    return route.get("type", "unicast") not in ("broadcast", "multicast", "anycast") \
        and not str(route.get("dst", "")).startswith("fe80:")


def route_fields(route, family):
    """What a route lookup needs of an ``ip -j route`` entry, with its address family (a
    "default" destination is either's): the rest only fills the result."""
    kept = {k: route[k] for k in ("dst", "type", "dev", "metric", "table") if k in route}
    kept["family"] = family
    if route.get("nexthops"):
        kept["nexthops"] = [{"dev": hop["dev"]} for hop in route["nexthops"] if "dev" in hop]
    return kept


def ipv4_addresses(addr_json):
    """``ansible_all_ipv4_addresses``: every IPv4 address but the loopback's, as setup lists them."""
    return [a["local"] for link in json.loads(addr_json or "[]") for a in link.get("addr_info", [])
            if a.get("family") == "inet" and not a["local"].startswith("127.")]


def sha256(path):
    """The file's SHA-256, or None when there is no such file."""
    if not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def account(uid):
    """The passwd fields of ``uid``'s account on this node, as getent lists them, or None."""
    try:
        entry = pwd.getpwuid(uid)
    except KeyError:
        return None
    return [entry.pw_name, entry.pw_passwd, str(entry.pw_uid), str(entry.pw_gid), entry.pw_gecos, entry.pw_dir,
            entry.pw_shell]


def identity():
    """The node's boot id, machine-id and network namespace: two names for one machine share
    all three, two containers on one kernel only the boot id (and maybe the machine-id)."""
    try:
        netns = str(os.stat("/proc/self/ns/net").st_ino)
    except OSError:
        netns = ""
    return {"boot_id": _read("/proc/sys/kernel/random/boot_id").strip(),
            "machine_id": _read("/etc/machine-id").strip(), "netns": netns}


def _read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


class EngineFailed(Exception):
    pass


class _Answering:
    """The module, for rank_docker, with a failure that comes back as an answer: a node
    without an engine yet answers a plan, and the launch decides."""

    def __init__(self, module):
        self.module = module

    def run_command(self, *args, **kwargs):
        return self.module.run_command(*args, **kwargs)

    def get_bin_path(self, *args, **kwargs):
        return self.module.get_bin_path(*args, **kwargs)

    def fail_json(self, msg, **_kwargs):
        raise EngineFailed(msg)


def containers(module, ask):
    try:
        return rank_docker.status(_Answering(module), ask.get("docker_cli") or "docker", ask.get("labels") or {},
                                  image=ask.get("image"), image_uid=ask.get("image_uid"),
                                  libraries=ask.get("image_libraries"), cache_dir=ask.get("cache_dir"),
                                  keep=ask.get("keep_answer", True))
    except EngineFailed as exc:
        return {"failed": True, "msg": str(exc)}


def main():
    module = AnsibleModule(
        argument_spec={
            "network": {"type": "bool", "default": True},
            "site_record": {"type": "path"},
            "facts": {"type": "bool", "default": False},
            "topology": {"type": "bool", "default": False},
            "python": {"type": "path"},
            "paths": {"type": "list", "elements": "path", "default": []},
            "ports": {"type": "list", "elements": "int", "default": []},
            "run_root": {"type": "path"},
            "job": {"type": "str"},
            "run_id": {"type": "str"},
            "checksum": {"type": "path"},
            "uid": {"type": "int"},
            "libraries": {"type": "list", "elements": "str", "default": []},
            "containers": {"type": "dict"},
        },
        supports_check_mode=True,
    )
    p = module.params
    result = {"changed": False, "nproc": len(os.sched_getaffinity(0)), "identity": identity(),
              "hostname": socket.gethostname().split(".")[0],
              "missing": [path for path in p["paths"] if not os.path.exists(path)], "listening": []}
    if p["ports"]:
        result["listening"] = sorted(listening_ports([_read("/proc/net/tcp"), _read("/proc/net/tcp6")]) & set(p["ports"]))
    if p["network"] or p["facts"]:
        _rc, addr, _err = module.run_command(["ip", "-j", "addr", "show"], check_rc=True)
    if p["network"]:
        result["ip_addr"] = addr
        result["routes"] = []
        for family in (4, 6):
            # A node without IPv6 has no table to show: that family has no routes, not an error.
            rc, out, _err = module.run_command(["ip", "-j", f"-{family}", "route", "show", "table", "all"])
            result["routes"] += [route_fields(r, family) for r in json.loads(out or "[]") if routable(r)] if rc == 0 else []
    if p["site_record"]:
        recorded = role_checks.read(p["site_record"])
        result["site_record"] = {"recorded": recorded,
                                 "observed": role_checks.observe(module, *role_checks.recorded_checks(recorded))}
    if p["facts"]:
        rc, out, _err = module.run_command(["ip", "-j", "-4", "route", "get", "8.8.8.8"])
        result["ansible_facts"] = {"ansible_all_ipv4_addresses": ipv4_addresses(addr),
                                   "ansible_default_ipv4": default_ipv4(out) if rc == 0 else {}}
    if p["topology"]:
        result["topology"] = topology(module)
    if p["python"]:
        result["python_ok"] = os.path.isfile(p["python"]) and os.access(p["python"], os.X_OK)
    if p["checksum"]:
        result["sha256"] = sha256(p["checksum"])
    if p["uid"] is not None:
        result["account"] = account(p["uid"])
    if p["libraries"]:
        ldconfig = module.get_bin_path("ldconfig", opt_dirs=["/sbin", "/usr/sbin"])
        rc, out, err = module.run_command([ldconfig, "-p"]) if ldconfig else (1, "", "ldconfig not found")
        result["libraries"] = loader_libraries.answer(p["libraries"], loader_libraries.parse(out),
                                                      None if rc == 0 else err.strip() or f"exit {rc}")
    taken = os.path.join(p["run_root"], p["run_id"]) if p["run_root"] and p["run_id"] else None
    result["run_taken"] = taken if taken and os.path.lexists(taken) else None
    result["running_runs"] = sorted({e["run"] for e in find(module, p["run_root"], True, p["job"]) if e["running"]}) \
        if p["run_root"] and p["job"] and os.path.isdir(p["run_root"]) else []
    if p["containers"]:
        result["containers"] = containers(module, p["containers"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
