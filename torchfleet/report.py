"""Turn what the ranks left behind (exit states, logs) into a run summary."""

from __future__ import annotations

import json
import re
import signal
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

from torchfleet import attempts, modes
from torchfleet.rank_logs import tail
from torchfleet import run_vocab as vocab
from torchfleet.run_vocab import RankOutcome

STEP_RE = re.compile(
    r"^(?P<ts>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z)?.*?Train Epoch: (?P<epoch>\d+) "
    r"\[(?P<batch>\d+)/(?P<batches>\d+) \(\d+%\)\]\s+loss=(?P<loss>[-+0-9.eE]+|nan|inf)"
)
# Messages a rank prints when a *peer* went away; such a rank is a victim, not the cause.
PEER_ERROR_RE = re.compile(
    r"Connection (closed|reset) by peer|Broken pipe|Socket Timeout|Timed out waiting|"
    r"stopped by torchfleet",
    re.IGNORECASE,
)


# A rank on a node that the last attempt ran without (launch_max_restarts): neither ok nor failed.

# What rank_containers reports of each container's configuration, with its default.
CONTAINER_FIELDS = {"env": {}, "cpuset": None, "cpuset_mems": None, "devices": [], "mounts": [],
                    "oom_kill_disable": False}


def parse_time(text: str | None) -> datetime | None:
    """Parse docker's RFC 3339 timestamps (nanoseconds, Z) and the workload's."""
    if not text or text.startswith("0001-01-01"):
        return None
    text = text.strip().replace("Z", "+00:00")
    main, _, rest = text.partition(".")
    if rest:
        digits = re.match(r"\d+", rest).group(0)
        text = f"{main}.{digits[:6]}{rest[len(digits):]}"
    value = datetime.fromisoformat(text)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def parse_steps(log: str) -> list[dict[str, Any]]:
    """Every ``Train Epoch`` line of a log, with a global step number."""
    steps = []
    for line in log.splitlines():
        match = STEP_RE.search(line)
        if not match:
            continue
        epoch, batch, batches = (int(match[k]) for k in ("epoch", "batch", "batches"))
        steps.append(
            {
                "epoch": epoch,
                "batch": batch,
                "step": (epoch - 1) * batches + batch,
                "loss": float(match["loss"]),
                "time": match["ts"],
            }
        )
    return steps


def run_files(spec: Mapping[str, Any], host: str) -> list[tuple[str, str]]:
    """The files a node may hold of a run, as (name in its run folder, name in runs/RUN/):
    its ranks' logs and checksums and its units' guard records; on the master the run's
    state and rank 0's model; and the launch mode's own (LaunchMode.run_files)."""
    files = []
    for rank in sorted(int(r["rank"]) for r in spec["ranks"] if r["host"] == host):
        files += [(vocab.rank_log(rank),) * 2, (vocab.checksum_file(rank),) * 2]
    files += [(vocab.guard_record(i),) * 2 for i, unit in enumerate(spec["guard"]["units"]) if unit["host"] == host]
    restarts = int(spec["guard"].get("max_restarts") or 0)
    if host == spec["master_host"]:
        files += [(vocab.JOB,) * 2, ("model.pt",) * 2]
    elif restarts:
        # Another node may have become the master (a lost master): its record and model too.
        files += [(vocab.JOB, node_job(host)), ("model.pt", node_model(host))]
    files += modes.get(spec["mode"]).run_files(host, host == spec["master_host"])
    # Each attempt's copy of a log, beside it (the main log holds every attempt too).
    return files + [(a, b) for name, local in files if name.endswith(".log")
                    for a, b in zip(attempts.attempt_logs(name, restarts), attempts.attempt_logs(local, restarts))]


def run_end(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What ends a run on a node before its files are collected (run_outputs' ``units`` and
    ``remove``), from the run's own spec: its units, by what runs them (a process-runtime
    run's units are processes, every other run's containers), each given the run's
    ``stop_wait`` to end by itself (its guard stops it) and then its ``stop_grace``; and the
    node's secret environment file, which only the units needed (a name in the run's folder)."""
    units = {"kind": "process" if spec.get("image") is None else "container", "run_id": spec["run_id"],
             "wait_s": spec["guard"]["stop_wait"], "grace_s": spec["guard"]["stop_grace"]}
    return {"units": units, "remove": [vocab.SECRET_ENV] if spec.get("secret_env_file") else []}


def node_job(host: str) -> str:
    """runs/RUN/'s copy of ``host``'s job.json where it is not the spec's master (restarts)."""
    return f"job-{host}.json"


def node_model(host: str) -> str:
    """runs/RUN/'s copy of ``host``'s model.pt where it is not the spec's master (restarts)."""
    return f"model-{host}.pt"


def guard_key(role: str | None, name: str | None, ranks: list[int] | int | None) -> tuple[str | None, int]:
    """A unit as both its guard and the node modules name it: its name (a container's, the
    same on every node for torchrun's agent) and its first rank (-1 for sshd and mpirun)."""
    if isinstance(ranks, int):
        return name, ranks
    return name, (ranks or [-1])[0] if role in ("rank", "torchrun", None) else -1


def guard_records(run_dir: str | Path) -> tuple[dict[tuple, dict[str, Any]], dict[str, Any] | None]:
    """What each unit's guard recorded (guard-N.json), by guard_key, and why the run was
    aborted: the master's job.json, else (unless that says the run succeeded) the first guard
    that says."""
    run_dir = Path(run_dir)
    guards = {}
    for path in sorted(run_dir.glob(vocab.GUARD_RECORDS)):
        try:
            state = json.loads(path.read_text())
        except ValueError:
            continue
        guards[guard_key(state.get("role"), state["name"], state.get("ranks"))] = state
    job = job_record(run_dir) or {}
    abort = job.get("abort")
    # Where the master's record says the run succeeded, a unit's own abort is an earlier
    # attempt's: a node left out of the last attempt keeps the one that lost it.
    if job.get("state") != vocab.RunState.SUCCEEDED:
        abort = abort or next((g["abort"] for g in guards.values() if g.get("abort")), None)
    return guards, abort


def job_record(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's state as the guard hosting the store last wrote it (job.json, fetched from
    the master; with restarts, the node's that the run moved to, where the master was lost),
    or None."""
    records = []
    for path in [Path(run_dir) / vocab.JOB, *sorted(Path(run_dir).glob(node_job("*")))]:
        try:
            records.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return dict(attempts.newest_record(records)) if records else None


def cluster_finals(spec: Mapping[str, Any], finals: Iterable[Mapping[str, Any]], job: Mapping[str, Any] | None,
                   lost: Iterable[str]) -> list[dict[str, Any]]:
    """``finals`` completed by the cluster's own record where the controller lost a node
    (``lost``: it stopped answering the controller): a rank on such a node, of which the
    controller has no end, ends as the guards recorded it in ``job`` (the master's job.json:
    each unit's exit code, by the spec's unit index). A rank the guards stopped because of
    another unit counts as stopped. Where the cluster has no exit either, the rank stays
    without one."""
    out = [dict(f) for f in finals]
    lost = set(lost)
    if not job or not lost:
        return out
    known = {int(f["rank"]) for f in out if f.get("exit_code") is not None or f.get("stopped_by_torchfleet")}
    out = [f for f in out if int(f["rank"]) in known]
    abort = job.get("abort") or {}
    for unit, recorded in zip(spec["guard"]["units"], job.get("units") or []):
        if unit["role"] != "rank" or unit["host"] not in lost or not unit.get("ranks") or unit["ranks"][0] in known:
            continue
        code = recorded.get("exit_code")
        if code is None:
            continue
        stopped = bool(abort) and code != 0 and abort.get("unit") != unit["name"]
        out.append({"rank": unit["ranks"][0], "name": unit["name"], "role": "rank", "host": unit["host"],
                    "exit_code": code, "stopped_by_torchfleet": stopped,
                    "stopped_because": abort.get("reason") if stopped else None, "recorded_by": "cluster"})
    return sorted(out, key=lambda f: int(f["rank"]))


def apply_guards(finals: Iterable[Mapping[str, Any]], guards: Mapping[tuple, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A unit its guard stopped counts as stopped, with the guard's reason; one that ended
    on its own keeps its exit code, whoever removed its container afterwards."""
    out = []
    named = set()
    for final in finals:
        final = dict(final)
        key = guard_key(None, final.get("name"), int(final.get("rank", -1)))
        named.add(key)
        guard = guards.get(key)
        if guard and guard.get("state") in vocab.UNIT_FINAL:
            final["stopped_by_torchfleet"] = guard["state"] == vocab.UnitState.STOPPED
            final["stopped_because"] = guard.get("stopped_because")
            if guard["state"] == vocab.UnitState.LEFT_OUT:
                final["left_out"] = True
            if guard.get("not_started"):
                final["not_started"] = True
            if guard.get("exit_code") is not None:
                final["exit_code"] = guard["exit_code"]
        out.append(final)
    # A unit whose container was already removed (a replaced run's, say) is known by its guard.
    for (name, first), guard in guards.items():
        if (name, first) in named or guard.get("state") not in vocab.UNIT_FINAL:
            continue
        out.append({"name": name, "rank": first, "role": guard.get("role", "rank"), "exit_code": guard.get("exit_code"),
                    "started_at": guard.get("started_at"), "finished_at": guard.get("ended_at"),
                    "stopped_by_torchfleet": guard["state"] == vocab.UnitState.STOPPED,
                    "stopped_because": guard.get("stopped_because"),
                    "left_out": guard["state"] == vocab.UnitState.LEFT_OUT,
                    "not_started": bool(guard.get("not_started"))})
    return out


def summarize(run_id: str, spec: Mapping[str, Any], finals: Iterable[Mapping[str, Any]],
              run_dir: str | Path, master_listened: bool = True, abort: Mapping[str, Any] | None = None,
              lost: Iterable[str] = ()) -> dict[str, Any]:
    """Combine the launch spec, each rank's final state and the fetched logs.

    ``lost`` are the nodes the controller could not reach at the end: their ranks' logs
    did not arrive (``logs_missing``) and are still on them.

    ``finals`` holds one mapping per rank as the node-side module reported it before
    removal: rank, exit_code, started_at, finished_at, stopped_by_torchfleet, not_started.
    When the master never opened MASTER_PORT, the workers' guards never started them (or,
    from an older launch, their containers were never made): they are not to blame.
    Each row keeps the spec its rank ran with; a rank's own container, where it has one,
    reports its cpuset instead.
    """
    run_dir = Path(run_dir)
    by_rank = {int(f["rank"]): f for f in finals}
    job = job_record(run_dir)
    tried = attempts.table(job, run_dir)
    # With restarts, a node that the last attempt ran without (it was lost) holds no end to judge.
    last_nodes = set(tried[-1].get("nodes") or ()) if tried and tried[-1].get("nodes") else None
    rows = []
    for entry in spec["ranks"]:
        rank = entry["rank"]
        final = by_rank.get(rank, {})
        log_path = run_dir / vocab.rank_log(rank)
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
        steps = parse_steps(log)
        started, finished = parse_time(final.get("started_at")), parse_time(final.get("finished_at"))
        exit_code = final.get("exit_code")
        if final.get("left_out") or (last_nodes is not None and entry["host"] not in last_nodes):
            outcome = RankOutcome.LEFT_OUT
        elif final.get("not_started"):
            # Its guard was still waiting for the master to listen when the run ended.
            outcome, exit_code = RankOutcome.NOT_STARTED, None
        elif final.get("stopped_by_torchfleet"):
            outcome = RankOutcome.STOPPED
        elif exit_code == 0:
            outcome = RankOutcome.OK
        elif exit_code is None and not final and not master_listened:
            outcome = RankOutcome.NOT_STARTED
        elif exit_code is None:
            outcome = RankOutcome.MISSING
        else:
            outcome = RankOutcome.FAILED
        rows.append(
            {
                "rank": rank,
                "host": entry["host"],
                "exit_code": exit_code,
                "outcome": outcome,
                "duration_s": round((finished - started).total_seconds(), 1) if started and finished else None,
                "last_loss": steps[-1]["loss"] if steps else None,
                "steps": len(steps),
                "started_at": final.get("started_at"),
                "finished_at": final.get("finished_at"),
                "first_step_at": steps[0]["time"] if steps else None,
                "log": str(log_path) if log_path.exists() else None,
                "peer_error": bool(PEER_ERROR_RE.search(log)),
                "stopped_because": final.get("stopped_because"),
                "log_tail": tail(log),
                # Kept here so the plot needs no second pass over the logs.
                "curve": [[s["step"], s["loss"]] for s in steps],
                **{key: final.get(key, default) for key, default in CONTAINER_FIELDS.items()},
                "spec": dict(entry),
            }
        )
        for key in ("cpuset", "cpuset_mems"):
            rows[-1][key] = rows[-1][key] or entry.get(key) or None
    culprit = choose_culprit(rows)
    checksums = {}
    judged = [r for r in rows if r["outcome"] != RankOutcome.LEFT_OUT]
    for row in judged:
        path = run_dir / vocab.checksum_file(row["rank"])
        if path.exists():
            checksums[row["rank"]] = path.read_text().strip()
    lost = sorted(set(lost))
    ok = culprit is None and not abort and all(r["outcome"] == RankOutcome.OK for r in judged)
    return {
        "run_id": run_id,
        "master": f"{spec['master_addr']}:{spec['master_port']}",
        "world_size": spec["world_size"],
        "mode": spec.get("mode"),
        "ok": ok,
        # How the run ended, by the one rule every reader applies (torchfleet.run_vocab.run_state).
        "state": vocab.run_state(summary={"ok": ok, "abort": abort}),
        "abort": dict(abort) if abort else None,
        "failed_rank": culprit,
        "checksums": checksums,
        # None where the job writes no checksums: there is nothing to compare.
        "checksums_equal": (len(checksums) == len(judged) and len(set(checksums.values())) == 1) if checksums else None,
        "model": final_model(run_dir, spec, job),
        "ranks": rows,
        "unreachable": lost,
        # The nodes some of whose ranks' logs did not arrive (they are still on the node): a
        # lost node's, even where a file of it came (a frozen node's can be empty).
        "logs_missing": sorted({r["host"] for r in rows
                                if r["host"] in lost or (r["outcome"] != RankOutcome.NOT_STARTED and not r["log"])}),
        "note": unreachable_note(run_id, lost),
        # With restarts (launch_max_restarts), every attempt: job.json's table, each with the
        # step it resumed from; [] for a run without.
        "attempts": tried,
        "attempt": attempts.position(job)[0],
        "max_attempts": attempts.position(job)[1],
    }


def final_model(run_dir: Path, spec: Mapping[str, Any], job: Mapping[str, Any] | None) -> str | None:
    """Rank 0's model: the spec's master's, or the node's that the run moved to (restarts)."""
    master = (job or {}).get("master")
    for path in ([run_dir / node_model(master)] if master and master != spec["master_host"] else []) + \
            [run_dir / "model.pt"]:
        if path.exists():
            return str(path)
    return None


def unreachable_note(run_id: str, lost: Iterable[str]) -> str | None:
    """What a report says of the nodes the controller could not reach at the end."""
    lost = sorted(set(lost))
    if not lost:
        return None
    return (f"the controller could not reach {', '.join(lost)}; the run's logs there are still on "
            f"{'that node' if len(lost) == 1 else 'those nodes'}: `torchfleet collect {run_id}` fetches them "
            "once it answers")


def choose_culprit(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The rank that failed first, preferring one that did not just lose a peer."""
    failed = [r for r in rows if r["outcome"] in (RankOutcome.FAILED, RankOutcome.MISSING)]
    if not failed:
        return None
    far_future = datetime.max.replace(tzinfo=timezone.utc)
    failed.sort(key=lambda r: (r["peer_error"], parse_time(r["finished_at"]) or far_future))
    first = failed[0]
    return {k: first[k] for k in ("rank", "host", "exit_code", "log", "log_tail")}


def format_table(summary: Mapping[str, Any]) -> list[str]:
    header = (f"{'rank':>4}  {'host':<16} {'exit':>4}  {'outcome':<8} {'duration':>9}  {'last loss':>9}  "
              f"{'cpuset':<16} mems")
    lines = [header, "-" * len(header)]
    for r in summary["ranks"]:
        exit_code = "-" if r["exit_code"] is None else str(r["exit_code"])
        duration = "-" if r["duration_s"] is None else f"{r['duration_s']:.1f}s"
        loss = "-" if r["last_loss"] is None else f"{r['last_loss']:.4f}"
        lines.append(f"{r['rank']:>4}  {r['host']:<16} {exit_code:>4}  {r['outcome']:<8} {duration:>9}  {loss:>9}  "
                     f"{r.get('cpuset') or '-':<16} {r.get('cpuset_mems') or '-'}")
    return lines


def _how_it_ended(code: Any) -> str:
    how = f"exited with code {code}" if code is not None else "never reported an exit code"
    if isinstance(code, int) and code > 128:
        try:
            how += f" (killed by {signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return how


def failure_message(summary: Mapping[str, Any], reason: str | None = None) -> str:
    """Why the run failed; with restarts, every attempt's cause first, and why no more ran."""
    tried = attempts.failed_words(summary.get("attempts") or [], summary.get("abort"))
    message = _how_it_failed(summary, reason)
    return f"{tried}\n{message}" if tried else message


def result_line(summary: Mapping[str, Any]) -> str | None:
    """What a run that succeeded after restarts says of it, or None."""
    return attempts.succeeded_words(summary.get("attempts") or [], summary.get("max_attempts") or 1)


def _how_it_failed(summary: Mapping[str, Any], reason: str | None) -> str:
    c = summary["failed_rank"]
    abort = summary.get("abort") or {}
    note = f"\n{summary['note']}" if summary.get("note") else ""
    if abort and abort.get("kind") == vocab.AbortKind.NOT_STARTED:
        return f"run {summary['run_id']} never got going: {abort['reason']}{note}"
    if abort and abort.get("kind") != vocab.AbortKind.RANK_FAILED:
        message = f"run {summary['run_id']} was stopped by its guards: {abort['reason']}"
        # A unit killed with its guard (docker kill of its container) shows only as silence.
        if c is not None and c["exit_code"] is not None:
            message += f"; rank {c['rank']} on {c['host']} {_how_it_ended(c['exit_code'])}"
        stopped = [r for r in summary["ranks"] if r["outcome"] == RankOutcome.STOPPED]
        missing = set(summary.get("logs_missing") or ())
        kept = sorted({r["host"] for r in summary["ranks"] if r.get("log")} - missing)
        message += f"; {len(stopped)} rank(s) stopped, logs kept from {', '.join(kept) or 'no node'}"
        # The nodes the controller could not reach are the note's.
        missing -= set(summary.get("unreachable") or ())
        if missing:
            message += (f"; the logs of {', '.join(sorted(missing))} did not arrive: `torchfleet collect "
                        f"{summary['run_id']}` fetches them")
        return message + note
    if c is None:
        message = f"run {summary['run_id']} was stopped: {reason or 'not every rank finished'}"
        master = summary["ranks"][0] if summary["ranks"] else None
        if master and master.get("log_tail"):
            message += f"\n--- last lines of rank 0 on {master['host']} ---\n{master['log_tail']}"
        return message + note
    how = _how_it_ended(c["exit_code"])
    # A unit that its scheduler let go of (a cancelled Slurm step) was stopped by its own
    # guard: its exit code is the guard's, and the abort says what happened.
    if abort.get("cause") and abort.get("host") == c["host"]:
        how = f"{how} after {abort['cause']}"
    return (
        f"rank {c['rank']} on {c['host']} {how}; the other ranks were stopped and none is left "
        f"running. Log: {c['log']}\n--- last lines of rank {c['rank']} ---\n{c['log_tail']}{note}"
    )


def write_summary(summary: Mapping[str, Any], run_dir: str | Path) -> Path:
    path = Path(run_dir) / vocab.SUMMARY
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def plot_losses(summary: Mapping[str, Any], run_dir: str | Path) -> str | None:
    """A PNG of every rank's loss over steps; None where no rank printed a loss, or matplotlib
    is not installed."""
    curves = [row for row in summary["ranks"] if row["curve"]]
    if not curves:
        return None  # before matplotlib's import, which costs a stop half a second
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for row in curves:
        steps, losses = zip(*row["curve"])
        ax.plot(steps, losses, marker=".", label=f"rank {row['rank']} ({row['host']})")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step (batch)")
    ax.set_ylabel("training loss")
    ax.set_title(f"torchfleet run {summary['run_id']}")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(run_dir) / "loss.png"
    fig.savefig(path)
    plt.close(fig)
    return str(path)
