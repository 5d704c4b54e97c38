"""Wait for a node's units of a start phase: until they listen, or end, or one fails.

Ansible runs one copy of this per node, in parallel. They need no channel of their own to
stop each other: a unit that fails makes its guard abort the run through the guards' store,
every other guard stops its unit, and each copy here sees its own unit end. A unit its guard
stopped is reported as ``peer-failed``, with the reason the guards recorded (the run's
abort), read from the node's run folder once it ends.
"""

import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core

display = Display()

LISTEN_WAIT = 5
ARGS = {
    "labels": {"type": "dict"},
    "run_dir": {"type": "path"},
    "expected": {"type": "int", "required": True},
    "poll_interval": {"type": "float", "default": 2.0},
    "progress_interval": {"type": "float", "default": 10.0},
    "timeout": {"type": "int", "default": 0},
    "listen_host": {"type": "str", "required": True},
    "listen_port": {"type": "int", "required": True},
    "node_dir": {"type": "path", "required": True},
    "run_id": {"type": "str", "required": True},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        if not args["run_dir"] and not args["labels"]:
            return dict(result, failed=True, msg="wait_ranks: labels (containers) or run_dir (processes) is required")
        host = task_vars["inventory_hostname"]
        poll = args["poll_interval"]
        progress_every = args["progress_interval"]
        timeout = args["timeout"]
        expected = args["expected"]
        listen = (args["listen_host"], args["listen_port"])
        started = time.monotonic()
        last_progress = started

        while True:
            # Containers or bare processes: both modules report ranks in one shape.
            status = self._execute_module(
                module_name="torchfleet.cluster.rank_processes" if args.get("run_dir")
                else "torchfleet.cluster.rank_containers",
                module_args={"run_dir": args["run_dir"]} if args.get("run_dir") else {"labels": args["labels"]},
                task_vars=task_vars,
            )
            if status.get("failed"):
                return status
            containers = status["containers"]
            failed = [c for c in containers if c["exit_code"] not in (None, 0)]
            reason = None
            if failed:
                reason = "{} exited with code {}".format(_who(failed[0]), failed[0]["exit_code"])
            elif len(containers) < expected:
                reason = f"{expected - len(containers)} rank container(s) vanished"
            elif timeout and time.monotonic() - started > timeout:
                reason = f"{listen[0]}:{listen[1]} did not listen within {timeout}s (launch_master_wait_timeout)"
            if reason:
                outcome = vocab.StartOutcome.FAILED.value
                stopped = failed and self._abort(args, task_vars)
                if stopped:
                    # Its guard stopped it: the run's abort names the cause, elsewhere.
                    outcome, reason = vocab.StartOutcome.PEER_FAILED.value, stopped["reason"]
                break
            if all(c["exit_code"] == 0 for c in containers):
                outcome = vocab.StartOutcome.SUCCEEDED.value
                break
            left = timeout - (time.monotonic() - started) if timeout else None
            if self._listening(listen, task_vars, left):
                outcome = vocab.StartOutcome.LISTENING.value
                break
            if self._guards_done(args, expected, task_vars):
                outcome = vocab.StartOutcome.SUCCEEDED.value
                break
            if time.monotonic() - last_progress >= progress_every:
                last_progress = time.monotonic()
                for c in containers:
                    display.display(f"  [{host}] {_who(c)} ({c['status']}): {c.get('last_line', '')[-110:]}")
            time.sleep(poll)

        result.update(
            changed=False,
            outcome=outcome,
            reason=reason,
            containers=containers,
            waited_s=round(time.monotonic() - started, 1),
        )
        return result

    def _units(self, args, task_vars):
        """This node's units of the run, as their guards recorded them."""
        state = self._execute_module(module_name="torchfleet.cluster.run_state",
                                     module_args={"node_dir": args["node_dir"], "run_id": args["run_id"]},
                                     task_vars=task_vars)
        return (state.get("run") or {}).get("units") or []

    def _guards_done(self, args, expected, task_vars):
        """Every unit of this node ended with code 0, by its guard's record (the store's host
        records its child's exit at once, and stays up for the others)."""
        units = self._units(args, task_vars)
        ended_ok = [u.get("child_exit_code") == 0 or (u["state"] == vocab.UnitState.EXITED and u.get("exit_code") == 0)
                    for u in units]
        return len(units) >= expected and all(ended_ok)

    def _abort(self, args, task_vars):
        """The run's abort, where a guard of this node stopped its unit because of it."""
        return next((u["abort"] for u in self._units(args, task_vars)
                     if u["state"] == vocab.UnitState.STOPPED and u.get("abort")), None)

    def _listening(self, listen, task_vars, left=None):
        """The port, waited for on the node for up to LISTEN_WAIT seconds (listen_wait tries
        it every 50 ms), or what is left of the timeout: while the master starts, one call
        instead of one per poll. A rank that fails meanwhile is seen at the next poll."""
        probe = self._execute_module(
            module_name="torchfleet.cluster.listen_wait",
            module_args={"host": listen[0], "port": listen[1],
                         "timeout": max(1, min(LISTEN_WAIT, left if left is not None else LISTEN_WAIT))},
            task_vars=task_vars,
        )
        return bool(probe.get("listening"))


def _who(container):
    """rank N, or mpirun / sshd in the mpirun mode."""
    role = container.get("role", "rank")
    return f"rank {container['rank']}" if role == "rank" else role
