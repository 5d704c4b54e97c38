"""A run's attempts as the controller shows them (launch_max_restarts): the table of the
store host's job.json, the step each attempt resumed from (read from the ranks' own logs),
the words status, attach, runs and the report use, and where a follow goes when the master
is lost. Pure functions; a run without restarts has no attempts and reads as before."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable, Mapping

from torchfleet import run_vocab as vocab

# job.json's keys for the attempts (docs/recovery.md#the-record); absent without restarts.
ATTEMPT, MAX_ATTEMPTS, ATTEMPTS, RESTARTING, MOVED_TO = "attempt", "max_attempts", "attempts", "restarting", "moved_to"

# A unit's log holds every attempt, each after the guard's banner; attempt K >= 2 also has
# a copy of its own (run_vocab.attempt_log).
BANNER_RE = re.compile(re.escape(vocab.ATTEMPT_BANNER) + r"(?P<attempt>\d+) of \d+")
ATTEMPT_LOG_RE = re.compile(r"\.attempt-(?P<attempt>\d+)\.log$")
# The bundled workload's line where its rank 0 says where it began (files/workloads/mnist.py).
RESUME_RE = re.compile(r"\[rank 0\] (?:resumed from step (?P<step>\d+)|starting from step 0\b)")


def is_attempt_log(name: str) -> bool:
    """Whether ``name`` is an attempt's copy of a unit's log (its lines are in the main log too)."""
    return bool(ATTEMPT_LOG_RE.search(name))


def attempt_logs(log: str, max_restarts: int) -> list[str]:
    """Every copy a unit's log ``log`` may have, one per attempt after the first."""
    return [vocab.attempt_log(log, k) for k in range(2, int(max_restarts or 0) + 2)]


def by_attempt(text: str) -> dict[int, str]:
    """A unit's main log cut at the guard's banners: attempt 1's lines come before the first
    banner of a later attempt."""
    sections: dict[int, list[str]] = {1: []}
    current = 1
    for line in text.splitlines():
        banner = BANNER_RE.search(line)
        if banner:
            current = int(banner["attempt"])
            sections.setdefault(current, [])
            continue
        sections.setdefault(current, []).append(line)
    return {k: "\n".join(v) for k, v in sections.items()}


def resumed_steps(run_dir: str | Path) -> dict[int, int | None]:
    """The step each attempt's rank 0 resumed from, by attempt, from the logs in ``run_dir``
    (runs/RUN/): an attempt's own copy of a log, else its part of a main log. The first of
    rank 0's resume lines in an attempt's text is that attempt's (a log split by rank loses
    the banners, and then holds the later attempts' lines after it). None: it started from
    step 0."""
    found: dict[int, int | None] = {}
    logs = sorted(Path(run_dir).glob(vocab.LOGS))
    # The copies first: they hold one attempt each.
    for path in sorted(logs, key=lambda p: not is_attempt_log(p.name)):
        copy = ATTEMPT_LOG_RE.search(path.name)
        text = path.read_text(errors="replace")
        parts = {int(copy["attempt"]): text} if copy else by_attempt(text)
        for attempt, part in parts.items():
            match = RESUME_RE.search(part)
            if match and attempt not in found:
                found[attempt] = int(match["step"]) if match["step"] is not None else None
    return found


def table(job: Mapping[str, Any] | None, run_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """job.json's attempts, each with ``resumed_from`` (the step its rank 0 resumed from,
    or None) when ``run_dir`` holds the logs; [] for a run without restarts."""
    rows = [dict(a) for a in (job or {}).get(ATTEMPTS) or []]
    steps = resumed_steps(run_dir) if run_dir is not None and rows else {}
    for row in rows:
        row["resumed_from"] = steps.get(int(row.get("attempt") or 0))
    return rows


def position(job: Mapping[str, Any] | None) -> tuple[int, int]:
    """(attempt, max_attempts) of a run's job.json; (1, 1) for a run without restarts."""
    job = job or {}
    return int(job.get(ATTEMPT) or 1), int(job.get(MAX_ATTEMPTS) or 1)


def cause(row: Mapping[str, Any]) -> str:
    """Why attempt ``row`` ended (its cause's reason), or its state."""
    why = row.get("cause") or {}
    return why.get("reason") or why.get("kind") or str(row.get("state") or "running")


def history(rows: Iterable[Mapping[str, Any]], last: Mapping[str, Any] | None = None) -> str:
    """'attempt 1: rank 1 on node-2 exited with code 137; attempt 2: ...', each attempt's
    cause; ``last`` (the run's abort) speaks for an attempt whose own cause is not recorded."""
    rows = list(rows)
    parts = []
    for row in rows:
        text = cause(row)
        if row is rows[-1] and last and not row.get("cause"):
            text = last.get("reason") or text
        parts.append(f"attempt {row.get('attempt')}: {text}")
    return "; ".join(parts)


def failed_words(rows: list[Mapping[str, Any]], abort: Mapping[str, Any] | None) -> str | None:
    """A failed run's attempts, named, and why no more ran (the abort's ``final``), or None
    for a run without restarts."""
    if not rows:
        return None
    final = (abort or {}).get("final")
    return history(rows, abort) + (f"; {final}" if final else "")


def succeeded_words(rows: list[Mapping[str, Any]], max_attempts: int) -> str | None:
    """'succeeded in attempt 2 of 3 (attempt 1: ...)', or None where the first attempt ran
    to the end (or the run has no restarts)."""
    if len(rows) < 2:
        return None
    return f"succeeded in attempt {rows[-1].get('attempt')} of {max_attempts} ({history(rows[:-1])})"


def running_words(job: Mapping[str, Any] | None) -> str | None:
    """'attempt 2 of 3' (', restarting' between two attempts) for a run with restarts, or
    None (``job``: job.json, or a RunStatus's fields)."""
    attempt, most = position(job)
    if most <= 1:
        return None
    return f"attempt {attempt} of {most}" + (", restarting" if (job or {}).get(RESTARTING) else "")


def ended_lines(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """One line per attempt that ended: its number, nodes and world size, why it ended and,
    where known, the step it resumed from."""
    lines = []
    for a in rows:
        if not (a.get("ended_at") or a.get("cause")):
            continue
        resumed = f", resumed from step {a['resumed_from']}" if a.get("resumed_from") is not None else ""
        lines.append(f"attempt {a.get('attempt')} on {', '.join(a.get('nodes') or []) or '-'} (world size "
                     f"{a.get('world_size', '-')}{resumed}): {cause(a)}")
    return lines


def speaks_for_run(job: Mapping[str, Any] | None) -> bool:
    """Whether a node's job.json is the run's record: not an old master's that the run left
    (moved_to names the node that took over)."""
    return bool(job) and not job.get(MOVED_TO) and job.get("state") != vocab.RunState.MOVED


def newest_record(jobs: Iterable[Mapping[str, Any] | None]) -> Mapping[str, Any] | None:
    """Of several nodes' job.json, the one that speaks for the run (the latest written,
    where more than one does), else the latest of those that moved; None where none is."""
    jobs = [j for j in jobs if j]
    if not jobs:
        return None
    speaking = [j for j in jobs if speaks_for_run(j)] or jobs
    return max(speaking, key=lambda j: (int(j.get(ATTEMPT) or 1), str(j.get("updated_at") or "")))


def follow_order(spec: Mapping[str, Any]) -> list[str]:
    """The nodes a follow moves to, in node order, when the master is lost or moved: every
    node of the run but the master (node rank 0), as the guards move the store."""
    ranks = sorted(spec.get("ranks") or [], key=lambda r: (int(r.get("node_rank", 0)), int(r.get("rank", 0))))
    hosts = [r["host"] for r in ranks] or [u["host"] for u in (spec.get("guard") or {}).get("units") or []]
    return [h for h in dict.fromkeys(hosts) if h != spec.get("master_host")]
