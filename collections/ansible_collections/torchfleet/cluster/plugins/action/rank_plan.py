"""Validate the inventory and build the rank table, on the controller, changing nothing."""

from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import overlay, ranks
from torchfleet.errors import InventoryError

DOCUMENTATION = r"""
module: rank_plan
short_description: Build and validate the rank table of a job
description:
  - Orders the nodes by C(torchfleet_node_rank) or inventory order, numbers the ranks,
    and picks MASTER_ADDR. Fails with the host and variable named on bad input.
options:
  hosts:
    description: The nodes of the job, in inventory order.
    type: list
    elements: str
    required: true
  overlay:
    description:
      - Take each node's address from its overlay interface (launch_transport wireguard),
        the interface launch_input kept in C(launch__input), read in node_probe's C(ip_addr)
        (C(launch__node_state)). A node whose overlay is down fails, by name.
      - Otherwise each node's address comes from its variables and facts
        (C(torchfleet_cluster_address), C(torchfleet_cluster_network), C(ansible_host)).
    type: bool
    default: false
  master_port:
    description: The rendezvous port on the master.
    type: int
    default: 29500
"""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
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
                        "address": _overlay_address(name, hv) if boolean(args.get("overlay", False))
                        else ranks.cluster_address_of(name, hv),
                    }
                )
            table = ranks.rank_table(nodes, args.get("master_port", 29500))
        except InventoryError as exc:
            return core.fail_input(result, exc)
        result.update(changed=False, plan=table)
        return result


def _overlay_address(name, hv):
    if "launch__input" not in hv or "launch__node_state" not in hv:
        raise InventoryError("has no overlay address: its checks failed (see above)", name, overlay.TRANSPORT_VAR)
    return overlay.interface_address(name, hv["launch__input"]["overlay_interface"], hv["launch__node_state"]["ip_addr"])
