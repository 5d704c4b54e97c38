#!/usr/bin/python
"""Documentation only: the rank_plan action plugin does the work, on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: rank_plan
short_description: Build and validate the rank table of a job
description:
  - Orders the nodes by C(torchfleet_node_rank) or inventory order, numbers the ranks,
    and picks MASTER_ADDR. Fails with the host and variable named on bad input, changing nothing.
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin; it runs on the controller and needs the torchfleet package in the Python that runs Ansible.
options:
  hosts:
    description: The nodes of the job, in inventory order.
    type: list
    elements: str
    required: true
  overlay:
    description:
      - Take each node's address from its overlay interface (launch_transport wireguard),
        the interface M(torchfleet.cluster.launch_input) kept in C(launch__input), read in
        M(torchfleet.cluster.node_probe)'s C(ip_addr) (C(launch__node_state)). A node whose
        overlay is down fails, by name.
      - Otherwise each node's address comes from its variables and facts
        (C(torchfleet_cluster_address), C(torchfleet_cluster_network), C(ansible_host)).
    type: bool
    default: false
  master_port:
    description: The rendezvous port on the master.
    type: int
    default: 29500
"""

EXAMPLES = r"""
- name: Number the ranks and pick the master
  torchfleet.cluster.rank_plan:
    hosts: "{{ ansible_play_hosts }}"
    master_port: 29500
  run_once: true
  register: launch__plan
"""

RETURN = r"""
plan:
  description: The rank table (torchfleet.ranks.rank_table), with the master's address and port.
  returned: success
  type: dict
"""
