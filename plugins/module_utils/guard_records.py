"""A guard's records in its run's folder: its unit's (guard-N.json) and its lines in the unit's
log, and on the guard that hosts the store, the run's (job.json) with the table of its
attempts. Shipped beside guard.py into each run's folder (run_vocab.GUARD_SOURCES).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import datetime, timezone

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_policy as policy
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
except ImportError:  # on a node: imported by guard.py from the run's folder, where its siblings lie beside it
    import guard_policy as policy
    import run_vocab as vocab

# The node's secret environment for mpirun's ranks (the launch role's secret_env_file.yml):
# no rank of the run starts once a unit of it has ended, so the first guard to end removes
# it, also on a node the controller lost and could not clean.
SECRET_FILES = (vocab.SECRET_ENV,)


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1)
    os.replace(tmp, path)


class Records:
    """Unit ``index``'s record (``state``), and the run's table of attempts (``attempts``: the
    host's; every other guard's copy is the one the last plan carried, so that the guard that
    takes a lost master's place goes on with it)."""

    def __init__(self, config: dict, index: int, run_dir: str) -> None:
        self.config, self.index, self.run_dir = config, index, run_dir
        self.unit = config["units"][index]
        self.started = time.monotonic()
        self.max_restarts = int(config.get("max_restarts") or 0)
        self.state = {"unit": index, "name": self.unit["name"], "host": self.unit["host"], "role": self.unit["role"],
                      "ranks": self.unit.get("ranks", []), "state": vocab.UnitState.STARTING.value,
                      "started_at": now()}
        self.attempts: list[dict] = []
        if self.max_restarts:
            self.state["attempt"] = 1
            self.open_attempt(policy.plan_attempt(config, [n["host"] for n in config["nodes"]], 1))

    def write_state(self) -> None:
        write_json(os.path.join(self.run_dir, vocab.guard_record(self.index)), self.state)

    def say(self, text: str) -> None:
        """A line of the guard's own, on its output and in the unit's log."""
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        if self.unit.get("log"):
            with open(self.unit["log"], "a") as fh:
                fh.write(text + "\n")

    def running(self, pid: int) -> None:
        self.state.update(state=vocab.UnitState.RUNNING.value, pid=pid)
        self.state.pop("waiting_for", None)
        self.write_state()

    def finish(self, code: int, state: str, why: str | None = None, abort: dict | None = None) -> int:
        """The unit's end, on disk: ``code`` is the guard's exit code."""
        for name in SECRET_FILES:
            try:
                os.remove(os.path.join(self.run_dir, name))
            except OSError:
                pass
        self.state.update(state=state, exit_code=code, ended_at=now())
        if why:
            self.state["stopped_because"] = why
        if abort:
            self.state["abort"] = abort
        if why:
            self.say(f"[torchfleet guard] stopped {policy.who(self.unit)}: {why}")
        self.write_state()
        return code

    def open_attempt(self, plan: dict) -> None:
        self.attempts.append(policy.attempt_row(plan, now(), time.time()))

    def close_attempt(self, abort: dict | None, state: str) -> None:
        """The attempt's row in the run's table, once it ended."""
        if self.attempts and not self.attempts[-1].get("ended_at"):
            policy.close_row(self.attempts[-1], abort, state, now(), time.time())

    def write_job(self, state: str, abort: dict | None, exits: dict, seen: dict, attempt: int,
                  restarting: bool = False) -> None:
        """job.json: the run's state as this guard, the store's host, sees it."""
        at = time.monotonic()
        job = policy.job_document(self.config, state, abort, exits, {i: at - t for i, t in seen.items()},
                                  at - self.started, now())
        if self.max_restarts:
            if state != vocab.RunState.RUNNING:
                self.close_attempt(abort, state)
            job.update(attempt=attempt, max_attempts=self.max_restarts + 1, master=self.unit["host"],
                       moved_to=(abort or {}).get("moved_to"), restarting=restarting,
                       attempts=[{k: v for k, v in a.items() if not k.startswith("_")} for a in self.attempts])
        write_json(os.path.join(self.run_dir, vocab.JOB), job)
