"""Check a node's launch input and keep what the launch spec needs of it, in one call."""

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import spec
from torchfleet.errors import InventoryError

DOCUMENTATION = r"""
module: launch_input
short_description: Check a node's launch input and keep its settings as the fact launch__input
description:
  - Reads the host's launch variables itself (torchfleet.spec.INPUT_VARIABLES) and checks
    what argument_specs cannot: the numbers' ranges and the names of the secret
    environment. A failure returns C(torchfleet_error) with the host and the variable,
    every failure in one message.
  - Sets the fact C(launch__input) (settings, env_public, env_shown, has_secrets), which
    launch_spec reads through hostvars. Secret values never enter it.
  - The checks and settings are Python, not Jinja: Ansible compiles every expression again
    in every node's worker, which made this the launch's costliest task per node.
options: {}
"""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        core.validate_args(self, {})
        host = task_vars["inventory_hostname"]
        values = self._templar.template({n: task_vars[n] for n in spec.INPUT_VARIABLES if n in task_vars})
        try:
            checked = spec.node_input(values, host)
        except InventoryError as exc:
            return core.fail_input(result, exc)
        result.update(changed=False, ansible_facts={"launch__input": checked})
        return result
