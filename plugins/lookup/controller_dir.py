"""The controller's folders for a user's runs and state, as torchfleet.workdir decides them."""

from __future__ import annotations

DOCUMENTATION = r"""
name: controller_dir
short_description: Where a user's runs and the controller's state go
description:
  - Returns a folder on the controller, as an absolute path.
  - C(runs) is C($TORCHFLEET_RUNS_DIR), else C(runs/) in the folder that ansible-playbook runs in.
  - C(state) is C($TORCHFLEET_STATE_DIR), else C(.torchfleet/) there (SSH keys, the cluster CA, the image archive, the dataset).
  - C(work) is that folder itself.
  - The C(torchfleet) command and its Python API set both variables; an installed collection never writes inside itself.
author: torchfleet developers (!UNKNOWN)
options:
  _terms:
    description: One of C(runs), C(state) or C(work).
    required: true
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Show where this run's files come back
  ansible.builtin.debug:
    msg: "{{ lookup('torchfleet.cluster.controller_dir', 'runs') }}/{{ launch_run_id }}"
"""

RETURN = r"""
_raw:
  description: The folder's absolute path, one per term.
  type: list
  elements: str
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core  # noqa: F401  # pylint: disable=unused-import
from torchfleet import workdir


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        unknown = [t for t in terms if t not in workdir.FOLDERS]
        if unknown:
            raise AnsibleLookupError(f"controller_dir knows {', '.join(sorted(workdir.FOLDERS))}, not {', '.join(unknown)}")
        return [str(workdir.FOLDERS[term](os.getcwd())) for term in terms]
