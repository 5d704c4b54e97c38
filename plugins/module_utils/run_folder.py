"""Node-side: a run's folder on a node, as its guards leave it, and its making at a start.

Shared by run_state, which reads, stops and makes run folders, and rank_processes, which
makes a process-mode node's folder in the same call that starts its units.
"""

from __future__ import annotations

import fcntl
import glob
import json
import os
import shutil
import tarfile
import time

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
    from ansible_collections.torchfleet.cluster.plugins.module_utils.workload_files import install
except ImportError:  # on a node: a script's in the run's folder (run_vocab.SCRIPT_SOURCES), its modules beside it
    import run_vocab as vocab
    from workload_files import install


# job.json's keys of a run with restarts that a status shows (docs/recovery.md#the-record).
RECORD_ATTEMPT_KEYS = ("attempt", "max_attempts", "restarting", "attempts")


class PrepareError(Exception):
    """A run folder that cannot be made as asked (its message says why)."""


def _json(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _tail(path, lines):
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            return fh.read().decode(errors="replace").rstrip("\n").splitlines()[-lines:]
    except OSError:
        return []


def guard_gone(run_dir, index):
    """Whether unit ``index``'s guard has ended: nobody holds its lock (run_vocab.guard_lock).
    False where there is no lock file (a guard that has not started yet)."""
    try:
        fd = os.open(os.path.join(run_dir, vocab.guard_lock(index)), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)  # lets go of a lock it took
    return True


def _unit_record(run_dir, state):
    """A unit's record as it stands: one that still says it runs while its guard has ended
    (its container removed under it, its node restarted) is gone."""
    if state["state"] not in vocab.UNIT_FINAL and guard_gone(run_dir, int(state["unit"])):
        return dict(state, state=vocab.UnitState.GONE.value, recorded_state=state["state"],
                    stopped_because="its guard ended without recording how the unit ended")
    return state


def read_run(run_dir, tail_lines=0, with_spec=False, with_record=False):
    config = _json(os.path.join(run_dir, vocab.GUARD_CONFIG)) or {}
    units = {}
    for path in glob.glob(os.path.join(run_dir, vocab.GUARD_RECORDS)):
        state = _json(path)
        if state is not None:
            units[int(state["unit"])] = _unit_record(run_dir, state)
    job_path = os.path.join(run_dir, vocab.JOB)
    job = _json(job_path)
    if job and job.get("state") == vocab.RunState.RUNNING and units and all(guard_gone(run_dir, i) for i in units):
        # A guard of this node rewrites job.json while one lives: with every one gone, this
        # "running" will never be followed by the run's end, and the units' records speak.
        job = None
    info = {"run_id": os.path.basename(run_dir), "job": config.get("job"), "mode": config.get("mode"), "job_state": job,
            # The store's host rewrites job.json every poll; an old one means that guard is gone.
            "job_age_s": round(time.time() - os.path.getmtime(job_path), 1) if os.path.exists(job_path) else None,
            "units": [units[i] for i in sorted(units)], "stop_requested": os.path.exists(os.path.join(run_dir, vocab.STOP)),
            # A start cut short can leave the folder without its spec: attach, stop and
            # collect read the spec from a node that has it.
            "has_spec": os.path.exists(os.path.join(run_dir, vocab.SPEC)),
            "started": os.path.getmtime(run_dir)}
    info["state"] = vocab.summarize(info)
    if with_record:
        info["record"] = vocab.run_record(config, info["job_state"], info["job_age_s"])
        if info["record"] is not None:
            # With restarts: which attempt runs, and why each earlier one ended.
            info["record"].update({k: info["job_state"][k] for k in RECORD_ATTEMPT_KEYS if k in info["job_state"]})
    if with_spec:
        info["spec"] = _json(os.path.join(run_dir, vocab.SPEC))
    if tail_lines:
        info["logs"] = {os.path.basename(p): _tail(p, tail_lines) for p in sorted(glob.glob(os.path.join(run_dir, vocab.LOGS)))}
    return info


def wait_for_end(run_dir, wait, poll):
    """Until the store's host writes an end to job.json, for at most ``wait`` seconds (also
    while the run's folder or job.json is not there yet)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(run_dir, vocab.JOB)) as fh:
                if json.load(fh).get("state") != vocab.RunState.RUNNING:
                    return
        except (OSError, ValueError):
            pass  # not written yet, or being replaced
        time.sleep(max(0.05, min(poll, deadline - time.monotonic())))


# run_state's options, declared once: the module takes them all, and its action checks a read
# of one run (one_run's parameters, with node_dir and run_id) against them before it runs the
# run folder's script instead.
RUN_STATE_ARGS = {
    "node_dir": {"type": "path", "required": True},
    "run_id": {"type": "str"},
    "state": {"type": "str", "choices": ["info", "stopped", "present"], "default": "info"},
    "files": {"type": "dict", "default": {}},
    # Files only the run's owner reads (0400), such as the ranks' secret environment: never
    # in a result, a log or a command line.
    "secret_files": {"type": "dict", "default": {}, "no_log": True},
    "workload": {"type": "dict"},
    "dirs": {"type": "list", "elements": "path", "default": []},
    "owner": {"type": "int"},
    "group": {"type": "int"},
    "reason": {"type": "str"},
    "keep": {"type": "int", "default": 10},
    "tail_lines": {"type": "int", "default": 0},
    "spec": {"type": "bool", "default": False},
    "record": {"type": "bool", "default": False},
    "wait": {"type": "float", "default": 0},
    "poll": {"type": "float", "default": 0.5},
    "leftovers": {"type": "dict"},
    # The run's containers, started in the same call once the folder is made (rank_start):
    # their env holds the ranks' secrets.
    "containers": {"type": "list", "elements": "dict", "default": [], "no_log": True},
    "image": {"type": "str"},
}


def one_run(run_dir, state="info", reason=None, tail_lines=0, spec=False, record=False, wait=0.0, poll=0.5,
            check=False):
    """run_state's answer for one run (its options of that name): the run's folder read, after
    waiting for its end (``wait``) or asking its stop (``state=stopped``)."""
    if state == "info" and wait > 0:
        wait_for_end(run_dir, wait, poll)
    if not os.path.isdir(run_dir):
        return {"changed": False, "found": False, "run": None}
    changed = False
    if state == "stopped":
        if check:
            info = read_run(run_dir)
            changed = info["state"] == vocab.RunState.RUNNING and not info["stop_requested"]
        else:
            changed = ask_stop(run_dir, reason)
    return {"changed": changed, "found": True, "run": read_run(run_dir, tail_lines, spec, record)}


def ask_stop(run_dir, reason=None):
    """Write the run's stop file, which its guards watch, where the run still runs and no
    stop was asked yet; whether it was written."""
    info = read_run(run_dir)
    if info["state"] != vocab.RunState.RUNNING or info["stop_requested"]:
        return False
    write_whole(os.path.join(run_dir, vocab.STOP), (reason or "stopped on request (torchfleet stop)") + "\n")
    return True


def prune(runs_dir, runs, keep):
    finished = [r for r in runs if r["state"] != vocab.RunState.RUNNING]
    # Run ids begin with their UTC start time, so name order is age order.
    doomed = finished[: max(0, len(finished) - max(keep, 0))]
    for r in doomed:
        shutil.rmtree(os.path.join(runs_dir, r["run_id"]), ignore_errors=True)
    return [r["run_id"] for r in doomed]


def write_whole(path, data, mode=None, owner=None, group=None):
    """Guards, other controllers' status and peers read a run's files while they are
    written: a file appears whole, by a rename, or not at all. Its mode and owner are set
    before it has any content, so that a secret is never readable by others."""
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode & 0o600)
    with os.fdopen(fd, "wb") as fh:
        if owner is not None or group is not None:
            os.fchown(fh.fileno(), -1 if owner is None else owner, -1 if group is None else group)
        if mode is not None:
            os.fchmod(fh.fileno(), mode & 0o600)
        fh.write(data.encode() if isinstance(data, str) else data)
    if mode is not None:
        os.chmod(path + ".tmp", mode)
    os.replace(path + ".tmp", path)


def write_files(run_dir, files, mode=0o644, owner=None, group=None):
    """Write each file whole, with ``mode`` (and ``owner`` and ``group``, where given) from the
    start; return the names whose content changed."""
    changed = []
    for name, content in files.items():
        path = os.path.join(run_dir, name)
        data = content.encode()
        try:
            with open(path, "rb") as fh:
                if fh.read() == data:
                    continue
        except OSError:
            pass
        write_whole(path, data, mode, owner, group)
        changed.append(name)
    return changed


def prepare(node_dir, run_id, files, keep=10, owner=None, group=None, workload=None, check=False, dirs=(),
            secret_files=None):
    """Make the run's folder: the workload first when one is given (its folder replaced
    whole), then the oldest finished runs beyond ``keep`` pruned, the folder created and
    ``files`` written into it, each whole, and ``secret_files`` readable by its owner only;
    and ``dirs``, folders the ranks keep across runs (launch_checkpoint_dir), made where
    missing. All get ``owner`` and ``group``. Returns the result's fields."""
    secret_files = secret_files or {}
    bad = [name for name in [*files, *secret_files] if not name or os.path.basename(name) != name or name in (".", "..")]
    if bad:
        raise PrepareError(f"files: {', '.join(map(repr, bad))} must be plain file names")
    runs_dir = os.path.join(node_dir, "runs")
    run_dir = os.path.join(runs_dir, run_id)
    if check:
        return {"changed": not os.path.isdir(run_dir) or bool(workload)}
    if workload:
        try:
            install(workload)
        except (OSError, ValueError, tarfile.TarError, KeyError) as exc:
            raise PrepareError(f"cannot unpack the workload into {workload.get('dest')}: {exc}") from exc
    runs = [read_run(d) for d in sorted(glob.glob(os.path.join(runs_dir, "*"))) if os.path.isdir(d) and d != run_dir]
    removed = prune(runs_dir, runs, keep)
    created = False
    for folder in [run_dir, *dirs]:
        created = not os.path.isdir(folder) or created
        os.makedirs(folder, mode=0o755, exist_ok=True)
        if owner is not None or group is not None:
            stat = os.stat(folder)
            if (stat.st_uid, stat.st_gid) != (owner if owner is not None else stat.st_uid,
                                              group if group is not None else stat.st_gid):
                os.chown(folder, -1 if owner is None else owner, -1 if group is None else group)
                created = True
    written = write_files(run_dir, {k: str(v) for k, v in files.items()})
    written += write_files(run_dir, {k: str(v) for k, v in secret_files.items()}, 0o400, owner, group)
    return {"changed": bool(created or written or removed or workload), "removed": removed, "written": written,
            "workload": (workload or {}).get("dest")}
