"""Pack the workload into one deterministic tar on the controller, and say how to start it."""

from pathlib import Path

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import workload
from torchfleet.errors import InventoryError

ARGUMENT_SPEC = {
    "src": {"type": "path", "required": True},
    "dest": {"type": "path", "required": True},
    "entrypoint": {"type": "str", "default": ""},
    "python": {"type": "str", "required": True},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGUMENT_SPEC)
        try:
            # The entrypoint first: a bad one leaves no archive behind.
            argv = workload.entrypoint_argv(args["src"], args["entrypoint"], args["python"])
            Path(args["dest"]).parent.mkdir(parents=True, exist_ok=True)
            packed = workload.pack(args["src"], args["dest"])
        except InventoryError as exc:
            return core.fail_input(result, exc)
        except OSError as exc:
            # An unreadable file or unwritable dest: a message, not a traceback.
            result.update(failed=True, msg=f"workload_pack {args['src']} -> {args['dest']}: {exc}")
            return result
        result.update(changed=False, archive=packed["archive"], sha256=packed["sha256"],
                      files=packed["files"], argv=argv)
        return result
