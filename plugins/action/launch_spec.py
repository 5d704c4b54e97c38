"""Compute a launch's spec once, on the controller: what every rank of the job runs and sees."""

import json
import os
import secrets

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab
from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import cpus, hosts, inputs, spec
from torchfleet.errors import InventoryError

ARGS = {
    "hosts": {"type": "list", "elements": "str", "required": True},
    "group": {"type": "list", "elements": "str", "required": True},
    "table": {"type": "dict", "required": True},
    "job": {"type": "dict", "required": True},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        hostvars = task_vars["hostvars"]
        job = dict(args["job"])
        try:
            outside = [h for h in args["hosts"] if h not in args["group"]]
            if outside:
                raise InventoryError("is not in the launch group launch_hosts_group", outside[0], "launch_hosts_group")
            inputs.check_job(job.get("job"))
            job["run_id"] = inputs.check_run_id(job["run_id"]) if job.get("run_id") else inputs.new_run_id()
            # The node count is known once the ranks are numbered.
            guard = job["guard"] = dict(job.get("guard") or {})
            guard["min_nodes"] = inputs.check_min_nodes(guard.get("min_nodes"), args["table"]["num_nodes"])
            # Two names for one machine: what each node said of itself (node_probe's identity).
            hosts.refuse_same_identity({h: hostvars[h]["launch__node_state"].get("identity") for h in args["hosts"]})
            nodes = {h: _node(h, args["table"], job, hostvars[h]) for h in args["hosts"]}
            built = spec.build(job, args["table"], nodes)
        except InventoryError as exc:
            return core.fail_input(result, exc)
        redacted = spec.redacted(built)
        # The files every node's run folder gets, made once here rather than in every node's worker.
        # Without the nodes' own files, which each node has beside it: with them, every
        # node would get every other's guard config, the square of the cluster's size.
        kept = {k: v for k, v in redacted.items() if k != "files"}
        common = {run_vocab.SPEC: json.dumps(kept, sort_keys=True, separators=(",", ":"))}
        # The guard and the run's end, and beside them the modules they import (the run's
        # vocabulary among them).
        module_utils = os.path.dirname(run_vocab.__file__)
        for name in run_vocab.NODE_SOURCES:
            with open(os.path.join(module_utils, name)) as fh:
                common[name] = fh.read()
        # The run's own key, which its guards sign and check every value of their store with;
        # each node's start writes it readable by the run's owner only (run_folder.prepare).
        # It is in this result, so the result is shown to no one: the plan's lines are the
        # plan's own tasks', and a failure above shows as before.
        common[run_vocab.STORE_KEY] = secrets.token_hex(32)
        result.update(changed=False, spec=redacted, nodes=spec.redacted(nodes), common_files=common,
                      unit_index=spec.unit_index(redacted["units"]), listen_hosts=spec.listen_hosts(redacted["units"]),
                      _ansible_no_log=True)
        return result


def _node(host, table, job, hostvars):
    """What the spec needs of a node, from what its own tasks read: its checked input
    (launch_input), its checkpoint folder now that the run id is known, and its probe
    (node_probe), with its pinning planned from both."""
    probe, checked = hostvars["launch__node_state"], hostvars["launch__input"]
    folder = inputs.checkpoint_dir(checked["settings"], job["run_id"], job["guard"].get("max_restarts"))
    checked = dict(checked, settings=dict(checked["settings"], checkpoint_dir=folder))
    ranks = sum(1 for r in table["ranks"] if r["host"] == host)
    pinning = cpus.plan(host, probe.get("topology") or {}, ranks, checked["pinning"])
    return spec.node_entry(host, table, job.get("mode"), probe, checked, pinning)
