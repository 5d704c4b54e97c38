#!/usr/bin/python
"""Make a node's WireGuard private key on the node itself; only its public key comes back."""

from __future__ import annotations

DOCUMENTATION = r"""
module: wireguard_key
short_description: A WireGuard private key made on the node, which never leaves it
description:
  - Creates the private key with C(wg genkey) when I(path) is missing or empty, or when
    I(rotate) is true, written atomically with mode 0600. Returns only the public key.
  - Run it with C(no_log), so not even the public key reaches the output.
options:
  path:
    description: The private key file.
    type: path
    required: true
  rotate:
    description: Replace an existing key.
    type: bool
    default: false
  wg:
    description: The wg binary.
    type: str
    default: wg
author: torchfleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Make the node's WireGuard key on the node
  torchfleet.cluster.wireguard_key:
    path: /etc/wireguard/wg0.key
  register: key
  no_log: true
"""

RETURN = r"""
public_key:
  description: The public key of the node's private key; empty in check mode when a key would be made.
  returned: success
  type: str
"""

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule


def _write_private(module, path, wg):
    # A 0600 temporary file beside the key, then a rename: the key is never readable by
    # others, not even for an instant, and a crash leaves the old key whole.
    rc, key, err = module.run_command([wg, "genkey"])
    if rc != 0:
        module.fail_json(msg=f"wg genkey failed: {err.strip()}")
    fd, tmp = tempfile.mkstemp(prefix=".wg-", dir=os.path.dirname(path) or ".")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(key.strip() + "\n")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def main():
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "rotate": {"type": "bool", "default": False},
            "wg": {"type": "str", "default": "wg"},
        },
        supports_check_mode=True,
    )
    path, wg = module.params["path"], module.get_bin_path(module.params["wg"], required=True)
    present = os.path.isfile(path) and os.path.getsize(path) > 0
    changed = module.params["rotate"] or not present
    if changed and module.check_mode:
        module.exit_json(changed=True, public_key="")
    if changed:
        _write_private(module, path, wg)
    elif os.stat(path).st_mode & 0o077:
        changed = True
        if not module.check_mode:
            os.chmod(path, 0o600)
    with open(path) as fh:
        rc, public, err = module.run_command([wg, "pubkey"], data=fh.read(), binary_data=True)
    if rc != 0:
        module.fail_json(msg=f"wg pubkey rejects the key in {path}: {err.strip()}")
    module.exit_json(changed=changed, public_key=public.strip())


if __name__ == "__main__":
    main()
