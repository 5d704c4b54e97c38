"""A run's status from what `run.yml` showed: the master's record of the run, or every
node's own records where that record could not answer (the launch role's control_master.yml
and control.yml)."""

from __future__ import annotations

from typing import Any, Mapping

from torchfleet.vocab import run_vocab as vocab

# Where a status was read from (RunStatus.source).
FROM_RECORD = "record"
FROM_NODES = "nodes"


def from_view(view: Mapping[str, Any]) -> dict[str, Any]:
    """RunStatus's fields but the run id: ``state``, ``job``, ``abort``, ``nodes``,
    ``unreachable``, ``source`` and ``note`` (why every node was read, or None)."""
    record = view.get("record")
    if record:
        return {"state": record["state"], "job": record.get("job"), "abort": record.get("abort"),
                "nodes": dict(record.get("nodes") or {}), "unreachable": [], "source": FROM_RECORD, "note": None}
    nodes = {h: r for h, r in (view.get("nodes") or {}).items() if r}
    master = next((r for r in nodes.values() if r.get("job_state")), None)
    states = [r.get("state") for r in nodes.values()]
    if master:
        state, abort = master["job_state"]["state"], master["job_state"].get("abort")
    else:
        state = vocab.RunState.RUNNING.value if vocab.RunState.RUNNING in states else (
            states[0] if states else vocab.RunState.UNKNOWN.value)
        abort = next((u.get("abort") for r in nodes.values() for u in r.get("units", []) if u.get("abort")), None)
    return {"state": state, "job": next((r.get("job") for r in nodes.values()), None), "abort": abort,
            "nodes": nodes, "unreachable": list(view.get("unreachable") or []), "source": FROM_NODES,
            "note": why_every_node(view.get("master"))}


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
    if state != vocab.RunState.RUNNING:
        return None  # a run that ended: its units' own records say how each ended
    if age is None:
        return f"read from every node: {host} holds no record of the run ({vocab.JOB}) yet"
    return f"read from every node: the run's record on {host} was last written {age:g}s ago, so its guard is gone"
