"""Follow a run from the controller until it ends, reading only the master's job.json.

The guards on the cluster supervise the run; this only looks. It holds one connection (the
master's), whatever the number of nodes, and ends when the run does, or when the master
stops answering (the other nodes' guards then stop their ranks themselves). Each call waits
on the master until the run ends or the next progress line is due, reading job.json there
every poll: one module run per progress line instead of one per poll.

With restarts, a master whose job.json says the run moved on ends the follow as ``moved``;
the launch role's follow.yml then follows the next node in node order with ``takeover``.
"""

import time

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import attempts

display = Display()

ARGS = {
    "node_dir": {"type": "path", "required": True},
    "run_id": {"type": "str", "required": True},
    "poll_interval": {"type": "float", "default": 0.5},
    "progress_interval": {"type": "float", "default": 10.0},
    "start_timeout": {"type": "float", "default": 120.0},
    "stale_after": {"type": "float", "default": 20.0},
    # A node followed because the master was lost or moved (restarts): a job.json that does
    # not appear within start_timeout means the run went on elsewhere, not that it never began.
    "takeover": {"type": "bool", "default": False},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = self._follow(super().run(tmp, task_vars), task_vars)
        outcome = result.get("outcome")
        # What the role decides from the outcome, said here once (run_vocab.FollowOutcome):
        # whether to follow the next node (the master was lost, or the run moved on), whether
        # the guards end the run by themselves (the launch need not stop it), and whether a
        # node asked to take over held the run's record. A follow that failed (the node's read
        # failed) goes on to the next node, as a lost master's.
        result.update(follow_on=outcome in (None, vocab.FollowOutcome.MASTER_LOST, vocab.FollowOutcome.MOVED),
                      left_to_guards=outcome in (vocab.FollowOutcome.FINISHED, vocab.FollowOutcome.MASTER_LOST,
                                                 vocab.FollowOutcome.MOVED),
                      took_over=outcome != vocab.FollowOutcome.ABSENT)
        return result

    def _follow(self, result, task_vars):
        args = core.validate_args(self, ARGS)
        # follow.yml follows a node that took the run over from the task's host (delegate_to).
        host = self._task.delegate_to or task_vars["inventory_hostname"]
        started = time.monotonic()
        last_progress = started
        while True:
            wait = max(args["poll_interval"], args["progress_interval"] - (time.monotonic() - last_progress))
            try:
                state = self._execute_module(module_name="torchfleet.cluster.run_state",
                                             module_args={"node_dir": args["node_dir"], "run_id": args["run_id"],
                                                          "tail_lines": 1, "wait": wait,
                                                          "poll": args["poll_interval"]}, task_vars=task_vars)
            except AnsibleConnectionFailure as exc:
                state = {"unreachable": True, "msg": str(exc)}
            if state.get("unreachable"):
                abort = {"kind": vocab.AbortKind.NODE_LOST.value, "host": host, "hosts": [host],
                         "reason": f"the master node {host} stopped answering the controller: "
                                   f"{state.get('msg', '').strip()[:200]}"}
                result.update(changed=False, outcome=vocab.FollowOutcome.MASTER_LOST.value,
                              state=vocab.run_state(job={"abort": abort}), abort=abort)
                return result
            if state.get("failed"):
                return dict(result, failed=True, msg=f"could not read run {args['run_id']} on {host}: {state.get('msg')}")
            run = state.get("run") or {}
            job = run.get("job_state")
            if job and not attempts.speaks_for_run(job):
                # A master that the run left (restarts): follow.yml follows the next node.
                result.update(changed=False, outcome=vocab.FollowOutcome.MOVED.value, state=vocab.run_state(job=job),
                              abort=job.get("abort"), job=job, moved_to=job.get(attempts.MOVED_TO))
                return result
            if job and job["state"] != vocab.RunState.RUNNING:
                result.update(changed=False, outcome=vocab.FollowOutcome.FINISHED.value, state=vocab.run_state(job=job),
                              abort=job.get("abort"), job=job)
                return result
            if job and (run.get("job_age_s") or 0) > args["stale_after"]:
                abort = {"kind": vocab.AbortKind.STOPPED.value, "host": host,
                         "reason": f"the guard hosting the run's store on {host} is gone ({vocab.JOB} not "
                                   f"updated for {run['job_age_s']:g}s): it was killed, or its unit "
                                   "removed (torchfleet down)"}
                result.update(changed=False, outcome=vocab.FollowOutcome.FINISHED.value,
                              state=vocab.run_state(job={"abort": abort}), job=job, abort=abort)
                return result
            if not job and time.monotonic() - started > args["start_timeout"] and args["takeover"]:
                result.update(changed=False, outcome=vocab.FollowOutcome.ABSENT.value, state=None, abort=None)
                return result
            if not job and time.monotonic() - started > args["start_timeout"]:
                # Not a rank's failure: nothing of the run got going (a start cut short, a
                # guard that could not start), which the CLI reports as a failed task.
                abort = {"kind": vocab.AbortKind.NOT_STARTED.value, "host": host,
                         "reason": f"the guard hosting the supervision store on {host} never wrote "
                                   f"{vocab.JOB} within {args['start_timeout']:g}s"}
                result.update(changed=False, outcome=vocab.FollowOutcome.FINISHED.value,
                              state=vocab.run_state(job={"abort": abort}), abort=abort)
                return result
            if time.monotonic() - last_progress >= args["progress_interval"]:
                last_progress = time.monotonic()
                display.display(progress_line(run, time.monotonic() - started))


def progress_line(run, elapsed):
    """One line: the run's age, its slowest heartbeat, and the master's latest log line."""
    job = run.get("job_state") or {}
    ages = [u["heartbeat_age_s"] for u in job.get("units", []) if u.get("heartbeat_age_s") is not None]
    logs = run.get("logs") or {}
    main = sorted(n for n in logs if not attempts.is_attempt_log(n))
    name = vocab.rank_log(0) if vocab.rank_log(0) in logs else next(iter(main), None)
    last = (logs.get(name) or [""])[-1][-110:] if name else ""
    beat = f", oldest heartbeat {max(ages):.1f}s" if ages else ""
    attempt = attempts.running_words(job)
    return (f"  [{int(elapsed)}s] run {run.get('run_id')} {job.get('state', 'starting')}"
            f"{f' ({attempt})' if attempt else ''}{beat}; {name or ''}: {last}")
