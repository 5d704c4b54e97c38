#!/usr/bin/python
"""Documentation only: the inventory_check action plugin does the work, on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: inventory_check
short_description: The inventory's checks that need no node, with the lookalike warnings first
description:
  - Runs once, on the controller (each playbook's first play, on localhost), before any
    node is read or changed.
  - Warns first about the hosts' variables that look like torchfleet's but are not
    (torchfleet.lookalike), so that the warnings come whatever check fails after them; they
    come back as C(torchfleet_warnings), failed or not.
  - Then fails, with C(torchfleet_error) naming the variable, on an inventory without the
    group I(group) (naming the groups it has), on a launch_run_id that is not a plain name
    (torchfleet.inputs.RUN_ID), and on two hosts whose connections go to one address and port
    (torchfleet.hosts).
  - With I(master_group), adds the node that a launch from this inventory makes the master
    (torchfleet.ranks.likely_master) to that group, as M(ansible.builtin.add_host) would; a status or a stop asks
    it first.
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin; it runs on the controller, needs no connection, and needs the torchfleet
    package in the Python that runs Ansible.
options:
  group:
    description: The group torchfleet runs on (launch_hosts_group).
    type: str
    required: true
  roles_dir:
    description: torchfleet's roles, whose variables are the known names.
    type: path
    required: true
  master_group:
    description:
      - The group to add the master to, for the plays after this one. Not given, or where the inventory cannot
        name the master (its node ranks are set on some hosts only, or twice), no host is added.
    type: str
"""

EXAMPLES = r"""
- name: Check the inventory before any node is read
  torchfleet.cluster.inventory_check:
    group: train
    roles_dir: "{{ playbook_dir }}/../roles"
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
torchfleet_hosts:
  description: The hosts of I(group), in inventory order (the API counts these, not the localhost that ran the check).
  returned: success
  type: list
  elements: str
torchfleet_warnings:
  description: The lookalike warnings, each with its C(message), failed or not.
  returned: always
  type: list
  elements: dict
torchfleet_error:
  description: On bad input, C(kind), C(host) and C(variable).
  returned: failure
  type: dict
"""
