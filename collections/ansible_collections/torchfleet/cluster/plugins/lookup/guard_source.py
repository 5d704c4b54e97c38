"""The path of the guard's source on the controller, for a copy task to send to the nodes."""

from ansible.plugins.lookup import LookupBase

from ansible_collections.torchfleet.cluster.plugins.module_utils import guard

DOCUMENTATION = r"""
name: guard_source
short_description: Path of module_utils/guard.py, the guard every unit of a run starts under
description:
  - The guard is node-side code that runs with the ranks' own Python, not as an Ansible
    module, so the launch copies this file into each run's folder.
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [guard.__file__]
