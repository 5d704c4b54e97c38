#!/usr/bin/python
"""Record on a node the roles that converged there, for site.yml's skip."""

from __future__ import annotations

DOCUMENTATION = r"""
module: site_record
short_description: Record the roles that converged on a node, and what shows they still are
description:
  - Writes the node's record of the roles that site.yml ran there (JSON, mode 0600), which
    M(torchfleet.cluster.node_probe) reads back with its C(site_record) option. Each role's
    entry holds its input's digest (made on the controller, torchfleet.site_state) and what its
    checks read now - whether the engine answers, the image ID each image name names, each
    path's size and modification time (a glob stands for what it matches).
  - The entries of other roles already in the record are kept. The file is rewritten only
    where its content would change.
author: torchfleet developers (!UNKNOWN)
options:
  path:
    description:
      - The record's file on the node (site.yml's is C(site.json) in C(launch_node_dir)); its folder is made
        where it is missing.
    type: path
    required: true
  roles:
    description:
      - The roles that have just run, each with C(digest) and C(checks) (C(engine), C(images), C(paths)), as the
        filter torchfleet.cluster.site_plan gives them in its C(record).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Record the roles that converged on each node
  torchfleet.cluster.site_record:
    path: /var/lib/torchfleet/site.json
    roles: "{{ site__plan.record }}"
  when: site__plan.record | length > 0
"""

RETURN = r"""
record:
  description: The record as it now stands (as it would stand, in check mode).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchfleet.cluster.plugins.module_utils import role_checks

FORMAT = 1  # torchfleet.site_state.FORMAT


def main():
    module = AnsibleModule(
        argument_spec={"path": {"type": "path", "required": True}, "roles": {"type": "dict", "required": True}},
        supports_check_mode=True,
    )
    path = module.params["path"]
    before = role_checks.read(path)
    kept = dict(before["roles"]) if before and before.get("format") == FORMAT and isinstance(before.get("roles"), dict) else {}
    for role, given in sorted(module.params["roles"].items()):
        kept[role] = role_checks.entry(module, given["digest"], given.get("checks") or {})
    record = {"format": FORMAT, "roles": kept}
    changed = record != before
    if changed and not module.check_mode:
        role_checks.write(path, record)
    module.exit_json(changed=changed, record=record)


if __name__ == "__main__":
    main()
