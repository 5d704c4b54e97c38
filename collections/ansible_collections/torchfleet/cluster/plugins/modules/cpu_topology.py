#!/usr/bin/python
"""Read a node's CPU topology: lscpu's parsable table, the CPUs and the memory nodes this node may use."""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: cpu_topology
short_description: A node's CPUs, cores, sockets, NUMA nodes, hyper-thread siblings and limits
description:
  - Runs C(lscpu -p=CPU,CORE,SOCKET,NODE,ONLINE --all), so offline CPUs are known too, and reads
    what the node lets its processes use, so the controller can compute each rank's cpuset and
    memory nodes from facts.
options: {}
"""

RETURN = r"""
lscpu:
  description: The parsable lscpu table, offline CPUs included.
  returned: always
  type: str
allowed:
  description: The CPUs processes on the node may run on (sched_getaffinity, its own cpuset).
  returned: always
  type: list
  elements: int
memory_nodes:
  description: >-
    The online NUMA nodes that hold memory, as a CPU-list-style text from
    /sys/devices/system/node; null where the kernel has no NUMA support.
  returned: always
  type: str
mems_allowed:
  description: >-
    The memory nodes the node's cgroup allows (its effective cpuset.mems, as the kernel states it
    in Mems_allowed_list); null where the kernel does not say.
  returned: always
  type: str
"""

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


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    rc, out, err = module.run_command(["lscpu", "-p=CPU,CORE,SOCKET,NODE,ONLINE", "--all"])
    if rc != 0:
        module.fail_json(msg=f"lscpu failed: {err.strip()}")
    module.exit_json(changed=False, lscpu=out, allowed=sorted(os.sched_getaffinity(0)),
                     memory_nodes=memory_nodes(), mems_allowed=mems_allowed())


if __name__ == "__main__":
    main()
