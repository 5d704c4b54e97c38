"""Compute a launch's spec once, on the controller: what every rank of the job runs and sees."""

from pathlib import Path

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import lookalike, spec
from torchfleet.errors import InventoryError

display = Display()

DOCUMENTATION = r"""
module: launch_spec
short_description: Build the launch spec of a job (torchfleet.spec)
description:
  - Reads each node's settings and facts from the host variable I(node_var), checks them
    together, and returns the spec every start task applies and the plan shows. Fails with
    C(torchfleet_error) (host, variable) on bad input. Warns about inventory variables that
    look like torchfleet's but are not.
options:
  hosts: {description: The play's nodes., type: list, elements: str, required: true}
  group: {description: The launch group's hosts., type: list, elements: str, required: true}
  table: {description: rank_plan's rank table., type: dict, required: true}
  node_var: {description: The host variable with each node's settings and facts., type: str, default: launch__node}
  roles_dir: {description: torchfleet's roles, whose variables are known names., type: path, required: true}
  job: {description: The job-wide settings (run_id, job, mode, ...)., type: dict, required: true}
"""

ARGS = {
    "hosts": {"type": "list", "elements": "str", "required": True},
    "group": {"type": "list", "elements": "str", "required": True},
    "table": {"type": "dict", "required": True},
    "node_var": {"type": "str", "default": "launch__node"},
    "roles_dir": {"type": "path", "required": True},
    "job": {"type": "dict", "required": True},
}
# Variables torchfleet's own tasks set, which are not the user's to set.
_SET_BY_TASKS = {"cpu_pinning_plan", "overlay_node_address", "launch_plan_view"}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        hostvars = task_vars["hostvars"]
        job = dict(args["job"])
        known = lookalike.known_names(Path(args["roles_dir"])) | _SET_BY_TASKS
        warnings = [w for h in args["hosts"] for w in lookalike.lookalikes(h, list(hostvars[h].keys()), known)]
        try:
            outside = [h for h in args["hosts"] if h not in args["group"]]
            if outside:
                raise InventoryError("is not in the launch group launch_hosts_group", outside[0], "launch_hosts_group")
            spec.check_job(job.get("job"))
            job.update(run_id=job.get("run_id") or spec.new_run_id(), warnings=warnings)
            nodes = {h: hostvars[h][args["node_var"]] for h in args["hosts"]}
            built = spec.build(job, args["table"], nodes)
        except InventoryError as exc:
            return core.fail_input(result, exc)
        for w in warnings:
            display.warning(w["message"])
        result.update(changed=False, spec=spec.redacted(built))
        return result
