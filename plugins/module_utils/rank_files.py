"""Node-side: the bare-process ranks' files under a run folder (rank_processes writes them).

Shared by rank_processes, which starts and stops the ranks, run_outputs, which ends a run's
ranks before it packs what they left, and node_probe, which only looks for the ones that
still run.
"""

from __future__ import annotations

import glob
import os
import signal
import time
from datetime import datetime, timezone

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
except ImportError:  # on a node: a script's in the run's folder (run_vocab.SCRIPT_SOURCES), its modules beside it
    import run_vocab as vocab


def iso(ts):
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def systemd():
    return os.path.isdir("/run/systemd/system")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie has exited; only its parent has not reaped it yet.
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def is_running(module, entry):
    if "unit" in entry:
        rc, _out, _err = module.run_command(["systemctl", "is-active", "--quiet", entry["unit"]])
        return rc == 0
    return alive(entry["pid"])


def find(module, run_dir, recurse=False, job=None):
    metas = "*" + vocab.ProcessFile.META.value
    pattern = os.path.join(run_dir, "**", metas) if recurse else os.path.join(run_dir, metas)
    found = []
    for meta in sorted(glob.glob(pattern, recursive=recurse)):
        base = meta[: -len(vocab.ProcessFile.META.value)]
        with open(meta) as fh:
            rank, role, meta_job = (fh.read().split() + ["-"])[:3]
        if job and meta_job != job:
            continue
        entry = {"name": os.path.basename(base), "base": base, "rank": int(rank), "role": role,
                 "run": os.path.basename(os.path.dirname(base)),
                 "log": vocab.process_file(base, vocab.ProcessFile.LOG),
                 "stopped_by_torchfleet": os.path.exists(vocab.process_file(base, vocab.ProcessFile.STOPPED))}
        for key, kind, cast in (("unit", vocab.ProcessFile.UNIT, str), ("pid", vocab.ProcessFile.PID, int)):
            if os.path.exists(vocab.process_file(base, kind)):
                with open(vocab.process_file(base, kind)) as fh:
                    entry[key] = cast(fh.read().strip())
        exit_file = vocab.process_file(base, vocab.ProcessFile.EXIT)
        if os.path.exists(exit_file):
            with open(exit_file) as fh:
                entry.update(running=False, exit_code=int(fh.read().strip()), vanished=False)
        else:
            running = is_running(module, entry)
            # Gone without an exit code: its supervising shell was killed.
            entry.update(running=running, exit_code=None, vanished=not running)
        entry["status"] = "running" if entry["running"] else ("vanished" if entry["vanished"] else "exited")
        entry["started_at"] = iso(os.path.getmtime(meta))
        entry["finished_at"] = None if entry["running"] else iso(
            os.path.getmtime(exit_file) if os.path.exists(exit_file) else time.time())
        found.append(entry)
    return sorted(found, key=lambda e: (e["rank"], e["name"]))


def stop(module, entry, signum=signal.SIGKILL):
    """SIGTERM lets the guard stop its rank and say why; SIGKILL ends what is left."""
    open(vocab.process_file(entry["base"], vocab.ProcessFile.STOPPED), "w").close()
    if "unit" in entry:
        module.run_command(["systemctl", "kill", "--signal", signal.Signals(signum).name, entry["unit"]])
        return
    try:
        os.killpg(entry["pid"], signum)
    except ProcessLookupError:
        pass


def end(module, run_dir, wait_s, grace_s, recurse=False, job=None):
    """End the processes under ``run_dir``: ``wait_s`` seconds to end by themselves (their
    guards stop them), then SIGTERM, ``grace_s`` seconds, and SIGKILL. Returns their last
    state (one that SIGKILL ended has its code), and whether any had to be signalled."""
    entries = find(module, run_dir, recurse, job)
    deadline = time.monotonic() + wait_s
    while any(e["running"] for e in entries) and time.monotonic() < deadline:
        time.sleep(0.1)
        entries = find(module, run_dir, recurse, job)
    signalled = [e for e in entries if e["running"]]
    for e in signalled:
        stop(module, e, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(e["running"] for e in find(module, run_dir, recurse, job)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for e in find(module, run_dir, recurse, job):
        if e["running"]:
            stop(module, e)
    deadline = time.monotonic() + 10
    while any(e["running"] for e in find(module, run_dir, recurse, job)):
        if time.monotonic() > deadline:
            module.fail_json(msg=f"processes under {run_dir} survived SIGKILL")
        time.sleep(0.2)
    finals = find(module, run_dir, recurse, job)
    for e in finals:
        if e["exit_code"] is None and e["stopped_by_torchfleet"]:
            e["exit_code"] = 128 + signal.SIGKILL
    return finals, bool(signalled)
