"""Compute a launch's spec once, on the controller: what every rank of the job runs and sees."""

import json
from pathlib import Path

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.torchfleet.cluster.plugins.module_utils import guard
from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import cpus, lookalike, spec
from torchfleet.errors import InventoryError

display = Display()

DOCUMENTATION = r"""
module: launch_spec
short_description: Build the launch spec of a job (torchfleet.spec)
description:
  - Reads what each node's own tasks found (launch_input's C(launch__input), node_probe's
    reading) through hostvars, plans each node's CPU pinning (torchfleet.cpus.plan),
    checks them together, and returns the spec every start task applies and the plan
    shows, each node's entry as I(nodes), the files every node's run folder gets
    (spec.json, the guard) as I(common_files), and each host's units by phase (indexes
    into the spec's units) as I(unit_index). Fails with C(torchfleet_error) (host,
    variable) on bad input. Warns about inventory variables that look like torchfleet's
    but are not.
options:
  hosts: {description: The play's nodes., type: list, elements: str, required: true}
  group: {description: The launch group's hosts., type: list, elements: str, required: true}
  table: {description: rank_plan's rank table., type: dict, required: true}
  roles_dir: {description: torchfleet's roles, whose variables are known names., type: path, required: true}
  job: {description: The job-wide settings (run_id, job, mode, ...)., type: dict, required: true}
"""

ARGS = {
    "hosts": {"type": "list", "elements": "str", "required": True},
    "group": {"type": "list", "elements": "str", "required": True},
    "table": {"type": "dict", "required": True},
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
            nodes = {h: _node(h, args["table"], job.get("mode"), hostvars[h]) for h in args["hosts"]}
            built = spec.build(job, args["table"], nodes)
        except InventoryError as exc:
            return core.fail_input(result, exc)
        for w in warnings:
            display.warning(w["message"])
        redacted = spec.redacted(built)
        # The files every node's run folder gets, made once here rather than in every node's worker.
        with open(guard.__file__) as fh:
            # Without the nodes' own files, which each node has beside it: with them, every
            # node would get every other's guard.json, the square of the cluster's size.
            kept = {k: v for k, v in redacted.items() if k != "files"}
            common = {"spec.json": json.dumps(kept, sort_keys=True, separators=(",", ":")), "guard.py": fh.read()}
        result.update(changed=False, spec=redacted, nodes=spec.redacted(nodes), common_files=common,
                      unit_index=spec.unit_index(redacted["units"]))
        return result


def _node(host, table, mode, hostvars):
    """What the spec needs of a node, from what its own tasks read: its checked input
    (launch_input) and its probe (node_probe), with its pinning planned from both."""
    probe, checked = hostvars["launch__node_state"], hostvars["launch__input"]
    ranks = sum(1 for r in table["ranks"] if r["host"] == host)
    pinning = cpus.plan(host, probe.get("topology") or {}, ranks, checked["pinning"])
    return spec.node_entry(host, table, mode, probe, checked, pinning)
