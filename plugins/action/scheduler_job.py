"""A run's job on the scheduler that runs its units (a launch mode with a Scheduler, unit kind
scheduler), on the node that submits it (the run's master): whether the scheduler would take
it (changing nothing), its submission, its state, its cancel. The mode's Scheduler does each
(torchfleet.modes); this action only gives it a shell on the node. Its refusals become
torchfleet errors naming the variable."""

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import modes
from torchfleet.errors import InventoryError

ARGS = {
    "state": {"type": "str", "choices": ["tested", "submitted", "described", "cancelled"], "required": True},
    "run_dir": {"type": "path", "required": True},
    # The run's launch spec (tested, submitted); else its launch mode names the scheduler.
    "spec": {"type": "dict"},
    "mode": {"type": "str"},
    "nodes": {"type": "dict", "default": {}},
    "timeout": {"type": "float", "default": 120},
    # submitted, for a detached launch: then wait until the master's unit that others start after listens.
    "listen": {"type": "bool", "default": False},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        self._vars = task_vars
        spec = args["spec"] or {}
        try:
            scheduler = modes.get(spec.get("mode") or args["mode"]).scheduler
            if scheduler is None:
                raise InventoryError(f"launch_mode={spec.get('mode') or args['mode']} has no scheduler", None,
                                     "launch_mode")
            if args["state"] == "cancelled":
                return dict(result, **scheduler.cancel(self._sh, args["run_dir"], args["timeout"]))
            if args["state"] == "described":
                return dict(result, changed=False, job=scheduler.describe(self._sh, args["run_dir"]))
            if not spec:
                raise InventoryError(f"scheduler_job: state={args['state']} needs spec", None, "launch_mode")
            if args["state"] == "tested":
                return dict(result, changed=False, said=scheduler.test(self._sh, spec, args["nodes"]))
            job_id = scheduler.submit(self._sh, spec, args["nodes"], args["run_dir"], args["timeout"])
        except InventoryError as exc:
            return core.fail_input(result, exc)
        result.update(changed=True, job_id=job_id)
        if args["listen"]:
            result["listen"] = self._wait_listen(spec, args)
        return result

    def _sh(self, script, *words, stdin=None):
        """``sh -c script sh words...`` on the node, as ansible.builtin.command returns it."""
        module_args = {"argv": ["sh", "-c", script, "sh", *words]}
        if stdin is not None:
            module_args["stdin"] = stdin
        return self._execute_module(module_name="ansible.builtin.command", module_args=module_args,
                                    task_vars=self._vars)

    def _wait_listen(self, spec, args):
        """wait_ranks' wait for the master's unit that others start after: each step leaves
        a bare process's files, so it is waited for as a process is."""
        unit = next(u for u in spec["units"] if u["host"] == spec["master_host"] and u.get("listen"))
        task = self._task.copy()
        task.args = {"run_dir": args["run_dir"], "expected": 1, "poll_interval": 0.5, "timeout": int(args["timeout"]),
                     "listen_host": unit["listen"]["host"], "listen_port": unit["listen"]["port"],
                     "node_dir": args["run_dir"].rsplit("/runs/", 1)[0], "run_id": spec["run_id"]}
        waited = self._shared_loader_obj.action_loader.get(
            "torchfleet.cluster.wait_ranks", task=task, connection=self._connection, play_context=self._play_context,
            loader=self._loader, templar=self._templar, shared_loader_obj=self._shared_loader_obj).run(task_vars=self._vars)
        return {"outcome": waited.get("outcome"), "reason": waited.get("reason")}
