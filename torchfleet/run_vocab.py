"""The vocabulary of a run: its folder's files, its store's keys, its states and the kinds of
abort, and the run's state as a node's folder shows it.

Everything that reads or writes a run says it in these words: the torchfleet package, the
collection's plugins, and the node side (the guard, in the run's folder on every node, and
the node modules). The package owns this file. The collection depends on the package and
carries it to the nodes as ``plugins/module_utils/run_vocab.py``: a link here in the
checkout, a copy in the built collection. Standard library only: it runs in the ranks'
Python as well as in Ansible's.
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
STORE_KEY = "store.key"  # the run's key, which every value in the guards' store carries a MAC under (0400)
GUARD_SOURCE = "guard.py"  # the guard itself, which every unit runs under
VOCAB_SOURCE = "run_vocab.py"  # this file, beside the guard that imports it
# The guard and the module_utils it imports, copied together from the collection: the
# script's own folder comes first on its import path, so it finds them with no path set.
GUARD_SOURCES = (GUARD_SOURCE, "guard_policy.py", "guard_child.py", "guard_store.py", "guard_records.py",
                 "guard_host.py", "guard_attempts.py", "guard_sync.py", VOCAB_SOURCE)
# The run's end on the node (module_utils/run_end.py: collect_run) and its read (run_read.py:
# run_state with a run id), with the modules they import, copied the same way: the actions
# run them there as scripts, without Ansible's module wrapper (plugin_utils/node_script.py).
# A container node's start also leaves run_reap.py running there, which removes the exited
# containers of units whose guard's node stood still and came back.
END_SOURCE = "run_end.py"
READ_SOURCE = "run_read.py"
REAP_SOURCE = "run_reap.py"
SCRIPT_SOURCES = (END_SOURCE, READ_SOURCE, REAP_SOURCE, "rank_docker.py", "loader_libraries.py", "rank_files.py",
                  "out_folder.py", "run_folder.py", "workload_files.py")
NODE_SOURCES = GUARD_SOURCES + SCRIPT_SOURCES  # every file of the collection that a run's folder holds
JOB = "job.json"  # the run's state, as the guard hosting the store (on the master) writes it
STOP = "stop"  # a stop asked for (torchfleet stop); its text is the reason
SECRET_ENV = "node.secret.env"  # mpirun's ranks' secret environment, removed by the first guard to end
GUARD_RECORDS = "guard-*.json"  # every unit's record, by its guard
GUARD_LOCKS = "guard-*.lock"  # every unit's guard holds its own for its whole life (guard_lock)
SUMMARY = "summary.json"  # the controller's report of the run (runs/<run_id>/ only)
LOGS = "*.log"


def guard_record(index: int) -> str:
    """Unit ``index``'s record, as its guard writes it."""
    return f"guard-{index}.json"


def guard_lock(index: int) -> str:
    """The file that unit ``index``'s guard holds a lock on (flock) while it lives: the kernel
    lets go of it however the guard ends, so a record that was never finished (its container
    removed, its node restarted) is known from one whose guard still runs."""
    return f"guard-{index}.lock"


def rank_unit(rank: int) -> str:
    """The name of a bare-process unit that runs rank ``rank`` alone: its files (process_file)
    and its log are named after it."""
    return f"rank-{rank}"


def rank_log(rank: int) -> str:
    """Rank ``rank``'s log: in its node's folder where the rank is a unit of its own, and in
    runs/<run_id>/ for every mode (the report splits a launcher's log by rank)."""
    return rank_unit(rank) + ".log"


def unit_log(role: str, rank: int | None = None) -> str:
    """A unit's log in its node's run folder: a rank's by its rank, any other unit's (a
    torchrun agent, mpirun, sshd) by its role."""
    return rank_log(rank) if role == "rank" and rank is not None else f"{role}.log"


def attempt_log(log: str, attempt: int) -> str:
    """The copy of attempt ``attempt``'s lines (2 and later) of the unit log ``log``, beside
    it: the main log holds every attempt, each after the guard's banner line."""
    stem = log[:-len(".log")] if log.endswith(".log") else log
    return f"{stem}.attempt-{attempt}.log"


ATTEMPT_BANNER = "[torchfleet guard] attempt "  # how a unit's log line that starts an attempt begins


def checksum_file(rank: int) -> str:
    """Rank ``rank``'s parameter checksum, as the workload writes it at its end."""
    return f"checksum-rank-{rank}.txt"


class ProcessFile(_Word):
    """A bare-process unit's files (rank_processes): NAME plus each suffix, side by side in
    the run's folder, NAME being the unit's name."""

    LOG = ".log"  # its output
    META = ".meta"  # its rank, role and job: how a later call finds it
    PID = ".pid"  # its supervising shell, which leads its process group (no systemd)
    UNIT = ".unit"  # its transient systemd unit (with systemd)
    EXIT = ".exit"  # its exit code, once it ended
    STOPPED = ".stopped"  # torchfleet stopped it
    SECRET = ".secret"  # its secret environment, until its shell has read it


def process_file(base: str, kind: ProcessFile) -> str:
    """The file ``kind`` of the bare-process unit at ``base`` (the run folder's path joined
    with the unit's name)."""
    return base + kind.value


# --- the guards' store (a TCPStore on the master) ------------------------------------------------

DONE = "done"  # every primary unit of the attempt that runs exited 0: services (sshd) and units left out may end
RUN_KEY = "run"  # the run's id, set by the store's host: a guard that looks for a moved store checks it


def abort_key(attempt: int = 1) -> str:
    """The attempt's first abort, as JSON: kind, host, unit, reason."""
    return f"abort/{attempt}"


def exit_key(index: int, attempt: int = 1) -> str:
    """Unit ``index``'s exit code in attempt ``attempt``, once it ended."""
    return f"exit/{attempt}/{index}"


def next_key(attempt: int) -> str:
    """What the store's host decided once attempt ``attempt`` ended, as JSON: the next
    attempt's plan (``plan``), or the run's end (``final``, the abort)."""
    return f"next/{attempt}"


def synced_key(attempt: int, host: str) -> str:
    """The newest checkpoint reached ``host`` for attempt ``attempt`` (guard_sync)."""
    return f"synced/{attempt}/{host}"


def left_key(index: int) -> str:
    """Unit ``index``'s guard read the run's end and is leaving."""
    return f"left/{index}"


def listening_key(index: int) -> str:
    """Unit ``index`` (one with a ``listen``: MASTER_PORT, mpirun's sshd) answers there, or
    ended with code 0 without listening: the guards of the units that start after it (their
    ``after``) start them then."""
    return f"listening/{index}"


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
    # The master was lost and the run went on elsewhere: job.json's ``moved_to`` names the
    # node whose job.json now speaks for it.
    MOVED = "moved"


class UnitState(_Word):
    STARTING = "starting"
    RUNNING = "running"
    EXITED = "exited"  # ended on its own account
    STOPPED = "stopped"  # its guard stopped it
    RESTARTING = "restarting"  # its attempt ended; its guard waits for the next one
    LEFT_OUT = "left_out"  # its node was lost and no later attempt took it
    # Its guard ended without recording how (its container was removed under it, its node
    # restarted): a reader's word for a record left at starting or running.
    GONE = "gone"


UNIT_FINAL = (UnitState.EXITED, UnitState.STOPPED, UnitState.LEFT_OUT, UnitState.GONE)


class AbortKind(_Word):
    """Why the guards stopped a run (the ``kind`` of its abort)."""

    RANK_FAILED = "rank_failed"
    NODE_LOST = "node_lost"
    STALLED = "stalled"
    TIMEOUT = "timeout"
    STOPPED = "stopped"
    # The guard that hosts the store never wrote job.json: the run never got going.
    NOT_STARTED = "not_started"
    # This node was lost as the master and the run went on with another (job.json's moved_to).
    MOVED = "moved"


class FollowOutcome(_Word):
    """How a follow of a run (attach_run) ended."""

    FINISHED = "finished"  # the run ended, as its record says
    MASTER_LOST = "master_lost"  # the followed node stopped answering
    MOVED = "moved"  # the followed node's record says the run went on elsewhere (moved_to)
    ABSENT = "absent"  # a node asked to take over never held the run's record


class StartOutcome(_Word):
    """How a start's wait for a unit that others start after (its listen) ended."""

    LISTENING = "listening"
    SUCCEEDED = "succeeded"  # it ended with code 0 without listening: the later phase starts
    FAILED = "failed"
    PEER_FAILED = "peer-failed"  # another node's unit failed first, and the guards stopped this one


class RankOutcome(_Word):
    """How each rank of a run ended, as its summary says (summary.json's ranks[].outcome)."""

    OK = "ok"
    FAILED = "failed"
    STOPPED = "stopped"  # its guard stopped it: another rank failed, or a stop was asked
    MISSING = "missing"  # no end recorded: its node or its guard went away
    NOT_STARTED = "not started"  # its guard still waited for the earlier phase when the run ended
    LEFT_OUT = "left out"  # its node was lost and a later attempt ran without it


# An attempt that ends with one of these may be followed by another (launch_max_restarts).
RESTARTABLE = (AbortKind.RANK_FAILED, AbortKind.NODE_LOST, AbortKind.STALLED)


def ended(abort: dict | None) -> RunState:
    """How a run that ended with ``abort`` reads, wherever it is read: stopped (on request),
    moved (its master was lost and the run went on elsewhere), else failed."""
    kind = (abort or {}).get("kind")
    if kind == AbortKind.STOPPED:
        return RunState.STOPPED
    return RunState.MOVED if kind == AbortKind.MOVED else RunState.FAILED


def job_state(units: list[dict], exits: dict[int, int], abort: dict | None, lost: list[int],
              members: set[int] | None = None) -> str:
    """The run's state from the store's view, as its host writes it into job.json: running,
    succeeded, or as its abort ends it (ended). Services (sshd) do not count, nor units
    outside the attempt (``members``)."""
    primary = [i for i, u in enumerate(units) if not u.get("service") and (members is None or i in members)]
    if abort:
        return ended(abort).value
    if lost:
        return RunState.FAILED.value
    if all(i in exits for i in primary):
        return (RunState.SUCCEEDED if all(exits[i] == 0 for i in primary) else RunState.FAILED).value
    return RunState.RUNNING.value


def run_state(job: dict | None = None, units: list[dict] = (), summary: dict | None = None,
              scheduler: str | None = None) -> str:
    """A run's state: the one rule that every reader applies (a status, the runs list, an
    attach, the summary, a scheduler's job), whichever sources it has, from one node or
    from many:

    - ``job``: the record of the guard hosting the run's store (job.json), the newest that
      speaks for the run. Its abort says how the run ended; else its state stands.
    - ``units``: the units' own records (guard-N.json), of every node read. The run runs
      while any unit does; else the first abort any records ends it.
    - ``summary``: the controller's summary.json: its abort, else whether it was ok.
    - ``scheduler``: a scheduler's word for its job, as a run state while it queues or runs
      (or once it completed), or as the kind of abort that its end amounts to.

    With none of them saying how the run ended, units that all ended are ``exited`` (a
    worker's folder: its master says how), and nothing at all is ``unknown``."""
    if job:
        return (ended(job["abort"]) if job.get("abort") else RunState(job["state"])).value
    if any(u.get("state") not in UNIT_FINAL for u in units):
        return RunState.RUNNING.value
    abort = next((u["abort"] for u in units if u.get("abort")), None) or (summary or {}).get("abort")
    if abort:
        return ended(abort).value
    if summary is not None:
        return (RunState.SUCCEEDED if summary.get("ok") else RunState.FAILED).value
    if scheduler:
        return (ended({"kind": scheduler}) if scheduler in ABORT_WORDS else RunState(scheduler)).value
    return (RunState.EXITED if units else RunState.UNKNOWN).value


ABORT_WORDS = {k.value for k in AbortKind}


def summarize(info: dict) -> str:
    """The run's state as one node's folder shows it (run_folder.read_run's ``info``)."""
    return run_state(job=info["job_state"], units=info["units"])


def run_record(config: dict, job: dict | None, job_age_s: float | None) -> dict | None:
    """A running run as the guard hosting its store records it (job.json, with guard.json's
    units), for a status that reads the master alone: its state, job and each node's units.
    None where that record cannot speak for the run, and every node's own records must: none
    yet; not rewritten for the node timeout (the guard that writes it is gone, as the other
    guards would judge); or a run that ended, whose units' own records say how each ended."""
    units = config.get("units") or []
    if not job or job.get("state") != RunState.RUNNING or len(job.get("units") or []) != len(units):
        return None
    if job_age_s is None or job_age_s > float(config.get("node_timeout", 0)):
        return None
    nodes: dict[str, dict] = {}
    for index, (unit, seen) in enumerate(zip(units, job["units"])):
        code, age = seen.get("exit_code"), seen.get("heartbeat_age_s")
        # While the run runs, only a unit that exited 0 has its code in the store (any other
        # end aborts the run first); a unit not yet heard from is still starting.
        state = UnitState.EXITED if code is not None else UnitState.RUNNING if age is not None else UnitState.STARTING
        nodes.setdefault(unit["host"], {"run_id": config.get("run_id"), "job": config.get("job"), "units": []})
        nodes[unit["host"]]["units"].append({
            "unit": index, "name": unit["name"], "host": unit["host"], "role": unit.get("role"),
            "ranks": unit.get("ranks", []), "state": state.value, "exit_code": code, "heartbeat_age_s": age})
    return {"run_id": config.get("run_id"), "job": config.get("job"), "state": job["state"], "abort": job.get("abort"),
            "updated_at": job.get("updated_at"), "age_s": job_age_s, "nodes": nodes}
