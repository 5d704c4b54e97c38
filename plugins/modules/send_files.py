#!/usr/bin/python
"""Put files that the send_files action streamed into the task's temporary folder in place."""

from __future__ import annotations

DOCUMENTATION = r"""
module: send_files
short_description: Send files from a controller folder to a node folder, in one task
description:
  - The action streams each of I(files) from I(src_dir) on the controller into the task's
    temporary folder on the node; this module then moves them into I(dest_dir) (made if
    missing), each replacing its old copy at once, with I(mode), owned by I(owner) and
    I(group) (the module's own user and group where unset).
  - Which files differ is the caller's to say (torchfleet.cluster.files_to_copy, from a
    find with checksums on each side); ansible.builtin.copy would check and send each file
    in a task run of its own, per node.
author: torchfleet developers (!UNKNOWN)
notes:
  - The send_files action plugin takes I(src_dir) and streams the files; it runs this module
    with the task's temporary folder on the node in place of I(src_dir).
  - The action refuses file names with a folder part, and files missing from I(src_dir), before
    anything is sent. In check mode it sends nothing and reports what it would send.
options:
  src_dir:
    description: The folder on the controller that holds I(files).
    type: path
    required: true
  dest_dir:
    description: The folder on the node.
    type: path
    required: true
  files:
    description: File names in I(src_dir) to send; plain names, no folder part.
    type: list
    elements: str
    required: true
  mode:
    description: The files' mode.
    type: str
    default: "0644"
  dir_mode:
    description: I(dest_dir)'s mode where it is made.
    type: str
    default: "0755"
  owner:
    description: The files' owner (a name or uid); the module's user where unset.
    type: str
  group:
    description: The files' group (a name or gid); the module's group where unset.
    type: str
"""

EXAMPLES = r"""
- name: Send two files in one task
  torchfleet.cluster.send_files:
    src_dir: files/ssh
    dest_dir: /etc/torchfleet/ssh
    files: [known_hosts, config]
    mode: "0600"
"""

RETURN = r"""
sent:
  description: The files put in place.
  returned: always
  type: list
  elements: str
  sample: [known_hosts, config]
"""

import os

from ansible.module_utils.basic import AnsibleModule


# The options the action passes on as they are; the action adds src_dir, the module staged_dir.
OPTIONS = {
    "dest_dir": {"type": "path", "required": True},
    "files": {"type": "list", "elements": "str", "required": True},
    "mode": {"type": "str", "default": "0644"},
    "dir_mode": {"type": "str", "default": "0755"},
    "owner": {"type": "str"},
    "group": {"type": "str"},
}


def main():
    module = AnsibleModule(argument_spec={"staged_dir": {"type": "path", "required": True}, **OPTIONS})
    p = module.params
    if not os.path.isdir(p["dest_dir"]):
        os.makedirs(p["dest_dir"])
        module.set_mode_if_different(p["dest_dir"], p["dir_mode"], False)
    for name in p["files"]:
        dest = os.path.join(p["dest_dir"], name)
        # atomic_move renames (or copies then renames, across file systems) and keeps SELinux labels.
        module.atomic_move(os.path.join(p["staged_dir"], name), dest)
        module.set_mode_if_different(dest, p["mode"], False)
        module.set_owner_if_different(dest, p["owner"] or str(os.geteuid()), False)
        module.set_group_if_different(dest, p["group"] or str(os.getegid()), False)
    module.exit_json(changed=bool(p["files"]), sent=p["files"])


if __name__ == "__main__":
    main()
