"""Fail on bad input, naming the host and the variable as data."""

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet.errors import InventoryError

DOCUMENTATION = r"""
module: check_input
short_description: An input check whose failure carries its host and variable
description:
  - Like M(ansible.builtin.assert) for the inventory's input, but a failure returns
    C(torchfleet_error) with the host and the variable, which the API and the CLI read to
    tell bad input (exit 2) from a node that failed (exit 3).
options:
  that:
    description: The condition, already evaluated (C("{{ ... }}")); false fails.
    type: bool
    required: true
  msg:
    description: One sentence saying what is wrong and what would be right.
    type: str
    required: true
  variable:
    description: The variable the user has to change.
    type: str
    required: true
  kind:
    description: C(input), or C(running) for a launch refused because its job still runs.
    type: str
    default: input
"""

ARGS = {"that": {"type": "bool", "required": True}, "msg": {"type": "str", "required": True},
        "variable": {"type": "str", "required": True},
        "kind": {"type": "str", "choices": ["input", "running"], "default": "input"}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        if boolean(args["that"]):
            result.update(changed=False)
            return result
        host = task_vars["inventory_hostname"]
        return core.fail_input(result, InventoryError(args["msg"], host, args["variable"]), args["kind"])
