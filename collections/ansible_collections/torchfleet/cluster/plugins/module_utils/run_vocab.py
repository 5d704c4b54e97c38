"""The vocabulary of a run: its folder's files, its store's keys, its states and the kinds of
abort, and the run's state as a node's folder shows it.

Everything that reads or writes a run says it in these words: the guard (which imports this
file from beside itself, in the run's folder on every node), the node modules, the action
plugins and the torchfleet package (torchfleet.vocab). Standard library only: it runs in the
ranks' Python as well as in Ansible's.
"""

from __future__ import annotations

import enum


class _Word(str, enum.Enum):
    """A member is its value wherever it goes: JSON, a comparison, a dict's key, an f-string."""

    def __hash__(self) -> int:
        return str.__hash__(self)

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# --- the run's folder (on every node; runs/<run_id>/ on the controller holds their copies) ------

SPEC = "spec.json"  # the run's spec, its settings included (spec.guard), as the launch computed it
GUARD_CONFIG = "guard.json"  # the guards' config: the units, the store, the deadlines
GUARD_SOURCE = "guard.py"  # the guard itself, which every unit runs under
VOCAB_SOURCE = "run_vocab.py"  # this file, beside the guard that imports it
JOB = "job.json"  # the run's state, as the guard hosting the store (on the master) writes it
STOP = "stop"  # a stop asked for (torchfleet stop); its text is the reason
SECRET_ENV = "node.secret.env"  # mpirun's ranks' secret environment, removed by the first guard to end
GUARD_RECORDS = "guard-*.json"  # every unit's record, by its guard
SUMMARY = "summary.json"  # the controller's report of the run (runs/<run_id>/ only)
LOGS = "*.log"


def guard_record(index: int) -> str:
    """Unit ``index``'s record, as its guard writes it."""
    return f"guard-{index}.json"


# --- the guards' store (a TCPStore on the master) ------------------------------------------------

ABORT = "abort"  # the first abort, as JSON: kind, host, unit, reason
DONE = "done"  # every primary unit exited 0: services (sshd) may end


def exit_key(index: int) -> str:
    """Unit ``index``'s exit code, once it ended."""
    return f"exit/{index}"


def heartbeat_key(index: int) -> str:
    """Unit ``index``'s guard's counter, bumped every poll."""
    return f"hb/{index}"


# --- states ---------------------------------------------------------------------------------------


class RunState(_Word):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # on request (torchfleet stop, a replace, an interrupted launch)
    # No job.json on this node (a worker), and every unit there ended: the master says how.
    EXITED = "exited"
    UNKNOWN = "unknown"  # a folder with no record at all


class UnitState(_Word):
    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"  # ended on its own account
    STOPPED = "stopped"  # its guard stopped it


UNIT_FINAL = (UnitState.EXITED, UnitState.STOPPED)


class AbortKind(_Word):
    """Why the guards stopped a run (the ``kind`` of its abort)."""

    RANK_FAILED = "rank_failed"
    NODE_LOST = "node_lost"
    STALLED = "stalled"
    TIMEOUT = "timeout"
    STOPPED = "stopped"
    # The guard that hosts the store never wrote job.json: the run never got going.
    NOT_STARTED = "not_started"


def job_state(units: list[dict], exits: dict[int, int], abort: dict | None, lost: list[int]) -> str:
    """The run's state from the store's view: running, succeeded or failed; a stop on request
    is stopped. Services (sshd) do not count."""
    primary = [i for i, u in enumerate(units) if not u.get("service")]
    if abort:
        return (RunState.STOPPED if abort["kind"] == AbortKind.STOPPED else RunState.FAILED).value
    if lost:
        return RunState.FAILED.value
    if all(i in exits for i in primary):
        return (RunState.SUCCEEDED if all(exits[i] == 0 for i in primary) else RunState.FAILED).value
    return RunState.RUNNING.value


def summarize(info: dict) -> str:
    """The run's state as one node's folder shows it (run_folder.read_run's ``info``): the
    master's job.json where there is one, else what its units' records say."""
    job = info["job_state"]
    if job:
        return job["state"]
    states = [u["state"] for u in info["units"]]
    if not states:
        return RunState.UNKNOWN.value
    if any(s not in UNIT_FINAL for s in states):
        return RunState.RUNNING.value
    if any(u.get("abort") for u in info["units"]):
        return RunState.FAILED.value
    return RunState.EXITED.value
