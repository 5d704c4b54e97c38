#!/usr/bin/python
"""Documentation only: the image_archive_info action plugin does the work, on the controller."""

from __future__ import annotations

DOCUMENTATION = r"""
module: image_archive_info
short_description: The image ID and tags of a docker save archive on the controller
description:
  - Reads the archive's manifest with community.docker's image_archive helpers; no engine
    is needed.
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin; it runs on the controller and needs no connection.
requirements:
  - The community.docker collection on the controller.
options:
  path:
    description: The archive.
    type: path
    required: true
"""

EXAMPLES = r"""
- name: Read the archive's image ID
  torchfleet.cluster.image_archive_info:
    path: /srv/images/train.tar
  register: archive
"""

RETURN = r"""
image_id:
  description: The image ID, as the engine's API names it.
  returned: success
  type: str
  sample: sha256:0c5cb1a1b6b7d4e5c2ab2b0fbc0ef3e2b6a2c1b1e3c0b5f0d9b2c6a9e1f7d3a4
repo_tags:
  description: The archive's tags.
  returned: success
  type: list
  elements: str
  sample: [torchfleet/train:latest]
"""
