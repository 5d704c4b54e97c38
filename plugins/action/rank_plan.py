"""Validate the inventory and build the rank table, on the controller, changing nothing."""

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import overlay, ranks
from torchfleet.errors import InventoryError

ARGS = {
    "hosts": {"type": "list", "elements": "str", "required": True},
    "overlay": {"type": "bool", "default": False},
    "master_port": {"type": "int", "default": 29500},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        hostvars = task_vars["hostvars"]
        nodes = []
        try:
            for name in args["hosts"]:
                hv = hostvars[name]
                nodes.append(
                    {
                        "name": name,
                        "node_rank": hv.get(ranks.NODE_RANK_VAR),
                        "procs": hv.get(ranks.PROCS_VAR),
                        "address": _overlay_address(name, hv) if args["overlay"]
                        else ranks.cluster_address_of(name, hv),
                    }
                )
            table = ranks.rank_table(nodes, args["master_port"])
        except InventoryError as exc:
            return core.fail_input(result, exc)
        result.update(changed=False, plan=table)
        return result


def _overlay_address(name, hv):
    if "launch__input" not in hv or "launch__node_state" not in hv:
        raise InventoryError("has no overlay address: its checks failed (see above)", name, overlay.TRANSPORT_VAR)
    return overlay.interface_address(name, hv["launch__input"]["overlay_interface"], hv["launch__node_state"]["ip_addr"])
