#!/usr/bin/python
"""Read a node's CPU topology: lscpu's parsable table, the CPUs and the memory nodes this node may use."""

from __future__ import annotations

DOCUMENTATION = r"""
module: cpu_topology
short_description: A node's CPUs, cores, sockets, NUMA nodes, hyper-thread siblings and limits
description:
  - Runs C(lscpu -p=CPU,CORE,SOCKET,NODE,ONLINE --all), so offline CPUs are known too, and reads
    what the node lets its processes use, so the controller can compute each rank's cpuset and
    memory nodes from facts.
author: torchfleet developers (!UNKNOWN)
options: {}
"""

EXAMPLES = r"""
- name: Read the node's CPU topology
  torchfleet.cluster.cpu_topology:
  register: topology
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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchfleet.cluster.plugins.module_utils.cpu_readings import topology


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    module.exit_json(changed=False, **topology(module))


if __name__ == "__main__":
    main()
