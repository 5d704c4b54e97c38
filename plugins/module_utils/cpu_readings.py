"""Node-side: what CPU pinning needs of a node (cpu_topology, and node_probe for a launch)."""

from __future__ import annotations

import os

NODE_DIR = "/sys/devices/system/node"


def _read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def memory_nodes():
    """Online nodes with memory: N_MEMORY lists only online ones; older kernels lack it."""
    return _read(f"{NODE_DIR}/has_memory") if os.path.exists(f"{NODE_DIR}/has_memory") else _read(f"{NODE_DIR}/online")


def mems_allowed():
    text = _read("/proc/self/status") or ""
    for line in text.splitlines():
        if line.startswith("Mems_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return None


def topology(module):
    """lscpu's parsable table (offline CPUs included), the CPUs this node lets its processes
    use, its memory nodes and its cgroup's; fails the module when lscpu does."""
    rc, out, err = module.run_command(["lscpu", "-p=CPU,CORE,SOCKET,NODE,ONLINE", "--all"])
    if rc != 0:
        module.fail_json(msg=f"lscpu failed: {err.strip()}")
    return {"lscpu": out, "allowed": sorted(os.sched_getaffinity(0)), "memory_nodes": memory_nodes(),
            "mems_allowed": mems_allowed()}
