"""Each role's input on a host, as one digest (torchfleet.site_state), for site.yml's skip."""

from __future__ import annotations

DOCUMENTATION = r"""
name: role_inputs
short_description: Each role's input on a host, as a digest, and what its record checks
description:
  - For each role named, the host's values of the role's variables - its defaults (and its
    dependencies') under the host's own variables, templated as the role would see them - and
    the role's files, the collection's plugins, the torchfleet package, and the controller files
    the role sends, made into one HMAC-SHA256 under the controller's key
    (C($TORCHFLEET_STATE_DIR/site-digest.key), made on first use); with the checks that the
    node's record keeps for it (torchfleet.site_state.CHECKS).
  - Returns one dictionary, role name to C(digest) and C(checks); null for a role that always
    runs (torchfleet.site_state.ALWAYS), or whose variables cannot be templated yet.
author: torchfleet developers (!UNKNOWN)
options:
  _terms:
    description: The roles' names.
    required: true
    type: list
    elements: str
  roles_dir:
    description: The folder that holds the roles (the collection's C(roles)).
    required: true
    type: path
"""

EXAMPLES = r"""
- name: Show each role's digest on this host
  ansible.builtin.debug:
    msg: "{{ lookup('torchfleet.cluster.role_inputs', 'image', 'dataset', roles_dir=playbook_dir ~ '/../roles') }}"
"""

RETURN = r"""
_raw:
  description: One dictionary, role name to its C(digest) and C(checks), or null.
  type: list
  elements: dict
"""

import os

from ansible.errors import AnsibleError
from ansible.plugins.lookup import LookupBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core  # noqa: F401  # pylint: disable=unused-import
from torchfleet import __version__, site_state, workdir


class LookupModule(LookupBase):
    def _load(self, path):
        try:  # ansible-core 2.19 renders only what was loaded as trusted
            return self._loader.load_from_file(path, trusted_as_template=True)
        except TypeError:
            return self._loader.load_from_file(path)

    def _values(self, folders, role, variables):
        """The role's variables as its tasks see them: its defaults, the host's own above them."""
        defaults = {}
        for folder in reversed(folders):
            path = folder / "defaults" / "main.yml"
            if path.is_file():
                defaults.update(self._load(str(path)) or {})
        scope = dict(defaults)
        scope.update(variables, role_path=str(folders[0]), role_name=role)
        templar = self._templar.copy_with_new_env(available_variables=scope)
        names = sorted(name for name in defaults if name.startswith(f"{role}_"))
        return {name: templar.template(scope[name]) for name in names}

    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        # The checkout's collection links to its roles: one folder, whichever way it is named.
        roles_dir = os.path.realpath(self.get_option("roles_dir"))
        key = site_state.digest_key(workdir.state_dir(os.getcwd()))
        code = site_state.code_state([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                      site_state.package_folder()])
        found = {}
        for role in terms:
            if role not in site_state.CHECKS:
                found[role] = None
                continue
            folders = site_state.role_folders(roles_dir, role)
            if not folders[0].is_dir():
                raise AnsibleError(f"role_inputs: no role {role} in {roles_dir}")
            try:
                values = self._values(folders, role, variables or {})
            except AnsibleError:  # a default that needs what only the role's own tasks set: the role runs
                found[role] = None
                continue
            found[role] = site_state.role_input(role, values, key=key, content=site_state.content_hash(folders),
                                                code=code, version=__version__)
        return [found]
