#!/usr/bin/python
"""Tell which Debian packages of a list are not installed."""

from __future__ import annotations

DOCUMENTATION = r"""
module: missing_packages
short_description: The packages of a list that dpkg does not have installed
description:
  - Asks dpkg-query, which needs no python3-apt, so roles can run apt (and its cache
    refresh) only when something is missing and report no change on provisioned nodes.
options:
  names:
    description: Package names.
    type: list
    elements: str
    required: true
author: torchfleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Find which of the packages the node lacks
  torchfleet.cluster.missing_packages:
    names: [wireguard-tools, iproute2]
  register: missing

- name: Install only those, so a provisioned node reports no change
  ansible.builtin.apt:
    name: "{{ missing.missing }}"
    update_cache: true
  when: missing.missing
"""

RETURN = r"""
missing:
  description: The names that are not installed, in the order given.
  returned: always
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule


def main():
    module = AnsibleModule(argument_spec={"names": {"type": "list", "elements": "str", "required": True}},
                           supports_check_mode=True)
    names = module.params["names"]
    # Unknown packages make dpkg-query exit 1; they count as missing all the same.
    _rc, out, _err = module.run_command(["dpkg-query", "--show", "--showformat", "${Package} ${db:Status-Status}\\n", *names])
    installed = {line.split()[0] for line in out.splitlines() if line.endswith(" installed")}
    module.exit_json(changed=False, missing=[n for n in names if n not in installed])


if __name__ == "__main__":
    main()
