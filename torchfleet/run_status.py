"""A run's status from what playbooks/status.yml showed: the master's record of the run, or
every node's own records where that record could not answer (the launch role's
status_master.yml and status.yml); and the runs list from every node's runs."""

from __future__ import annotations

from typing import Any, Mapping

from torchfleet import attempts
from torchfleet import run_vocab as vocab

# Where a status was read from (RunStatus.source).
FROM_RECORD = "record"
FROM_NODES = "nodes"


def from_view(view: Mapping[str, Any]) -> dict[str, Any]:
    """RunStatus's fields but the run id: ``state``, ``job``, ``abort``, ``nodes``,
    ``unreachable``, ``source`` and ``note`` (why every node was read, or None)."""
    record = view.get("record")
    if record:
        return {"state": record["state"], "job": record.get("job"), "abort": record.get("abort"),
                "nodes": dict(record.get("nodes") or {}), "unreachable": [], "source": FROM_RECORD, "note": None,
                **attempt_fields(record)}
    nodes = {h: r for h, r in (view.get("nodes") or {}).items() if r}
    # The store's host's job.json; with restarts, the node's the run moved to, not an old master's.
    master = attempts.newest_record(r.get("job_state") for r in nodes.values())
    units = [u for r in nodes.values() for u in r.get("units", [])]
    state = vocab.run_state(job=master, units=units)
    abort = (master or {}).get("abort") if master else next((u["abort"] for u in units if u.get("abort")), None)
    return {"state": state, "job": next((r.get("job") for r in nodes.values()), None), "abort": abort,
            "nodes": nodes, "unreachable": list(view.get("unreachable") or []), "source": FROM_NODES,
            "note": why_every_node(view.get("master")), **attempt_fields(master)}


def runs_from_view(view: Mapping[str, Any], summaries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every run that the nodes hold (``view``: what `torchfleet runs` read, by node) and every
    run with a summary on the controller (``summaries``, by run id), oldest first: run_id,
    job, state, where it was found (nodes, local), the nodes that did not answer, and its
    attempt of how many (1 of 1 without restarts)."""
    found: dict[str, dict[str, Any]] = {}
    reads: dict[str, list[Mapping[str, Any]]] = {}
    for host, node in sorted((view.get("nodes") or {}).items()):
        for r in node or []:
            entry = found.setdefault(r["run_id"], {"run_id": r["run_id"], "job": r.get("job"), "nodes": []})
            entry["nodes"].append(host)
            reads.setdefault(r["run_id"], []).append(r)
    for run_id in sorted(set(found) | set(summaries)):
        entry = found.setdefault(run_id, {"run_id": run_id, "job": None, "nodes": []})
        summary = summaries.get(run_id)
        entry["local"] = summary is not None
        # The master's job.json speaks for the run (with restarts, the node's the run moved
        # to); then every node's units; then the controller's summary.
        record = attempts.newest_record(r.get("job_state") for r in reads.get(run_id, []))
        entry["state"] = vocab.run_state(job=record, units=[u for r in reads.get(run_id, []) for u in r.get("units", [])],
                                         summary=summary)
        entry["attempt"], entry["max_attempts"] = (attempts.position(record) if record or not summary else
                                                   (summary.get("attempt") or 1, summary.get("max_attempts") or 1))
        entry["unreachable"] = list(view.get("unreachable") or [])
    return [found[k] for k in sorted(found)]


def attempt_fields(job: Mapping[str, Any] | None) -> dict[str, Any]:
    """RunStatus's attempt fields from the run's record (job.json, or the master's record of
    it): ``attempt``, ``max_attempts``, ``restarting`` and ``attempts``; a run without
    restarts is attempt 1 of 1."""
    attempt, most = attempts.position(job)
    return {"attempt": attempt, "max_attempts": most, "restarting": bool((job or {}).get(attempts.RESTARTING)),
            "attempts": [dict(a) for a in (job or {}).get(attempts.ATTEMPTS) or []]}


def why_every_node(master: Mapping[str, Any] | None) -> str | None:
    """Why a status read every node rather than the master's record (``master``: the view's
    account of the master asked first), or None where that is the rule: the logs, and a run
    that ended."""
    if not master:
        return None
    host = master.get("host")
    if not host:
        return "read from every node: the inventory does not say which node is the master"
    if master.get("found") is None:
        return f"read from every node: the master {host} did not answer"
    if not master["found"]:
        return f"read from every node: {host}, the inventory's master, does not hold the run"
    state, age = master.get("state"), master.get("job_age_s")
    if state == vocab.RunState.MOVED:
        return (f"read from every node: {host} was the master until the run moved to "
                f"{master.get(attempts.MOVED_TO) or 'another node'}")
    if state != vocab.RunState.RUNNING:
        return None  # a run that ended: its units' own records say how each ended
    if age is None:
        return f"read from every node: {host} holds no record of the run ({vocab.JOB}) yet"
    return f"read from every node: the run's record on {host} was last written {age:g}s ago, so its guard is gone"
