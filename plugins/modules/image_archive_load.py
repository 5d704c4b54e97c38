#!/usr/bin/python
"""Documentation only: the image_archive_load action plugin does the work."""

from __future__ import annotations

DOCUMENTATION = r"""
module: image_archive_load
short_description: Stream a docker save archive from the controller into a node's engine and load it
description:
  - The archive is streamed by the connection into the task's temporary folder on the node,
    M(community.docker.docker_image_load) loads it, and the folder is removed whatever happened.
  - Nothing hashes it; the engine checks each layer's digest as it loads.
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin. The task's temporary folder must have room for the archive
    (C(ansible_remote_tmp)).
requirements:
  - The community.docker collection, and on the node what M(community.docker.docker_image_load) needs.
options:
  src:
    description:
      - The archive on the controller, or with I(on_node) on the node; a C(~) in it is the
        home folder of the machine that reads it.
    type: str
    required: true
  on_node:
    description: The archive is already at I(src) on the node (shared storage); nothing is sent.
    type: bool
    default: false
  timeout:
    description: Seconds the engine may take to load it; 1 or more.
    type: int
    default: 600
"""

EXAMPLES = r"""
- name: Send the training image to the node and load it
  torchfleet.cluster.image_archive_load:
    src: /srv/images/train.tar
    timeout: 900
  vars:
    ansible_remote_tmp: /var/tmp/torchfleet
"""

RETURN = r"""
image_ids:
  description: The IDs of the images loaded, as M(community.docker.docker_image_load) returns them.
  returned: success
  type: list
  elements: str
images:
  description: The images loaded, as M(community.docker.docker_image_load) returns them.
  returned: success
  type: list
  elements: dict
"""
