"""Each local rank's cpuset from the node's topology, or an input error naming the variable."""

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import cpus
from torchfleet.errors import InventoryError

DOCUMENTATION = r"""
module: cpu_plan
short_description: Plan the CPU pinning of a node's ranks
description:
  - Gives each local rank its own cores, from one NUMA node where they fit, else one
    socket, or checks explicit cpusets against the node's topology. Runs on the controller
    from M(torchfleet.cluster.cpu_topology)'s result.
options:
  topology: {description: cpu_topology's result., type: dict, required: true}
  ranks: {description: Ranks on the node., type: int, required: true}
  cores_per_rank: {description: Cores per rank; 0 splits them evenly., type: int, default: 0}
  use_hyperthreads: {description: Give a rank both threads of a core., type: bool, default: false}
  reserved: {description: CPUs no rank gets., type: str, default: ""}
  cpusets: {description: Explicit cpusets, one per local rank., type: list, elements: str, default: []}
"""

ARGS = {
    "topology": {"type": "dict", "required": True}, "ranks": {"type": "int", "required": True},
    "cores_per_rank": {"type": "int", "default": 0}, "use_hyperthreads": {"type": "bool", "default": False},
    "reserved": {"type": "str", "default": ""}, "cpusets": {"type": "list", "elements": "str", "default": []},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        host = task_vars["inventory_hostname"]
        pinning = {"enabled": True, "use_hyperthreads": args["use_hyperthreads"], "cores_per_rank": args["cores_per_rank"],
                   "reserved": args["reserved"], "cpusets": args["cpusets"]}
        try:
            plan = cpus.plan(host, args["topology"], args["ranks"], pinning)
        except InventoryError as exc:
            return core.fail_input(result, exc)
        result.update(changed=False, plan=plan)
        return result
