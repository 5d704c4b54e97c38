"""The record of a run with restarts (launch_max_restarts), as the controller reads and shows
it: summary.json's attempts table and the step each attempt resumed from, read from the
ranks' own logs; the failure message and result line; the status reader and the CLI's words;
and the follow that moves to the next node in node order when the master is lost or moved
(the launch role's follow.yml, run by ansible-playbook on local hosts)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_folder, run_vocab
from torchfleet import attempts, cli, report, run_status
from torchfleet.results import RunResult, RunStatus

ROOT = Path(__file__).resolve().parents[2]
BANNER = "[torchfleet guard] attempt {k} of 3: rank {r} of {n} on {host} (MASTER_ADDR=10.0.0.1, TORCHFLEET_RESTART_COUNT={c})"
STEP = "2026-11-27T10:00:0{s}.000Z INFO     [rank {r}] Train Epoch: 1 [{b}/20 (5%)]\tloss=2.2000"
RESUMED = "2026-11-27T10:00:30.000Z INFO     [rank {r}] resumed from step {step} (epoch 1, batch {step}) of /ckpt/x.pt"
FRESH = "2026-11-27T10:00:00.000Z INFO     [rank {r}] starting from step 0: no complete checkpoint in /ckpt"
CRASH = {"kind": "rank_failed", "host": "node-2", "unit": "r-rank1", "reason": "rank 1 on node-2 exited with code 137"}


def attempt(k, state, cause=None, nodes=("node-1", "node-2", "node-3"), master="node-1", ended=True):
    ranks = {h: [i] for i, h in enumerate(nodes)}
    return {"attempt": k, "started_at": f"2026-11-27T10:0{k}:00Z", "ended_at": f"2026-11-27T10:0{k}:50Z" if ended else None,
            "state": state, "cause": cause, "nodes": list(nodes), "master": master, "world_size": len(nodes),
            "ranks": ranks}


def job(state, rows, abort=None, master="node-1", **more):
    return {"run_id": "r1", "job": "mnist", "state": state, "attempt": rows[-1]["attempt"], "max_attempts": 3,
            "master": master, "moved_to": None, "restarting": False, "attempts": rows, "abort": abort,
            "updated_at": "2026-11-27T10:05:00.0Z", "units": [], **more}


def spec(n=3, restarts=2):
    return {"run_id": "r1", "mode": "container", "master_host": "node-1", "master_addr": "10.0.0.1",
            "master_port": 29500, "world_size": n,
            "ranks": [{"rank": r, "host": f"node-{r + 1}", "node_rank": r} for r in range(n)],
            "guard": {"max_restarts": restarts, "units": [{"host": f"node-{r + 1}"} for r in range(n)]}}


def final(rank, code, stopped=False):
    return {"rank": rank, "exit_code": code, "started_at": "2026-11-27T10:00:00Z", "finished_at": "2026-11-27T10:09:00Z",
            "stopped_by_torchfleet": stopped}


def crashed_then_resumed(run_dir):
    """Rank 0's log of a run whose rank 1 crashed in attempt 1 and that resumed from step 10
    in attempt 2, the way the guard and the bundled workload write it, plus attempt 2's copy."""
    attempt_2 = [BANNER.format(k=2, r=0, n=3, host="node-1", c=1), RESUMED.format(r=0, step=10),
                 STEP.format(s=9, r=0, b=11)]
    (run_dir / "rank-0.log").write_text("\n".join([FRESH.format(r=0), STEP.format(s=1, r=0, b=10), *attempt_2]) + "\n")
    (run_dir / run_vocab.attempt_log("rank-0.log", 2)).write_text("\n".join(attempt_2[1:]) + "\n")
    for r in (1, 2):
        (run_dir / f"rank-{r}.log").write_text(STEP.format(s=1, r=r, b=10) + "\n")


# --- summary.json and the report -------------------------------------------------------------------


def test_a_run_that_succeeded_in_its_second_attempt_has_both_in_its_summary_with_the_step_resumed_from(tmp_path):
    crashed_then_resumed(tmp_path)
    rows = [attempt(1, "failed", CRASH), attempt(2, "succeeded")]
    (tmp_path / run_vocab.JOB).write_text(json.dumps(job("succeeded", rows)))
    s = report.summarize("r1", spec(), [final(r, 0) for r in range(3)], tmp_path)
    assert s["ok"] and (s["attempt"], s["max_attempts"]) == (2, 3)
    assert [(a["attempt"], a["state"], a["resumed_from"], (a["cause"] or {}).get("kind")) for a in s["attempts"]] == [
        (1, "failed", None, "rank_failed"), (2, "succeeded", 10, None)]
    assert s["attempts"][0]["nodes"] == ["node-1", "node-2", "node-3"] and s["attempts"][1]["world_size"] == 3
    assert report.result_line(s) == ("succeeded in attempt 2 of 3 (attempt 1: rank 1 on node-2 exited with code 137)")
    # The attempt's copy of a log is no rank of its own.
    assert [r["rank"] for r in s["ranks"]] == [0, 1, 2]
    json.dumps(s)


def test_a_run_without_restarts_reads_as_before(tmp_path):
    (tmp_path / "rank-0.log").write_text(STEP.format(s=1, r=0, b=1) + "\n")
    (tmp_path / run_vocab.JOB).write_text(json.dumps({"run_id": "r1", "state": "succeeded", "abort": None, "units": []}))
    s = report.summarize("r1", spec(1, 0), [final(0, 0)], tmp_path)
    assert s["ok"] and (s["attempts"], s["attempt"], s["max_attempts"]) == ([], 1, 1)
    assert report.result_line(s) is None


def test_a_rank_on_a_node_the_last_attempt_ran_without_is_left_out_not_blamed(tmp_path):
    lost = {"kind": "node_lost", "host": "node-3", "reason": "node-3 stopped beating for 10s"}
    rows = [attempt(1, "failed", lost), attempt(2, "succeeded", nodes=("node-1", "node-2"))]
    (tmp_path / run_vocab.JOB).write_text(json.dumps(job("succeeded", rows)))
    for r in range(3):
        (tmp_path / run_vocab.checksum_file(r)).write_text("old\n" if r == 2 else "abc\n")
    s = report.summarize("r1", spec(), [final(0, 0), final(1, 0)], tmp_path)
    assert s["ok"] and s["failed_rank"] is None and s["checksums_equal"]
    assert [r["outcome"] for r in s["ranks"]] == ["ok", "ok", "left out"]
    assert report.format_table(s)[4].split()[3:5] == ["left", "out"]


def test_when_restarts_run_out_the_message_names_every_attempt_and_why_no_more_ran(tmp_path):
    crashed_then_resumed(tmp_path)
    final_abort = dict(CRASH, final="no restarts left (1 of 1 used)")
    rows = [attempt(1, "failed", CRASH), attempt(2, "failed", CRASH)]
    (tmp_path / run_vocab.JOB).write_text(json.dumps(job("failed", rows, final_abort, max_attempts=2)))
    finals = [final(0, 143, stopped=True), final(1, 137), final(2, 143, stopped=True)]
    s = report.summarize("r1", spec(restarts=1), finals, tmp_path, abort=final_abort)
    message = report.failure_message(s)
    assert message.splitlines()[0] == ("attempt 1: rank 1 on node-2 exited with code 137; attempt 2: rank 1 on node-2 "
                                       "exited with code 137; no restarts left (1 of 1 used)")
    assert "rank 1 on node-2 exited with code 137 (killed by SIGKILL)" in message.splitlines()[1]
    # The exit code stays the final abort's kind's (a rank's failure: 1; a lost node: 5).
    assert cli.EXIT_BY_ABORT.get(s["abort"]["kind"], cli.EXIT_JOB_FAILED) == cli.EXIT_JOB_FAILED
    assert (s["attempt"], s["max_attempts"]) == (2, 2)


def test_the_record_of_the_node_the_run_moved_to_speaks_for_it_not_the_old_masters(tmp_path):
    old = {"run_id": "r1", "state": "moved", "moved_to": "node-2", "units": [],
           "abort": {"kind": "moved", "host": "node-1", "reason": "replaced by node-2"}}
    rows = [attempt(1, "failed", {"kind": "node_lost", "host": "node-1", "reason": "the master node-1 was lost"}),
            attempt(2, "succeeded", nodes=("node-2", "node-3"), master="node-2")]
    (tmp_path / run_vocab.JOB).write_text(json.dumps(old))
    (tmp_path / report.node_job("node-2")).write_text(json.dumps(job("succeeded", rows, master="node-2")))
    (tmp_path / report.node_model("node-2")).write_bytes(b"model")
    (tmp_path / "model.pt").write_bytes(b"old model")
    assert report.job_record(tmp_path)["master"] == "node-2"
    s = report.summarize("r1", spec(), [final(1, 0), final(2, 0)], tmp_path)
    assert s["ok"] and s["abort"] is None and s["model"] == str(tmp_path / "model-node-2.pt")
    assert [r["outcome"] for r in s["ranks"]] == ["left out", "ok", "ok"]


def test_collect_brings_each_attempts_log_copy_and_each_nodes_record_only_with_restarts():
    with_restarts, without = spec(restarts=2), spec(restarts=0)
    assert ("rank-1.attempt-2.log", "rank-1.attempt-2.log") in report.run_files(with_restarts, "node-2")
    assert ("rank-1.attempt-3.log", "rank-1.attempt-3.log") in report.run_files(with_restarts, "node-2")
    assert ("rank-1.attempt-4.log", "rank-1.attempt-4.log") not in report.run_files(with_restarts, "node-2")
    assert (run_vocab.JOB, "job-node-2.json") in report.run_files(with_restarts, "node-2")
    assert ("model.pt", "model-node-2.pt") in report.run_files(with_restarts, "node-2")
    assert (run_vocab.JOB, run_vocab.JOB) in report.run_files(with_restarts, "node-1")
    assert report.run_files(without, "node-2") == [("rank-1.log", "rank-1.log"),
                                                    ("checksum-rank-1.txt", "checksum-rank-1.txt"),
                                                    ("guard-1.json", "guard-1.json")]


def test_a_torchrun_nodes_log_copies_are_named_after_its_node():
    torchrun = dict(spec(2, 1), mode="torchrun")
    assert ("torchrun.attempt-2.log", "torchrun-node-2.attempt-2.log") in report.run_files(torchrun, "node-2")


# --- the step resumed from -------------------------------------------------------------------------


def test_the_step_resumed_from_is_each_attempts_rank_0s_and_none_for_a_fresh_start(tmp_path):
    (tmp_path / "rank-0.log").write_text("\n".join([
        FRESH.format(r=0), BANNER.format(k=2, r=0, n=3, host="node-1", c=1), RESUMED.format(r=0, step=10),
        BANNER.format(k=3, r=1, n=2, host="node-1", c=2), RESUMED.format(r=1, step=20)]))
    # Attempt 3's rank 0 ran on node-2 (renumbered): its log says so.
    (tmp_path / "rank-1.log").write_text("\n".join([
        FRESH.format(r=1), BANNER.format(k=3, r=0, n=2, host="node-2", c=2), RESUMED.format(r=0, step=20)]))
    assert attempts.resumed_steps(tmp_path) == {1: None, 2: 10, 3: 20}


def test_a_log_split_by_rank_without_banners_gives_each_attempt_its_own_line(tmp_path):
    # torchrun's output split by rank keeps no banner: attempt 1 holds the later lines too,
    # and attempt 2's line comes from its copy.
    (tmp_path / "rank-0.log").write_text(FRESH.format(r=0) + "\n" + RESUMED.format(r=0, step=7) + "\n")
    (tmp_path / "torchrun-node-1.attempt-2.log").write_text("[default0]:" + RESUMED.format(r=0, step=7) + "\n")
    assert attempts.resumed_steps(tmp_path) == {1: None, 2: 7}
    assert attempts.is_attempt_log("torchrun-node-1.attempt-2.log") and not attempts.is_attempt_log("rank-2.log")


# --- the status reader -----------------------------------------------------------------------------


def test_a_status_from_the_masters_record_carries_the_attempt(tmp_path):
    units = [{"name": f"r-rank{i}", "host": f"node-{i + 1}", "role": "rank", "ranks": [i]} for i in range(2)]
    run = tmp_path / "r1"
    run.mkdir()
    (run / run_vocab.GUARD_CONFIG).write_text(json.dumps({"run_id": "r1", "job": "mnist", "units": units,
                                                           "node_timeout": 10}))
    record = job("running", [attempt(1, "failed", CRASH), attempt(2, "running", nodes=("node-1", "node-2"),
                                                                  ended=False)],
                 units=[{"name": u["name"], "exit_code": None, "heartbeat_age_s": 0.3} for u in units])
    (run / run_vocab.JOB).write_text(json.dumps(record))
    view = {"record": run_folder.read_run(str(run), with_record=True)["record"]}
    status = RunStatus(run_id="r1", **run_status.from_view(view))
    assert (status.source, status.attempt, status.max_attempts, status.restarting) == ("record", 2, 3, False)
    assert attempts.running_words(status.to_dict()) == "attempt 2 of 3"
    assert attempts.ended_lines(status.attempts) == [
        "attempt 1 on node-1, node-2, node-3 (world size 3): rank 1 on node-2 exited with code 137"]


def test_a_master_that_the_run_left_cannot_speak_for_it_and_every_node_is_read(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    (run / run_vocab.GUARD_CONFIG).write_text(json.dumps({"run_id": "r1", "units": [], "node_timeout": 10}))
    (run / run_vocab.JOB).write_text(json.dumps({"run_id": "r1", "state": "moved", "moved_to": "node-2", "units": []}))
    assert run_folder.read_run(str(run), with_record=True)["record"] is None
    new = job("running", [attempt(1, "failed", CRASH), attempt(2, "running", ended=False)], restarting=True,
              master="node-2")
    view = {"nodes": {"node-1": {"job_state": {"state": "moved", "moved_to": "node-2"}, "state": "moved", "units": []},
                      "node-2": {"job_state": new, "state": "running", "units": []}},
            "master": {"host": "node-1", "found": True, "state": "moved", "moved_to": "node-2", "job_age_s": 1.0}}
    fields = run_status.from_view(view)
    assert (fields["state"], fields["attempt"], fields["restarting"]) == ("running", 2, True)
    assert fields["note"] == "read from every node: node-1 was the master until the run moved to node-2"
    assert attempts.running_words(fields) == "attempt 2 of 3, restarting"


def test_a_status_without_restarts_shows_no_attempt():
    fields = run_status.from_view({"nodes": {"node-1": {"job_state": {"state": "running"}, "state": "running"}}})
    assert (fields["attempt"], fields["max_attempts"], fields["attempts"]) == (1, 1, [])
    assert attempts.running_words(fields) is None


# --- the CLI's words -------------------------------------------------------------------------------


def test_the_run_table_says_in_which_attempt_the_run_succeeded_and_why_each_attempt_ended(tmp_path, capsys):
    crashed_then_resumed(tmp_path)
    rows = [attempt(1, "failed", CRASH), attempt(2, "succeeded")]
    (tmp_path / run_vocab.JOB).write_text(json.dumps(job("succeeded", rows)))
    report.write_summary(report.summarize("r1", spec(), [final(r, 0) for r in range(3)], tmp_path), tmp_path)
    run = RunResult.load(tmp_path)
    assert (run.attempt, run.max_attempts, len(run.attempts)) == (2, 3, 2)
    cli._print_run(run)
    out = capsys.readouterr().out
    assert "run r1 succeeded in attempt 2 of 3 (attempt 1: rank 1 on node-2 exited with code 137)" in out
    assert "attempt 2 on node-1, node-2, node-3 (world size 3, resumed from step 10): succeeded" in out


# --- following a run whose master was lost or moved (follow.yml) -------------------------------------


def test_the_follow_order_is_node_order_without_the_master():
    s = dict(spec(4), ranks=[{"rank": 0, "host": "b", "node_rank": 0}, {"rank": 1, "host": "d", "node_rank": 2},
                             {"rank": 2, "host": "c", "node_rank": 1}, {"rank": 3, "host": "c", "node_rank": 1}],
             master_host="b")
    assert attempts.follow_order(s) == ["c", "d"]


PLAY = """
- hosts: torchfleet_nodes
  gather_facts: false
  vars:
    launch__up: true
    launch_progress_interval: 1
    launch__spec_result:
      spec:
        run_id: r1
        master_host: node-1
        ranks: [{rank: 0, host: node-1, node_rank: 0}, {rank: 1, host: node-2, node_rank: 1},
                {rank: 2, host: node-3, node_rank: 2}]
        guard: {max_restarts: RESTARTS, node_timeout: 1, rejoin_timeout: 0.5, stop_wait: 1, start_timeout: 5}
  tasks:
    - name: Follow the run as a launch does
      ansible.builtin.include_role: {name: launch, tasks_from: follow, rolespec_validate: false}
    - name: Keep what the run's end reads
      ansible.builtin.copy:
        content: "{{ hostvars['node-1'].launch__wait | to_json }}"
        dest: FOLLOWED
        mode: "0644"
      delegate_to: node-2
      run_once: true
"""


def follow(tmp_path, restarts, master_answers=True):
    """follow.yml on three local hosts, each with a node folder of its own: the master's job.json
    says the run moved to node-3, node-2 never holds one, node-3's says the run succeeded."""
    for n in (1, 2, 3):
        (tmp_path / f"n{n}" / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "n1/runs/r1" / run_vocab.JOB).write_text(json.dumps(
        {"run_id": "r1", "state": "moved", "moved_to": "node-3", "units": [],
         "abort": {"kind": "moved", "host": "node-1", "reason": "replaced by node-3"}}))
    (tmp_path / "n3/runs/r1" / run_vocab.JOB).write_text(json.dumps(
        job("succeeded", [attempt(1, "failed", CRASH), attempt(2, "succeeded")], master="node-3")))
    lost = " ansible_connection=ssh ansible_host=127.0.0.1 ansible_port=1" if not master_answers else ""
    (tmp_path / "inventory.ini").write_text(textwrap.dedent(f"""\
        [torchfleet_nodes]
        node-1 launch_node_dir={tmp_path}/n1{lost}
        node-2 launch_node_dir={tmp_path}/n2
        node-3 launch_node_dir={tmp_path}/n3
        [torchfleet_nodes:vars]
        ansible_connection=local
        ansible_python_interpreter={sys.executable}
        """))
    (tmp_path / "play.yml").write_text(PLAY.replace("RESTARTS", str(restarts))
                                       .replace("FOLLOWED", str(tmp_path / "followed.json")))
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "inventory.ini"),
                           str(tmp_path / "play.yml")], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads((tmp_path / "followed.json").read_text())


@pytest.mark.parametrize("master_answers", [True, False], ids=["master-moved", "master-lost"])
def test_a_follow_moves_past_a_node_without_the_record_to_the_node_that_took_the_run_over(tmp_path, master_answers):
    followed = follow(tmp_path, restarts=2, master_answers=master_answers)
    assert (followed["outcome"], followed["state"]) == ("finished", "succeeded")
    assert followed["job"]["master"] == "node-3" and followed["job"]["attempt"] == 2


def test_without_restarts_the_follow_ends_at_the_master(tmp_path):
    followed = follow(tmp_path, restarts=0, master_answers=False)
    assert followed["outcome"] == "master_lost" and followed["abort"]["kind"] == "node_lost"
