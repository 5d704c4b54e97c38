#!/usr/bin/python
"""Documentation only: the check_input action plugin does the work, on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: check_input
short_description: An input check whose failure carries its host and variable
description:
  - Like M(ansible.builtin.assert) for the inventory's input, but a failure returns
    C(torchfleet_error) with the host and the variable, which the API and the CLI read to
    tell bad input (exit 2) from a node that failed (exit 3).
  - Give I(that), I(msg) and I(variable), or I(checks).
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin; it runs on the controller and needs no connection.
options:
  that:
    description: The condition, already evaluated (C("{{ ... }}")); false fails.
    type: bool
  msg:
    description: One sentence saying what is wrong and what would be right.
    type: str
  variable:
    description: The variable the user has to change.
    type: str
  kind:
    description:
      - C(input), C(node) for a node whose state does not fit the launch, or C(running) for
        a launch refused because its job still runs.
    type: str
    choices: [input, node, running]
    default: input
  checks:
    description:
      - Instead of one check, several, in one task; each task costs a process per node. The
        first that fails gives the error's variable and kind; the message names every one that failed.
      - Checks that fail with the same message are named once, with all their hosts.
    type: list
    elements: dict
    suboptions:
      that:
        description: The condition; false fails.
        type: bool
        required: true
      msg:
        description: What is wrong.
        type: str
        required: true
      variable:
        description: The variable the user has to change.
        type: str
        required: true
      kind:
        description: As the top-level I(kind).
        type: str
        choices: [input, node, running]
        default: input
      host:
        description: The host the check is about (a run_once task checking every node); the task's own host without it.
        type: str
  consequence:
    description: What a failure means beyond the checks (C(so no rank was started on any node)), added to the message.
    type: str
"""

EXAMPLES = r"""
- name: Check the interface name, which Linux limits to 15 characters
  torchfleet.cluster.check_input:
    that: "{{ overlay_interface is match('^[A-Za-z0-9_.-]{1,15}$') }}"
    variable: overlay_interface
    msg: overlay_interface={{ overlay_interface }} must be 1-15 letters, digits, '_', '.' or '-'

- name: Check every node at once, from one task
  torchfleet.cluster.check_input:
    checks:
      - that: "{{ hostvars[item].launch_nproc_per_node | int >= 1 }}"
        msg: launch_nproc_per_node must be 1 or more
        variable: launch_nproc_per_node
        host: "{{ item }}"
    consequence: so no rank was started on any node
  run_once: true
  loop: "{{ ansible_play_hosts }}"
"""

RETURN = r"""
torchfleet_error:
  description: On failure, C(kind), C(host) and C(variable) of the first check that failed.
  returned: failure
  type: dict
  sample: {kind: input, host: node-1, variable: overlay_interface}
"""
