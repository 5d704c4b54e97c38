#!/usr/bin/python
"""Read a node's CPU topology: lscpu's parsable table and the CPUs this node may use."""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: cpu_topology
short_description: A node's CPUs, cores, sockets, NUMA nodes and hyper-thread siblings
description:
  - Runs C(lscpu -p=CPU,CORE,SOCKET,NODE) and reads the CPU affinity of the node, so
    the controller can compute each rank's cpuset from facts.
options: {}
"""

RETURN = r"""
lscpu:
  description: The parsable lscpu table.
  returned: always
  type: str
allowed:
  description: The CPUs processes on the node may run on (its own cpuset).
  returned: always
  type: list
  elements: int
"""


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    rc, out, err = module.run_command(["lscpu", "-p=CPU,CORE,SOCKET,NODE"])
    if rc != 0:
        module.fail_json(msg=f"lscpu failed: {err.strip()}")
    module.exit_json(changed=False, lscpu=out, allowed=sorted(os.sched_getaffinity(0)))


if __name__ == "__main__":
    main()
