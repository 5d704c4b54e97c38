import json

import pytest

from torchfleet.report import (apply_guards, choose_culprit, failure_message, format_table, guard_key, parse_steps,
                               run_files, summarize)

OK_LOG = """2026-11-22T03:46:10.166Z INFO     [rank {r}] Using distributed PyTorch with gloo backend
2026-11-22T03:46:17.365Z INFO     [rank {r}] Train Epoch: 1 [0/10 (0%)]\tloss=2.2662
2026-11-22T03:46:18.218Z INFO     [rank {r}] Train Epoch: 1 [9/10 (90%)]\tloss=2.2422
2026-11-22T03:46:18.900Z INFO     [rank {r}] Train Epoch: 2 [0/10 (0%)]\tloss=1.5000
"""
PEER_LOG = OK_LOG + "RuntimeError: [pair.cc:537] Read error [172.29.0.3]:31113: Connection reset by peer.\n"


def table(n=3):
    return {
        "master_addr": "10.0.0.1",
        "master_port": 29500,
        "world_size": n,
        "ranks": [{"rank": r, "host": f"node-{r + 1}"} for r in range(n)],
    }


def final(rank, code, finished, stopped=False):
    return {"rank": rank, "exit_code": code, "started_at": "2026-11-22T03:46:00.000000000Z",
            "finished_at": finished, "stopped_by_torchfleet": stopped}


def test_parse_steps_counts_global_steps():
    steps = parse_steps(OK_LOG.format(r=0))
    assert [(s["epoch"], s["step"], s["loss"]) for s in steps] == [(1, 0, 2.2662), (1, 9, 2.2422), (2, 10, 1.5)]
    assert steps[0]["time"] == "2026-11-22T03:46:17.365Z"


def test_summary_of_a_good_run(tmp_path):
    for r in range(3):
        (tmp_path / f"rank-{r}.log").write_text(OK_LOG.format(r=r))
        (tmp_path / f"checksum-rank-{r}.txt").write_text("abc\n")
    finals = [final(r, 0, "2026-11-22T03:46:20.5Z") for r in range(3)]
    s = summarize("run1", table(), finals, tmp_path)
    assert s["ok"] and s["checksums_equal"] and s["failed_rank"] is None
    assert [(r["rank"], r["exit_code"], r["duration_s"], r["last_loss"]) for r in s["ranks"]] == [
        (0, 0, 20.5, 1.5), (1, 0, 20.5, 1.5), (2, 0, 20.5, 1.5)]
    assert s["ranks"][0]["curve"] == [[0, 2.2662], [9, 2.2422], [10, 1.5]]
    lines = format_table(s)
    assert lines[2].split() == ["0", "node-1", "0", "ok", "20.5s", "1.5000", "-", "-"]
    json.dumps(s)


def test_the_killed_rank_is_blamed_not_the_peers_that_lost_it(tmp_path):
    # The peers finished a hair *earlier* than the killed rank by docker's clock, but
    # their logs show they only lost a peer.
    (tmp_path / "rank-0.log").write_text(PEER_LOG.format(r=0))
    (tmp_path / "rank-1.log").write_text(OK_LOG.format(r=1))
    (tmp_path / "rank-2.log").write_text(PEER_LOG.format(r=2))
    finals = [final(0, 1, "2026-11-22T03:47:04.80Z"), final(1, 137, "2026-11-22T03:47:04.90Z"),
              final(2, 1, "2026-11-22T03:47:04.85Z")]
    s = summarize("run2", table(), finals, tmp_path)
    assert not s["ok"]
    assert s["failed_rank"]["rank"] == 1
    msg = failure_message(s)
    assert msg.startswith("rank 1 on node-2 exited with code 137 (killed by SIGKILL); the other ranks were stopped")


def test_a_unit_killed_with_its_guard_is_named_beside_the_guards_reason(tmp_path):
    """docker kill of a rank's container: the guards see only its silence (a lost node),
    the report adds how the rank ended."""
    (tmp_path / "rank-0.log").write_text(PEER_LOG.format(r=0))
    (tmp_path / "rank-1.log").write_text(OK_LOG.format(r=1))
    finals = [final(0, 1, "2026-11-22T03:47:04.80Z", stopped=True), final(1, 137, "2026-11-22T03:47:04.90Z")]
    abort = {"kind": "node_lost", "host": "node-2", "reason": "lost node-2: no heartbeat for 4s "
             "(launch_node_timeout); rank 1 on node-2 stopped answering"}
    s = summarize("run3", table(2), finals, tmp_path, abort=abort)
    assert failure_message(s) == (
        "run run3 was stopped by its guards: lost node-2: no heartbeat for 4s (launch_node_timeout); rank 1 on "
        "node-2 stopped answering; rank 1 on node-2 exited with code 137 (killed by SIGKILL); 1 rank(s) stopped, "
        "logs kept from node-1, node-2")


def test_stopped_ranks_are_not_blamed():
    rows = [
        {"rank": 0, "outcome": "stopped", "peer_error": False, "finished_at": "2026-11-22T00:00:01Z"},
        {"rank": 1, "outcome": "failed", "peer_error": False, "finished_at": "2026-11-22T00:00:02Z",
         "host": "b", "exit_code": 3, "log": None, "log_tail": ""},
    ]
    assert choose_culprit(rows)["rank"] == 1


def test_a_timeout_names_the_reason(tmp_path):
    finals = [final(r, 137, "2026-11-22T03:47:04Z", stopped=True) for r in range(2)]
    s = summarize("run3", table(2), finals, tmp_path)
    assert not s["ok"] and s["failed_rank"] is None
    assert failure_message(s, "no result after 60s (launch_timeout)") == (
        "run run3 was stopped: no result after 60s (launch_timeout)")


def test_workers_never_started_are_not_blamed_when_the_master_never_listened(tmp_path):
    (tmp_path / "rank-0.log").write_text("waiting in init_process_group\n")
    finals = [final(0, 137, "2026-11-22T03:48:00.0Z", stopped=True)]
    s = summarize("run3", table(), finals, tmp_path, master_listened=False)
    assert [r["outcome"] for r in s["ranks"]] == ["stopped", "not started", "not started"]
    assert not s["ok"] and s["failed_rank"] is None
    msg = failure_message(s, "10.0.0.1:29500 did not listen within 120s (launch_master_wait_timeout)")
    assert msg.startswith("run run3 was stopped: 10.0.0.1:29500 did not listen within 120s")
    assert msg.endswith("--- last lines of rank 0 on node-1 ---\nwaiting in init_process_group")



def test_workers_whose_guards_still_waited_for_the_master_are_not_started(tmp_path):
    """Every node's units start at once and a worker's guard waits for MASTER_PORT: where the
    master never listened, its record says the unit never started (guard.stop_child), not
    that it was stopped with the exit code its guard ended with."""
    finals = [final(0, 3, "2026-11-22T03:48:00.0Z")] + [final(r, 143, "2026-11-22T03:48:01.0Z") for r in (1, 2)]
    guards = {guard_key(None, f"job-run3-rank{r}", r): {"state": "stopped", "exit_code": 143, "not_started": True,
                                                        "stopped_because": "rank 0 on node-1 exited with code 3"}
              for r in (1, 2)}
    finals = apply_guards([dict(f, name=f"job-run3-rank{f['rank']}") for f in finals], guards)
    s = summarize("run3", table(), finals, tmp_path, master_listened=False)
    assert [(r["outcome"], r["exit_code"]) for r in s["ranks"]] == [("failed", 3), ("not started", None),
                                                                    ("not started", None)]
    assert s["failed_rank"]["rank"] == 0

MPIRUN_LOG = """[1,0]<stdout>:rank 0 up
[1,1]<stdout>:rank 1 up[1,1]<stdout>:
[1,2]<stdout>:rank 2 up
[1,1]<stdout>:rank 1: simulated crash
--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[39043,1],1]
  Exit code:    3
--------------------------------------------------------------------------
"""


def test_mpirun_output_splits_into_rank_logs_and_names_the_failed_rank():
    from torchfleet.modes.mpirun import rank_finals as mpirun_finals, split_log as split_mpirun_log

    logs = split_mpirun_log(MPIRUN_LOG, 3)
    assert logs == {0: "rank 0 up\n", 1: "rank 1 up\nrank 1: simulated crash\n", 2: "rank 2 up\n"}
    launcher = {"exit_code": 3, "started_at": "2026-11-22T06:37:10Z", "finished_at": "2026-11-22T06:37:16Z"}
    finals = mpirun_finals(launcher, MPIRUN_LOG, 3)
    assert [(f["rank"], f["exit_code"], f["stopped_by_torchfleet"]) for f in finals] == [
        (0, None, True), (1, 3, False), (2, None, True)]
    signalled = "mpirun noticed that process rank 2 with PID 77 on node node-3 exited on signal 9 (Killed)."
    assert mpirun_finals(launcher, signalled, 3)[2]["exit_code"] == 137
    assert all(f["exit_code"] == 0 for f in mpirun_finals(dict(launcher, exit_code=0), "", 3))


TORCHRUN_LOG = """W1122 06:49:44 torch/distributed/run.py:865] node_rank is only used for static rdzv_backend.
[default0]:2026-11-22T06:50:00.000Z INFO     [rank 2] Joined
[default1]:2026-11-22T06:50:00.100Z INFO     [rank 3] Joined
[default1]:rank 3: simulated crash
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_06:50:02
  host      : node-2
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 77)
"""


def test_torchrun_output_splits_by_local_rank_and_names_the_failed_one():
    from torchfleet.modes.torchrun import node_finals as torchrun_finals, split_log as split_torchrun_log

    logs = split_torchrun_log(TORCHRUN_LOG, 2)
    assert logs[0] == "2026-11-22T06:50:00.000Z INFO     [rank 2] Joined\n"
    assert logs[1].splitlines() == ["2026-11-22T06:50:00.100Z INFO     [rank 3] Joined", "rank 3: simulated crash"]
    node = {"exit_code": 1, "started_at": "a", "finished_at": "b", "stopped_by_torchfleet": False}
    finals = torchrun_finals(node, TORCHRUN_LOG, [2, 3])
    assert [(f["rank"], f["exit_code"], f["stopped_by_torchfleet"]) for f in finals] == [(2, None, True), (3, 137, False)]
    stopped = torchrun_finals(dict(node, exit_code=137, stopped_by_torchfleet=True), "", [0, 1])
    assert [(f["exit_code"], f["stopped_by_torchfleet"]) for f in stopped] == [(None, True), (None, True)]


def test_summary_shows_each_ranks_cpuset_and_spec_where_one_launcher_ran_them(tmp_path):
    # torchrun, mpirun and bare processes report no cpuset of their ranks: the spec has it.
    finals = [final(r, 0, "2026-11-22T03:46:20.5Z") for r in range(2)]
    spec = table(2)
    spec["ranks"][0].update(cpuset="0", cpuset_mems="0", runner="torchrun")
    spec["ranks"][1].update(cpuset="1", cpuset_mems=None, runner="torchrun")
    s = summarize("run4", spec, finals, tmp_path)
    assert [(r["cpuset"], r["cpuset_mems"]) for r in s["ranks"]] == [("0", "0"), ("1", None)]
    assert [r["spec"]["runner"] for r in s["ranks"]] == ["torchrun", "torchrun"]
    assert format_table(s)[3].split()[-2:] == ["1", "-"]
    # A rank's own container reports what docker applied.
    finals[0].update(cpuset="0-1", cpuset_mems="0")
    assert summarize("run4", spec, finals, tmp_path)["ranks"][0]["cpuset"] == "0-1"


def test_a_job_that_writes_no_checksums_gets_no_checksum_verdict(tmp_path):
    s = summarize("run5", table(2), [final(r, 0, "2026-11-22T03:46:20.5Z") for r in range(2)], tmp_path)
    assert s["ok"] and s["checksums"] == {} and s["checksums_equal"] is None
    (tmp_path / "checksum-rank-0.txt").write_text("abc")
    assert summarize("run5", table(2), [final(r, 0, "2026-11-22T03:46:20.5Z") for r in range(2)],
                     tmp_path)["checksums_equal"] is False


def _spec(mode, units):
    return {"mode": mode, "master_host": "node-1",
            "ranks": [{"rank": 2, "host": "node-2"}, {"rank": 0, "host": "node-1"}, {"rank": 1, "host": "node-1"}],
            "guard": {"units": [{"host": h} for h in units]}}


def test_each_node_brings_its_own_ranks_and_guards_and_the_master_the_run_state_and_model():
    spec = _spec("container", ["node-1", "node-1", "node-2"])
    assert run_files(spec, "node-1") == [
        ("rank-0.log", "rank-0.log"), ("checksum-rank-0.txt", "checksum-rank-0.txt"),
        ("rank-1.log", "rank-1.log"), ("checksum-rank-1.txt", "checksum-rank-1.txt"),
        ("guard-0.json", "guard-0.json"), ("guard-1.json", "guard-1.json"),
        ("job.json", "job.json"), ("model.pt", "model.pt")]
    assert run_files(spec, "node-2") == [
        ("rank-2.log", "rank-2.log"), ("checksum-rank-2.txt", "checksum-rank-2.txt"), ("guard-2.json", "guard-2.json")]
    assert run_files(spec, "node-3") == []


def test_torchrun_output_is_named_after_its_node_and_mpirun_output_comes_from_the_master():
    torchrun = _spec("torchrun", ["node-1", "node-2"])
    assert ("torchrun.log", "torchrun-node-2.log") in run_files(torchrun, "node-2")
    assert ("torchrun.log", "torchrun-node-1.log") in run_files(torchrun, "node-1")
    mpirun = _spec("mpirun", ["node-2", "node-1"])
    assert ("mpirun.log", "mpirun.log") in run_files(mpirun, "node-1")
    assert not [f for f in run_files(mpirun, "node-2") if "mpirun" in f[0]]


def test_the_loss_plot_is_drawn_only_where_a_rank_printed_a_loss(tmp_path):
    from torchfleet.report import plot_losses

    quiet = {"run_id": "r1", "ranks": [{"rank": 0, "host": "node-1", "curve": []}]}
    assert plot_losses(quiet, tmp_path) is None and not (tmp_path / "loss.png").exists()
    pytest.importorskip("matplotlib")
    loud = {"run_id": "r1", "ranks": [{"rank": 0, "host": "node-1", "curve": [[1, 2.3], [2, 1.9]]},
                                      {"rank": 1, "host": "node-2", "curve": []}]}
    assert plot_losses(loud, tmp_path) == str(tmp_path / "loss.png")
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
