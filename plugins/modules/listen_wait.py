#!/usr/bin/python
"""Wait, on a node, until a TCP port accepts connections (the wait_ranks action calls it)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: listen_wait
short_description: Wait until a TCP port on a node accepts a connection, trying every few hundredths of a second
description:
  - Tries to connect to I(host):I(port) every I(interval) seconds, for at most I(timeout)
    seconds, and says whether it answered.
  - M(ansible.builtin.wait_for) tries once a second at the most; a launch waits on the
    master's MASTER_PORT before it starts the other nodes, so each try saved is the launch's.
  - A refusal is not a failure; the result says C(listening=false).
author: torchfleet developers (!UNKNOWN)
options:
  host:
    description: The address to connect to.
    type: str
    required: true
  port:
    description: The port.
    type: int
    required: true
  timeout:
    description: Seconds to try for, at most.
    type: float
    default: 5
  interval:
    description: Seconds between tries.
    type: float
    default: 0.05
"""

EXAMPLES = r"""
- name: Wait up to 5 seconds for the master's store
  torchfleet.cluster.listen_wait:
    host: 10.0.0.11
    port: 29500
    timeout: 5
"""

RETURN = r"""
listening:
  description: Whether the port accepted a connection within I(timeout).
  returned: always
  type: bool
waited_s:
  description: Seconds waited.
  returned: always
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchfleet.cluster.plugins.module_utils.guard_child import answers


def main():
    module = AnsibleModule(argument_spec={
        "host": {"type": "str", "required": True},
        "port": {"type": "int", "required": True},
        "timeout": {"type": "float", "default": 5},
        "interval": {"type": "float", "default": 0.05},
    }, supports_check_mode=True)
    p = module.params
    started = time.monotonic()
    deadline = started + max(p["timeout"], 0)
    while True:
        listening = answers(p["host"], p["port"], max(min(1.0, deadline - time.monotonic()), 0.05))
        if listening or time.monotonic() >= deadline:
            break
        time.sleep(max(p["interval"], 0.01))
    module.exit_json(changed=False, listening=listening, waited_s=round(time.monotonic() - started, 2))


if __name__ == "__main__":
    main()
