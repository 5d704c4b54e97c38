#!/usr/bin/python
"""Documentation only: the workload_pack action plugin does the work, on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: workload_pack
short_description: Pack a workload file or folder into a tar on the controller
description:
  - Writes the workload's files (less .git, __pycache__, *.pyc and the patterns of its
    .torchfleetignore) to a tar whose bytes depend only on the files' paths, contents and
    executable bits, so an unchanged workload gives the same checksum.
  - Returns the command the ranks run from the unpacked workload folder.
    Fails with the variable named on bad input.
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin; it runs on the controller and needs the torchfleet package in the Python that runs Ansible.
options:
  src:
    description: The workload, a training script or a folder, on the controller.
    type: path
    required: true
  dest:
    description: The tar to write; its folder is created if missing.
    type: path
    required: true
  entrypoint:
    description:
      - The script to run, relative to the folder (C(train.py)), or C(-m package.module).
      - May be empty only when I(src) is a file.
    type: str
    default: ""
  python:
    description: The Python that runs the entrypoint on the nodes.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Pack the workload
  torchfleet.cluster.workload_pack:
    src: files/workloads/mnist.py
    dest: .torchfleet/workloads/mnist.tar
    python: /opt/torchfleet/venv/bin/python
  run_once: true
  register: launch__workload
"""

RETURN = r"""
archive:
  description: The tar written.
  returned: success
  type: str
sha256:
  description: The tar's SHA-256; unchanged files give the same one.
  returned: success
  type: str
files:
  description: The files packed, by their paths in the workload folder.
  returned: success
  type: list
  elements: str
argv:
  description: The command each rank runs, from the workload folder.
  returned: success
  type: list
  elements: str
  sample: [/opt/torchfleet/venv/bin/python, mnist.py]
"""
