"""Fail on bad input, naming the host and the variable as data."""

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet.errors import InventoryError

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
