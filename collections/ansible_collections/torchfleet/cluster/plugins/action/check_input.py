"""Fail on bad input, naming the host and the variable as data."""

from ansible.errors import AnsibleActionFail
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
  msg:
    description: One sentence saying what is wrong and what would be right.
    type: str
  variable:
    description: The variable the user has to change.
    type: str
  kind:
    description:
      - C(input), C(node) for a node whose state does not fit the launch, or C(running) for
        a launch refused because its job still runs.
    type: str
    default: input
  checks:
    description:
      - Instead of one check, several (each with I(that), I(msg), I(variable) and I(kind)),
        in one task; each task costs a process per node. The first that fails gives the
        error's variable and kind; the message names every one that failed.
      - A check may name the I(host) it is about (a run_once task checking every node);
        without it, the check is about the task's own host. Checks that fail with the same
        message are named once, with all their hosts.
    type: list
    elements: dict
  consequence:
    description: What a failure means beyond the checks (C(so no rank was started on any node)), added to the message.
    type: str
"""

_KINDS = ["input", "node", "running"]
_CHECK = {"that": {"type": "bool", "required": True}, "msg": {"type": "str", "required": True},
          "variable": {"type": "str", "required": True}, "kind": {"type": "str", "choices": _KINDS, "default": "input"},
          "host": {"type": "str"}}
ARGS = {"that": {"type": "bool"}, "msg": {"type": "str"}, "variable": {"type": "str"},
        "kind": {"type": "str", "choices": _KINDS, "default": "input"},
        "checks": {"type": "list", "elements": "dict", "options": _CHECK}, "consequence": {"type": "str"}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        checks = args["checks"] if args["checks"] is not None else [args]
        if any(c.get(k) is None for c in checks for k in ("that", "msg", "variable")):
            raise AnsibleActionFail("check_input: give that, msg and variable, or checks")
        failed = [c for c in checks if not boolean(c["that"])]
        if not failed:
            result.update(changed=False)
            return result
        own = task_vars["inventory_hostname"]
        # A failure that many nodes share (a job still running on all 48) is said once.
        hosts: dict[str, list[str]] = {}
        for c in failed:
            hosts.setdefault(c["msg"], []).append(c.get("host") or own)
        msg = "; ".join(f"host{'s' if len(h) > 1 else ''} {', '.join(h)}: {m}" for m, h in hosts.items())
        if args["consequence"]:
            msg = f"{msg}; {args['consequence']}"
        error = InventoryError(msg, failed[0].get("host") or own, failed[0]["variable"])
        return core.fail_input(result, error, failed[0]["kind"])
