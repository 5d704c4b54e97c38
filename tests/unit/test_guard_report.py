"""How the guards' records enter a run's report."""

import json

from torchfleet import report


def write(tmp_path, name, data):
    (tmp_path / name).write_text(json.dumps(data))


def test_a_rank_its_guard_stopped_is_stopped_with_the_guards_reason(tmp_path):
    write(tmp_path, "guard-0.json", {"unit": 0, "name": "c-rank0", "role": "rank", "ranks": [0], "state": "stopped",
                                     "exit_code": 143, "stopped_because": "rank 1 on node-2 exited with code 3"})
    write(tmp_path, "guard-1.json", {"unit": 1, "name": "c-rank1", "role": "rank", "ranks": [1], "state": "exited",
                                     "exit_code": 3})
    write(tmp_path, "job.json", {"state": "failed", "abort": {"kind": "rank_failed", "host": "node-2",
                                                              "reason": "rank 1 on node-2 exited with code 3"}})
    guards, abort = report.guard_records(tmp_path)
    assert abort["host"] == "node-2"
    finals = report.apply_guards([{"name": "c-rank0", "rank": 0, "exit_code": 137, "stopped_by_torchfleet": True},
                                  {"name": "c-rank1", "rank": 1, "exit_code": 3}], guards)
    assert finals[0]["stopped_because"] == "rank 1 on node-2 exited with code 3"
    assert finals[0]["exit_code"] == 143 and finals[0]["stopped_by_torchfleet"]
    assert finals[1]["stopped_by_torchfleet"] is False and finals[1]["exit_code"] == 3


def test_torchrun_agents_of_the_same_name_are_told_apart_by_their_first_rank(tmp_path):
    for unit, (ranks, state) in enumerate([([0, 1], "stopped"), ([2, 3], "exited")]):
        write(tmp_path, f"guard-{unit}.json", {"unit": unit, "name": "c-torchrun", "role": "torchrun", "ranks": ranks,
                                               "state": state, "exit_code": 1, "stopped_because": "x" if unit == 0 else None})
    guards, _ = report.guard_records(tmp_path)
    finals = report.apply_guards([{"name": "c-torchrun", "rank": 0}, {"name": "c-torchrun", "rank": 2}], guards)
    assert [f["stopped_by_torchfleet"] for f in finals] == [True, False]


def test_a_unit_whose_container_is_gone_is_reported_from_its_guard(tmp_path):
    write(tmp_path, "guard-0.json", {"unit": 0, "name": "c-rank0", "role": "rank", "ranks": [0], "state": "stopped",
                                     "exit_code": 143, "stopped_because": "replaced by run new (launch_replace)",
                                     "started_at": "2026-01-01T00:00:00Z", "ended_at": "2026-01-01T00:01:00Z"})
    guards, abort = report.guard_records(tmp_path)
    assert abort is None
    (final,) = report.apply_guards([], guards)
    assert final["rank"] == 0 and final["stopped_because"] == "replaced by run new (launch_replace)"
    spec = {"master_addr": "10.0.0.1", "master_port": 29500, "world_size": 1,
            "ranks": [{"rank": 0, "host": "node-1"}]}
    summary = report.summarize("old", spec, [final], tmp_path,
                               abort={"kind": "stopped", "host": "node-1", "reason": "replaced by run new"})
    assert summary["ranks"][0]["outcome"] == "stopped" and summary["ranks"][0]["duration_s"] == 60.0
    assert not summary["ok"] and summary["abort"]["kind"] == "stopped"
    assert report.failure_message(summary).startswith("run old was stopped by its guards: replaced by run new")


def test_a_worker_left_out_of_a_run_that_succeeded_does_not_fail_it(tmp_path):
    """With restarts, a worker lost in attempt 3 and back before the end waits, left out, while
    attempt 4 succeeds without it; its guard keeps attempt 3's abort (found by bench/soak.py:
    the launch said exit 5, its last attempt and the master's record said succeeded)."""
    lost = {"kind": "node_lost", "host": "node-3", "hosts": ["node-3"], "unit": "c-rank2",
            "reason": "lost node-3: no heartbeat for 10s (launch_node_timeout); rank 2 on node-3 stopped answering"}
    for unit in (0, 1):
        write(tmp_path, f"guard-{unit}.json", {"unit": unit, "name": f"c-rank{unit}", "role": "rank",
                                               "ranks": [unit], "state": "exited", "exit_code": 0, "abort": None})
    write(tmp_path, "guard-2.json", {"unit": 2, "name": "c-rank2", "role": "rank", "ranks": [2], "state": "left_out",
                                     "exit_code": 143, "abort": lost})
    write(tmp_path, "job.json", {"state": "succeeded", "abort": None})
    guards, abort = report.guard_records(tmp_path)
    assert abort is None and guards[("c-rank2", 2)]["abort"] == lost
    # Without the master's record, the guards' own still say how the run ended.
    (tmp_path / "job.json").unlink()
    assert report.guard_records(tmp_path)[1] == lost
