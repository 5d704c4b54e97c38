#!/usr/bin/python
"""Documentation only: the launch_input action plugin does the work."""

from __future__ import annotations

DOCUMENTATION = r"""
module: launch_input
short_description: Check a node's launch input, keep its settings as the fact launch__input, and probe the node
description:
  - Checks the host's launch variables against the launch role's argument spec (I(role)),
    as Ansible's own check of a role's arguments would. The playbooks that run this task
    include the role with C(rolespec_validate=false); that check is a task of its own on
    every node, and cost a launch at 48 nodes about 0.1 s of controller CPU per node.
  - Reads the host's launch variables itself (torchfleet.inputs.input_variables()) and checks
    what argument_specs cannot, the numbers' ranges and the names of the secret
    environment. A failure returns C(torchfleet_error) with the host and the variable,
    every failure in one message.
  - Reads the host's cpu_pinning variables too, with the cpu_pinning role's own defaults and
    argument spec (I(pinning_role)); the launch plans the pinning from node_probe's reading
    (torchfleet.cpus.plan) rather than running that role's tasks on every node.
  - Sets the fact C(launch__input) (settings, env_public, env_shown, has_secrets, pinning),
    which M(torchfleet.cluster.launch_spec) reads through hostvars. Secret values never enter it.
  - Once the input passed, runs M(torchfleet.cluster.node_probe) on the node with I(probe),
    adding what the input decides (the paths the ranks need, whether to read the CPU
    topology and the addresses, and under launch_mode mpirun the SSH mesh's files and the
    node's account of its uid). A node whose input fails is not probed.
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin; it needs the torchfleet package in the Python that runs Ansible.
options:
  role:
    description: The launch role's folder (its argument spec, entry point C(main)).
    type: path
    required: true
  pinning_role:
    description: The cpu_pinning role's folder (its defaults and argument spec).
    type: path
    required: true
  probe:
    description: M(torchfleet.cluster.node_probe)'s other arguments (C(python), C(ports), C(run_root), C(job), C(checksum)).
    type: dict
    required: true
  image:
    description:
      - For container units, C(image) (the training image), C(cache_dir) and C(keep_answer).
        The same module run then reads the image and the job's containers (node_probe's
        C(containers)), and they come back as the fact C(launch__job_containers). An engine
        that cannot answer fails the task, unless C(keep_answer) is false (a plan).
    type: dict
"""

EXAMPLES = r"""
- name: Check the node's launch input and read the node
  torchfleet.cluster.launch_input:
    role: "{{ playbook_dir }}/../roles/launch"
    pinning_role: "{{ playbook_dir }}/../roles/cpu_pinning"
    probe:
      python: /opt/torchfleet/venv/bin/python
      ports: [29500]
  register: launch__node_state
"""

RETURN = r"""
ansible_facts:
  description: M(torchfleet.cluster.node_probe)'s facts, with C(launch__input) added, and C(launch__job_containers) for container units.
  returned: success
  type: dict
torchfleet_error:
  description: On bad input, C(kind), C(host) and C(variable).
  returned: failure
  type: dict
nproc:
  description: As M(torchfleet.cluster.node_probe) returns it, with the rest of its result.
  returned: success
  type: int
"""
