"""A status read from the master's record of the run, with every node's own records as the
fallback, and a stop that the store's host sees at once (the launch role's status_master.yml and stop_master.yml)."""

import json
import os
import subprocess
import sys
import time

import pytest

from harness.guards import guard_folder
from ansible_collections.torchfleet.cluster.plugins.module_utils import run_folder, run_vocab
from torchfleet import ranks, run_status

UNITS = [{"name": f"r-rank{i}", "host": f"node-{i + 1}", "role": "rank", "ranks": [i]} for i in range(3)]
CONFIG = {"run_id": "r1", "job": "mnist", "units": UNITS, "store_unit": 0, "node_timeout": 10}


def job(state="running", codes=(None, None, None), ages=(0.4, 0.6, None), abort=None):
    return {"run_id": "r1", "job": "mnist", "state": state, "abort": abort, "updated_at": "2026-11-27T16:00:00.0Z",
            "units": [{"name": u["name"], "host": u["host"], "role": "rank", "exit_code": c, "heartbeat_age_s": a}
                      for u, c, a in zip(UNITS, codes, ages)]}


def master_folder(tmp_path, record, age_s=0.0):
    """The master's run folder as its guards leave it: guard.json, and job.json ``age_s`` old."""
    run = tmp_path / "r1"
    run.mkdir()
    (run / run_vocab.GUARD_CONFIG).write_text(json.dumps(CONFIG))
    (run / run_vocab.JOB).write_text(json.dumps(record))
    then = time.time() - age_s
    os.utime(run / run_vocab.JOB, (then, then))
    return run


def test_a_running_runs_record_on_the_master_gives_every_nodes_units(tmp_path):
    run = master_folder(tmp_path, job(codes=(None, 0, None)))
    record = run_folder.read_run(str(run), with_record=True)["record"]
    assert record["state"] == "running" and record["job"] == "mnist" and record["abort"] is None
    assert sorted(record["nodes"]) == ["node-1", "node-2", "node-3"]
    units = {h: n["units"] for h, n in record["nodes"].items()}
    # Beating: running; exited 0 while the run goes on: exited; not heard from yet: starting.
    assert [(u["name"], u["state"], u["exit_code"]) for h in sorted(units) for u in units[h]] == [
        ("r-rank0", "running", None), ("r-rank1", "exited", 0), ("r-rank2", "starting", None)]


@pytest.mark.parametrize("record, age_s", [
    (job(), 11.0),                                              # not rewritten for the node timeout
    (job("stopped", (143, 143, 143), abort={"kind": "stopped", "reason": "asked"}), 0.0),  # ended
    (dict(job(), units=job()["units"][:2]), 0.0),               # not this run's units
])
def test_a_record_that_cannot_speak_for_the_run_leaves_it_to_every_node(tmp_path, record, age_s):
    run = master_folder(tmp_path, record, age_s)
    assert run_folder.read_run(str(run), with_record=True)["record"] is None


def test_a_folder_without_the_stores_record_has_none(tmp_path):
    (tmp_path / "r1").mkdir()
    (tmp_path / "r1" / run_vocab.GUARD_CONFIG).write_text(json.dumps(CONFIG))
    assert run_folder.read_run(str(tmp_path / "r1"), with_record=True)["record"] is None
    assert "record" not in run_folder.read_run(str(tmp_path / "r1"))


def test_a_status_from_the_record_says_so_and_names_no_fallback():
    record = run_vocab.run_record(CONFIG, job(), 0.5)
    status = run_status.from_view({"record": record, "master": "node-1"})
    assert status["source"] == "record" and status["note"] is None and status["state"] == "running"
    assert status["nodes"]["node-2"]["units"][0]["state"] == "running" and status["unreachable"] == []


NODES_VIEW = {
    "nodes": {"node-1": {"job": "mnist", "state": "running", "job_state": {"state": "running", "abort": None},
                         "units": [{"name": "r-rank0", "state": "running"}]},
              "node-2": {"job": "mnist", "state": "running", "units": [{"name": "r-rank1", "state": "running"}]},
              "node-3": None},
    "unreachable": ["node-3"],
}


@pytest.mark.parametrize("master, note", [
    ({"host": "node-1", "found": None}, "read from every node: the master node-1 did not answer"),
    ({"host": "node-1", "found": False}, "read from every node: node-1, the inventory's master, does not hold the run"),
    ({"host": "node-1", "found": True, "state": "running", "job_age_s": 31.0},
     "read from every node: the run's record on node-1 was last written 31s ago, so its guard is gone"),
    ({"host": "node-1", "found": True, "state": "failed", "job_age_s": 2.0}, None),  # ended: the rule
    ({"host": None}, "read from every node: the inventory does not say which node is the master"),
    (None, None),  # the logs: every node, as asked
])
def test_a_status_read_from_every_node_says_why(master, note):
    status = run_status.from_view(dict(NODES_VIEW, master=master))
    assert status["source"] == "nodes" and status["note"] == note
    # What every node's records say, as before: the master's job.json for the run's state.
    assert status["state"] == "running" and sorted(status["nodes"]) == ["node-1", "node-2"]
    assert status["unreachable"] == ["node-3"] and status["job"] == "mnist"


@pytest.mark.parametrize("node_ranks, master", [
    ({}, "node-1"),
    ({"node-1": 2, "node-2": 0, "node-3": 1}, "node-2"),
    ({"node-2": 0}, None),  # set on some hosts only: the inventory cannot say
])
def test_the_master_asked_first_is_the_one_a_launch_from_the_inventory_makes(node_ranks, master):
    assert ranks.likely_master(["node-1", "node-2", "node-3"], node_ranks) == master


def test_a_stop_file_on_the_master_stops_the_run_well_within_a_poll(tmp_path):
    """The guard hosting the store, as a script with torch's real TCPStore and a poll of 30 s:
    a stop file written in its folder ends its unit within a few seconds, with the reason."""
    pytest.importorskip("torch.distributed")
    run, port = guard_folder(tmp_path)
    config = {"units": [dict(UNITS[0], log=str(run / "rank.log"))], "store_unit": 0, "node_timeout": 60,
              "run_id": "r", "job": "j", "poll_interval": 30, "stop_grace": 5,
              "store": {"host": "127.0.0.1", "port": port, "node": "node-1"}}
    (run / run_vocab.GUARD_CONFIG).write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    unit = subprocess.Popen([sys.executable, str(run / run_vocab.GUARD_SOURCE), str(run / run_vocab.GUARD_CONFIG),
                             "0", "--", "sh", "-c", "echo training; exec sleep 300"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while not (run / run_vocab.JOB).exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (run / run_vocab.JOB).exists(), "the store's host never wrote its record"
        asked = time.time()
        (run / run_vocab.STOP).write_text("stopped by the test\n")
        assert unit.wait(timeout=20) == 128 + 15, unit.stderr.read()
    finally:
        unit.kill()
    record = json.loads((run / run_vocab.guard_record(0)).read_text())
    assert record["state"] == "stopped" and record["stopped_because"] == "stopped by the test"
    assert record["sigterm_at"] - asked < 3, record["sigterm_at"] - asked
    assert json.loads((run / run_vocab.JOB).read_text())["abort"]["kind"] == "stopped"


def _hold(path):
    """A live guard's hold on its lock file (run_vocab.guard_lock)."""
    import fcntl

    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_masters_record_left_running_by_guards_that_are_gone_does_not_speak(tmp_path):
    """The master's container removed under its guard: job.json still says running and is
    fresh for a while, but no guard of the node is left to write the run's end. The folder
    then reads as its units' records say, and a status takes the run's state from the abort
    that the other nodes' guards recorded."""
    run = master_folder(tmp_path, job())
    (run / run_vocab.guard_record(0)).write_text(json.dumps({"unit": 0, "state": "running"}))
    fd = _hold(run / run_vocab.guard_lock(0))
    try:
        info = run_folder.read_run(str(run), with_record=True)
        assert info["state"] == "running" and info["record"]["state"] == "running"
    finally:
        os.close(fd)  # the guard is gone
    info = run_folder.read_run(str(run), with_record=True)
    assert info["job_state"] is None and info["record"] is None
    assert info["units"][0]["state"] == "gone" and info["state"] == "exited"
    lost = {"kind": "node_lost", "host": "node-2", "unit": 1, "reason": "the master node stopped answering"}
    worker = {"job": "mnist", "state": "failed", "units": [{"name": "r-rank1", "state": "stopped", "abort": lost}]}
    status = run_status.from_view({"nodes": {"node-1": info, "node-2": worker},
                                   "master": {"host": "node-1", "found": True, "state": info["state"]}})
    assert status["state"] == "failed" and status["abort"] == lost
    stopped = dict(lost, kind="stopped", reason="asked")
    worker["units"][0]["abort"] = stopped
    assert run_status.from_view({"nodes": {"node-1": info, "node-2": worker}})["state"] == "stopped"
