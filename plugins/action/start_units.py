"""A node's start, in one task and one module run: its run's folder (the spec, the guard, a
changed workload, and the ranks' secret environment where they read it from a file) and its
units, by the kind of unit the spec starts there. Containers start in run_state's call that
makes the folder (through community.docker's Docker API client, module_utils/rank_start.py);
bare processes in rank_processes', which makes the folder too; a scheduler's job gets only
the folder here, and the master submits it after (scheduler_job). Where the launch is detached and a unit of this node is one that others
start after (the master's rendezvous, mpirun's sshd), the task then waits until it listens
(wait_ranks), since a detached launch says the run started only then.

One task rather than one per step: every task costs the controller a process per node."""

import json
import shlex

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab

KINDS = ("container", "process", "scheduler")
ARGS = {
    "kind": {"type": "str", "choices": list(KINDS), "required": True},
    # The run's folder, as run_state's state=present takes it (and rank_processes' run).
    "run": {"type": "dict", "required": True},
    "units": {"type": "list", "elements": "dict", "default": []},
    "image": {"type": "str"},
    "job": {"type": "str", "required": True},
    "secret_env": {"type": "dict", "default": {}, "no_log": True},
    # Whether this node's ranks source the secret environment from the run's folder.
    "secret_env_file": {"type": "bool", "default": False},
    # For a detached launch: how long a unit that others start after may take to listen.
    "listen_timeout": {"type": "int"},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        checked = ArgumentSpecValidator(ARGS).validate(self._task.args)
        if checked.error_messages:
            return dict(result, failed=True, msg=f"{self._task.action}: " + "; ".join(checked.error_messages))
        args = checked.validated_parameters
        self._vars = task_vars
        run = dict(args["run"])
        secret_file = self._secret_file(args)
        if args["kind"] == "process":
            entries = [self._process_entry(u, args["job"]) for u in args["units"]]
            done = self._action("torchfleet.cluster.rank_processes", {
                "run_dir": f"{run['node_dir']}/runs/{run['run_id']}", "state": "started", "run": run,
                "ranks": entries, "secret_env": args["secret_env"]})
        else:
            folder = dict(run, state="present", secret_files=secret_file)
            if args["kind"] == "container":
                # Exited leftovers of this job only: a running one was refused, or replaced.
                # Each one's log is kept in its own run's folder. The units start in the same
                # call, once the folder is there.
                folder.update(leftovers={"torchfleet.job": args["job"]}, image=args["image"],
                              containers=[self._container(u, args) for u in args["units"]])
            done = self._action("torchfleet.cluster.run_state", folder)
        if done.get("failed"):
            return dict(result, **self._quiet(done))
        result.update(changed=bool(done.get("changed")), started=done.get("started") or [u["name"] for u in args["units"]],
                      workload=done.get("workload"), removed=done.get("removed", []))
        listener = next((u for u in args["units"] if u.get("listen")), None)
        if args["listen_timeout"] is not None and listener is not None and args["kind"] != "scheduler":
            result["listen"] = self._wait_listen(listener, args, run)
        return result

    def _secret_file(self, args):
        """The node's secret environment as the file its ranks source (run_vocab.SECRET_ENV),
        one shell-quoted KEY=value a line, where they read it from the run's folder."""
        if not (args["secret_env_file"] and args["secret_env"]):
            return {}
        return {vocab.SECRET_ENV: "".join(f"{k}={shlex.quote(str(v))}\n" for k, v in args["secret_env"].items())}

    @staticmethod
    def _process_entry(unit, job):
        """A process unit as rank_processes takes it; its secret values are the module's to add."""
        return {"rank": (unit["ranks"] or [0])[0], "name": unit["name"], "role": unit["role"], "job": job,
                "argv": unit["command"], "env": {k: v for k, v in unit["env"].items() if k not in unit["secret_env"]},
                "cwd": unit["workdir"], "cpuset": unit["cpuset"]}

    @staticmethod
    def _container(unit, args):
        """A container unit as run_state starts it: its env with the secret values in, and a
        label (torchfleet.secret_env) that says what a report may show of them."""
        secret = {k: str(v) for k, v in args["secret_env"].items() if k in unit["secret_env"]}
        shown = {k: str(unit["env"][k]) for k in unit["secret_env"] if k in unit["env"]}
        return dict(unit, env=dict({k: str(v) for k, v in unit["env"].items()}, **secret),
                    labels=dict(unit["labels"], **{"torchfleet.secret_env": json.dumps(shown)}))

    def _wait_listen(self, unit, args, run):
        """wait_ranks' wait for this node's unit that others start after."""
        kind = "process" if args["kind"] == "process" else "container"
        waited = self._action("torchfleet.cluster.wait_ranks", {
            "labels": {"torchfleet.run": run["run_id"], "torchfleet.role": unit["role"]},
            **({"run_dir": f"{run['node_dir']}/runs/{run['run_id']}"} if kind == "process" else {}),
            "expected": sum(1 for u in args["units"] if u["role"] == unit["role"]),
            "poll_interval": 0.5, "timeout": args["listen_timeout"],
            "listen_host": unit["listen"]["host"], "listen_port": unit["listen"]["port"],
            "node_dir": run["node_dir"], "run_id": run["run_id"]})
        return {"outcome": waited.get("outcome"), "reason": waited.get("reason")}

    def _action(self, name, args):
        """Another of the collection's actions, for this task's host, with ``args``."""
        task = self._task.copy()
        task.args = args
        action = self._shared_loader_obj.action_loader.get(
            name, task=task, connection=self._connection, play_context=self._play_context, loader=self._loader,
            templar=self._templar, shared_loader_obj=self._shared_loader_obj)
        return action.run(task_vars=self._vars)

    @staticmethod
    def _quiet(done):
        """A failed step's result, less what it was given (a module's invocation)."""
        return {k: v for k, v in done.items() if k != "invocation"}
