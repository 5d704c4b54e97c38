"""The guard's source, which the launch writes into each run's folder on the nodes."""

from ansible.plugins.lookup import LookupBase

from ansible_collections.torchfleet.cluster.plugins.module_utils import guard

DOCUMENTATION = r"""
name: guard_source
short_description: The source of module_utils/guard.py, the guard every unit of a run starts under
description:
  - The guard is node-side code that runs with the ranks' own Python, not as an Ansible
    module, so the launch writes it into each run's folder.
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        with open(guard.__file__) as fh:
            return [fh.read()]
