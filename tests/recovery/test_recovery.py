"""Runs that recover (issue 40): a crashed rank, a lost worker, a lost master, a crash loop,
and a crash with no controller attached, each with the bundled workload checkpointing.

Each case asserts the outcome; the attempts the run recorded, with their causes; what the
ranks themselves logged in each attempt (where they resumed, the world size they joined,
the restart count they saw); and that no rank container is left on any node (on a node
that was frozen, then thawed: none left running, as in the fault matrix).
"""

import os
import signal
import subprocess
import time
from datetime import datetime

import pytest

from .conftest import NAME, NODE_TIMEOUT, NODES, RUNS, finish

# Detection, the attempt's end and the next one's start, on two busy cores.
MARGIN = 60
# 3 ranks: 40 steps an epoch (tests/recovery/conftest.py).
CRASHED = ["--epoch", "2", "--checkpoint-every", "10"]
CRASH_STEP = 25
# Long enough that a node is frozen well before the end, at any speed of the shared cores.
LONG = ["--epoch", "8", "--checkpoint-every", "20"]


@pytest.fixture(autouse=True)
def clean_start(recovery):
    """A case that failed may leave ranks behind; the next one starts on clean nodes."""
    if any(recovery.ranks(node, running_only=True) for node in NODES):
        recovery.cli("down")
    yield


# Once a session: bench/load.py's rounds leave this module for the others in every round, and a
# module's fixture made again would launch "reference" once more, an id the nodes refuse.
@pytest.fixture(scope="session")
def reference(recovery):
    """The crash case's run without the crash: same seed, settings and nodes, restarts on."""
    code, out = finish(recovery.launch("reference", 1, CRASHED))
    assert code == 0, out
    ran = recovery.ran("reference")
    # One attempt: restarts on and no fault change nothing.
    assert {row["attempt"] for row in ran} == {1} and len(recovery.summary("reference")["attempts"]) == 1
    return (recovery.runs_dir / "reference" / "checksum-rank-0.txt").read_text()


def newest_saved(rows, nodes=NODES):
    """The newest checkpoint that a rank on ``nodes`` logged as saved in these rows: each
    node's first rank saves on its own node."""
    return max(step for row in rows if row["node"] in nodes for step in row["saved"])


def in_attempt(rows, number):
    return [row for row in rows if row["attempt"] == number]


def seconds(stamp):
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_a_crashed_rank_resumes_from_its_last_checkpoint_and_ends_as_an_uninterrupted_run(recovery, reference):
    r = recovery
    code, out = finish(r.launch("crash", 1, [*CRASHED, "--crash-rank", "1", "--crash-at-step", str(CRASH_STEP)]))
    assert code == 0, out
    attempts = r.summary("crash")["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    cause = attempts[0]["cause"]
    assert cause["kind"] == "rank_failed" and cause["host"] == "node-2", cause
    assert "rank 1" in cause["reason"] and "code 137" in cause["reason"], cause
    assert attempts[1]["cause"] is None and attempts[1]["nodes"] == list(NODES)

    ran = r.ran("crash")
    first, second = in_attempt(ran, 1), in_attempt(ran, 2)
    # Rank 1 on node-2 killed itself, in the first attempt only.
    assert [(row["node"], row["rank"], row["crashed"]) for row in ran if row["crashed"]] == [
        ("node-2", 1, [CRASH_STEP])]
    saved = newest_saved(first)
    assert 0 < saved <= CRASH_STEP
    # Every rank, on the same nodes, resumed from that checkpoint in the second attempt, knowing it was one.
    assert sorted((row["node"], row["rank"], row["world_size"], row["resumed"], row["restart_count"])
                  for row in second) == [(node, rank, 3, saved, 1) for rank, node in enumerate(NODES)]
    assert attempts[1]["resumed_from"] == saved
    # It trained from the step after the checkpoint to the end (80 steps), and none twice.
    trained = [step for _, step in next(row for row in second if row["rank"] == 0)["trained"]]
    assert trained == list(range(saved + 1, 81))
    # Each attempt's lines are also kept apart.
    assert "resumed from step" in r.node("node-2", f"cat {RUNS}/crash/rank-1.attempt-2.log")
    assert (r.runs_dir / "crash" / "checksum-rank-0.txt").read_text() == reference
    r.assert_nothing_left()


def completed_with_one_frozen(r, run_id, node):
    """A long run with one restart and launch_min_nodes=2, ``node`` frozen whole once rank 0
    has saved a checkpoint, and thawed once the launch ends: that it completed in two
    attempts, the first lost with ``node``. The summary's attempts."""
    launch = r.launch(run_id, 1, LONG, "-e", "launch_min_nodes=2")
    r.wait_saved(run_id, launch)
    inner = r.freeze(node)
    try:
        code, out = finish(launch)
    finally:
        r.thaw(node, inner)
    assert code == 0, out
    attempts = r.summary(run_id)["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[0]["cause"]["kind"] == "node_lost" and attempts[0]["cause"]["host"] == node, attempts[0]
    return attempts


def test_a_frozen_worker_is_left_out_and_the_run_completes_on_two_nodes(recovery):
    r = recovery
    attempts = completed_with_one_frozen(r, "worker-lost", "node-3")
    assert attempts[1]["nodes"] == ["node-1", "node-2"] and attempts[1]["world_size"] == 2

    # Back again, node-3's guard finds the run gone on without it, and its rank ends.
    r.wait_no_running_ranks("node-3", NODE_TIMEOUT + MARGIN)
    ran = r.ran("worker-lost")
    first, second = in_attempt(ran, 1), in_attempt(ran, 2)
    assert sorted((row["node"], row["world_size"]) for row in first) == [(node, 3) for node in NODES]
    # Renumbered in node order, in a world of 2, from the newest checkpoint the two had.
    saved = newest_saved(first, ("node-1", "node-2"))
    assert sorted((row["node"], row["rank"], row["world_size"], row["resumed"], row["restart_count"])
                  for row in second) == [("node-1", 0, 2, saved, 1), ("node-2", 1, 2, saved, 1)]
    assert all("world size 3 -> 2" in row["text"] for row in second)
    assert attempts[1]["resumed_from"] == saved
    guards = r.node("node-3", f"cat {RUNS}/worker-lost/guard-*.json", check=False)
    assert '"left_out"' in guards, guards
    r.assert_nothing_left(("node-1", "node-2"))


def test_a_frozen_master_hands_the_run_to_the_next_node(recovery):
    r = recovery
    attempts = completed_with_one_frozen(r, "master-lost", "node-1")
    assert attempts[0]["master"] == "node-1" and attempts[1]["master"] == "node-2"
    assert attempts[1]["nodes"] == ["node-2", "node-3"]

    # The old master, back, finds it was replaced: it ends its rank and says where the run went.
    r.wait_no_running_ranks("node-1", NODE_TIMEOUT + MARGIN)
    assert r.node_json("node-1", "master-lost", "job.json")["moved_to"] == "node-2"
    assert r.node_json("node-2", "master-lost", "job.json")["master"] == "node-2"
    ran = r.ran("master-lost")
    first, second = in_attempt(ran, 1), in_attempt(ran, 2)
    # Rank 0 on node-2 hosted the new rendezvous: rank 1 on node-3 joined it in a world of 2.
    assert sorted((row["node"], row["rank"], row["world_size"], row["restart_count"]) for row in second) == [
        ("node-2", 0, 2, 1), ("node-3", 1, 2, 1)]
    assert all("world size 3 -> 2" in row["text"] for row in second)
    assert all("Joined the process group of 2 ranks" in row["text"] for row in second)
    # Both went on from the newest checkpoint the two had saved themselves, not from the start.
    saved = newest_saved(first, ("node-2", "node-3"))
    assert {row["resumed"] for row in second} == {saved}
    assert attempts[1]["resumed_from"] == saved
    r.assert_nothing_left(("node-2", "node-3"))


def rejoined(r, run_id, node, fault):
    """A run with two restarts whose ``node`` is taken away by ``fault()`` once a checkpoint is
    saved, for as long as the others take to give it up (and to move the store), then given
    back: that it rejoined. The next attempt runs on every node again, in node order, each
    from the same checkpoint, so the resume is the exact one (issue 58)."""
    launch = r.launch(run_id, 2, LONG, "-e", "launch_min_nodes=2", "-e", "launch_rejoin_timeout=60")
    r.wait_saved(run_id, launch)
    undo = fault()
    try:
        # A node timeout to lose it (or its store), as long again to host a store elsewhere.
        time.sleep(5 * NODE_TIMEOUT)
    finally:
        undo()
    code, out = finish(launch)
    assert code == 0, out
    attempts = r.summary(run_id)["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[0]["cause"]["kind"] == "node_lost" and attempts[0]["cause"]["host"] == node, attempts[0]
    assert attempts[1]["nodes"] == list(NODES) and attempts[1]["world_size"] == 3, attempts[1]
    second = in_attempt(r.ran(run_id), 2)
    assert sorted((row["node"], row["rank"], row["world_size"]) for row in second) == [
        (n, rank, 3) for rank, n in enumerate(NODES)]
    assert len({row["resumed"] for row in second}) == 1
    r.assert_nothing_left()


def test_a_master_thawed_within_the_rejoin_timeout_rejoins_as_a_worker(recovery):
    """The master frozen until the others moved the store to node-2, then thawed: it finds the
    run there and rejoins as a worker."""
    r = recovery

    def freeze():
        inner = r.freeze("node-1")
        return lambda: r.thaw("node-1", inner)
    rejoined(r, "master-back", "node-1", freeze)
    # Its own record says where the run went; the run's record is node-2's, the store's host.
    assert r.node_json("node-1", "master-back", "job.json")["moved_to"] == "node-2"
    assert r.node_json("node-2", "master-back", "job.json")["state"] == "succeeded"
    assert "found the run's store on node-2" in r.node("node-1", f"cat {RUNS}/master-back/rank-0.log")


def test_a_worker_cut_off_and_back_within_the_rejoin_timeout_rejoins(recovery):
    """node-3's endpoint on the cluster network removed, as the fault matrix does, long enough
    for its guard to lose the store and host one of its own, then put back (under a new
    interface name): it gives its store up, finds the run's on node-1 and rejoins."""
    r = recovery
    node = f"{NAME}-node-3"
    field = f"{{{{(index .NetworkSettings.Networks \"{NAME}\").IPAddress}}}}"
    address = subprocess.run(["docker", "inspect", "-f", field, node], check=True, capture_output=True,
                             text=True).stdout.strip()

    def cut():
        subprocess.run(["docker", "network", "disconnect", NAME, node], check=True, capture_output=True)
        back = ["docker", "network", "connect", "--ip", address, "--alias", "node-3", NAME, node]
        return lambda: subprocess.run(back, check=True, capture_output=True)
    rejoined(r, "cut-back", "node-3", cut)
    log = r.node("node-3", f"cat {RUNS}/cut-back/rank-2.log")
    assert "found the run's store on node-1" in log, log[-3000:]


def test_a_crash_loop_ends_early_and_names_every_attempt(recovery):
    r = recovery
    code, out = finish(r.launch("crash-loop", 3, [*CRASHED, "--crash-rank", "1", "--crash-at-step", "2",
                                                   "--crash-on-attempt", "-1"]))
    assert code == 1, out
    message = out["error"]["message"]
    attempts = r.summary("crash-loop")["attempts"]
    # Fewer than the four attempts that three restarts allow.
    assert 2 <= len(attempts) < 4, attempts
    assert "crash loop" in message
    for attempt in attempts:
        assert attempt["cause"]["kind"] == "rank_failed" and attempt["cause"]["host"] == "node-2", attempt
        assert f"attempt {attempt['attempt']}" in message, message
    # Rank 1 died at step 2 in every attempt, each from the start (no checkpoint before step 10).
    ran = r.ran("crash-loop")
    crashes = [(row["attempt"], row["restart_count"], row["crashed"]) for row in ran if row["node"] == "node-2"]
    assert crashes == [(k, k - 1, [2]) for k in range(1, len(attempts) + 1)]
    assert {row["resumed"] for row in ran} == {0}
    r.assert_nothing_left()


def test_a_crash_with_the_controller_gone_recovers_and_a_later_attach_sees_it_end(recovery):
    r = recovery
    launch = r.launch("detached", 1, ["--epoch", "10", "--checkpoint-every", "40", "--crash-rank", "1",
                                      "--crash-at-step", "150"])
    r.wait_trained("detached", launch)
    os.killpg(launch.pid, signal.SIGKILL)
    launch.wait()
    killed_at = time.time()
    # Nothing attached: the run's own record on the master says when it is over.
    deadline = time.monotonic() + 300
    while (r.node_json("node-1", "detached", "job.json") or {}).get("state") == "running":
        assert time.monotonic() < deadline, "the run never ended"
        time.sleep(2)
    code, out = r.cli("attach", "detached")
    assert code == 0, out
    attempts = r.summary("detached")["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[0]["cause"]["kind"] == "rank_failed" and attempts[0]["cause"]["host"] == "node-2"
    ran = r.ran("detached")
    first, second = in_attempt(ran, 1), in_attempt(ran, 2)
    (crashed,) = [row for row in first if row["crashed"]]
    # The crash came after the controller was killed: nothing was attached when the run recovered.
    last_step_before = seconds(crashed["trained"][-1][0])
    assert last_step_before > killed_at, (last_step_before, killed_at)
    saved = newest_saved(first)
    assert sorted((row["node"], row["resumed"], row["restart_count"]) for row in second) == [
        (node, saved, 1) for node in NODES]
    assert all(row["trained"][-1][1] == 400 for row in second)
    r.assert_nothing_left()
