"""Wait for a node's ranks; stop everything as soon as any rank anywhere fails.

Ansible runs one copy of this per node, in parallel. They share an abort folder on the
controller: the first copy that sees a rank exit non-zero (or vanish, or time out)
drops a file there, and every other copy notices it on its next poll and returns, so
the play can stop all ranks at once instead of leaving them hung in a collective.
"""

import json
import time
from pathlib import Path

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.torchfleet.cluster.plugins.module_utils.run_folder import write_whole

display = Display()

DOCUMENTATION = r"""
module: wait_ranks
short_description: Wait for the rank containers of a run, failing fast across nodes
options:
  labels:
    description: Labels that select this run's containers (rank_containers).
    type: dict
  run_dir:
    description: The run's folder on the node, for bare-process ranks (rank_processes).
    type: path
  expected:
    description: How many rank containers this node should have.
    type: int
    required: true
  abort_dir:
    description: A folder on the controller shared by every node's copy of this task.
    type: path
    required: true
  poll_interval:
    description: Seconds between polls.
    type: float
    default: 2
  progress_interval:
    description: Seconds between progress lines.
    type: float
    default: 10
  timeout:
    description: Seconds before the job counts as hung; 0 waits for ever.
    type: int
    default: 0
  listen_host:
    description: With I(listen_port), return as soon as this address accepts connections.
    type: str
  listen_port:
    description: The port to watch for, such as MASTER_PORT on the master.
    type: int
  node_dir:
    description: With I(run_id), where the units' guards record their state; a unit whose guard says it exited 0 counts as done, though its guard (the store's host) stays up.
    type: path
  run_id:
    description: The run, with I(node_dir).
    type: str
"""


LISTEN_WAIT = 5


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        host = task_vars["inventory_hostname"]
        abort_dir = Path(args["abort_dir"])
        abort_dir.mkdir(parents=True, exist_ok=True)
        poll = float(args.get("poll_interval", 2))
        progress_every = float(args.get("progress_interval", 10))
        timeout = int(args.get("timeout", 0))
        expected = int(args["expected"])
        listen = (args["listen_host"], int(args["listen_port"])) if args.get("listen_port") else None
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
                # Its ranks can no longer be watched, so nobody else's may go on either.
                reason = "could not read its ranks: {}".format(status.get("msg", "unknown error"))
                _post_abort(abort_dir, host, reason)
                return status
            containers = status["containers"]
            failed = [c for c in containers if c["exit_code"] not in (None, 0)]
            reason = None
            if failed:
                reason = "{} exited with code {}".format(_who(failed[0]), failed[0]["exit_code"])
            elif len(containers) < expected:
                reason = f"{expected - len(containers)} rank container(s) vanished"
            elif timeout and time.monotonic() - started > timeout:
                reason = (
                    f"{listen[0]}:{listen[1]} did not listen within {timeout}s (launch_master_wait_timeout)"
                    if listen
                    else f"no result after {timeout}s (launch_timeout)"
                )
            if reason:
                _post_abort(abort_dir, host, reason)
                outcome = "failed"
                break
            if all(c["exit_code"] == 0 for c in containers):
                outcome = "succeeded"
                break
            left = timeout - (time.monotonic() - started) if timeout else None
            if listen and self._listening(listen, task_vars, left):
                outcome = "listening"
                break
            if listen and args.get("run_id") and self._guards_done(args, expected, task_vars):
                outcome = "succeeded"
                break
            peers = sorted(abort_dir.glob("abort-*.json"))
            if peers:
                reason = json.loads(peers[0].read_text())
                reason = "{} on {}".format(reason["reason"], reason["host"])
                outcome = "peer-failed"
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

    def _guards_done(self, args, expected, task_vars):
        """Every unit of this node ended with code 0, by its guard's record (the store's host
        records its child's exit at once, and stays up for the others)."""
        state = self._execute_module(module_name="torchfleet.cluster.run_state",
                                     module_args={"node_dir": args["node_dir"], "run_id": args["run_id"]},
                                     task_vars=task_vars)
        units = (state.get("run") or {}).get("units") or []
        ended_ok = [u.get("child_exit_code") == 0 or (u["state"] == "exited" and u.get("exit_code") == 0)
                    for u in units]
        return len(units) >= expected and all(ended_ok)

    def _listening(self, listen, task_vars, left=None):
        """The port, waited for on the node for up to LISTEN_WAIT seconds (wait_for tries it
        every second), or what is left of the timeout: while the master starts, one call
        instead of one per poll. A rank that fails meanwhile is seen at the next poll."""
        probe = self._execute_module(
            module_name="ansible.builtin.wait_for",
            module_args={"host": listen[0], "port": listen[1],
                         "timeout": max(1, int(min(LISTEN_WAIT, left if left is not None else LISTEN_WAIT)))},
            task_vars=task_vars,
        )
        return not probe.get("failed")


def _post_abort(abort_dir, host, reason):
    """Peers poll the folder in parallel: the file appears whole, by a rename from a name
    (``abort-HOST.json.tmp``) that their glob does not match."""
    write_whole(str(abort_dir / f"abort-{host}.json"), json.dumps({"host": host, "reason": reason}))


def _who(container):
    """rank N, or mpirun / sshd in the mpirun mode."""
    role = container.get("role", "rank")
    return f"rank {container['rank']}" if role == "rank" else role
