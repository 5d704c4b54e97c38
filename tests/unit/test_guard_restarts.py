"""Restarts run by the guards themselves (launch_max_restarts), with real guards and a real
store: three "nodes" on three loopback addresses (127.0.0.1-3), one rank unit each, every
node with a run folder of its own. The units are a small script that prints what it was
given; the faults are a crash, and a node whose guard and unit stand still (SIGSTOP)."""

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.guards import guard_folder
from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_policy, run_vocab

pytest.importorskip("torch.distributed")

UNIT = r"""
import json, os, sys, time
env = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "TORCHFLEET_RESTART_COUNT")}
print("saw " + " ".join(f"{k}={v}" for k, v in env.items()), flush=True)
print(f"started by {os.getppid()} with {len(os.listdir(f'/proc/{os.getppid()}/task'))} threads", flush=True)
attempt = int(os.environ.get("TORCHFLEET_RESTART_COUNT") or 0) + 1
crash_rank, crash_on, seconds, crash_after = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
marks = sys.argv[5]
crashing = int(os.environ["RANK"]) == crash_rank and (crash_on == attempt or crash_on == -1)
def ended(r):
    try:
        with open(os.path.join(marks, f"n{r}", "run", f"guard-{r}.json")) as fh:
            return json.load(fh).get("child_exit_code") == 0
    except (OSError, ValueError):
        return False
if crashing and crash_after < 0:
    # Once every other rank's guard has seen its rank exit 0, however late a loaded machine
    # started it.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not all(ended(r) for r in range(int(os.environ["WORLD_SIZE"]))
                                                  if r != crash_rank):
        time.sleep(0.05)
else:
    time.sleep(crash_after if crashing else 0.5)
if crashing:
    print("crashing now", flush=True)
    os._exit(3)
end = time.monotonic() + seconds
while time.monotonic() < end:
    print("step", flush=True)
    time.sleep(0.2)
"""

NODES = ["node-1", "node-2", "node-3"]


# A loss is told after this many seconds; where a crash is the fault, the guards get longer,
# so that two busy cores (the suite runs lanes side by side) do not pass for a lost node: 6 s
# did not once, while molecule loaded images beside it. A crash's case never waits for it.
LOSS_TIMEOUT, CRASH_NODE_TIMEOUT = 2.0, 20.0


def config(port, run_dirs, max_restarts, min_nodes=0, node_timeout=LOSS_TIMEOUT):
    units = [{"name": f"rank{i}", "host": host, "role": "rank", "ranks": [i], "service": False,
              "heartbeat": None, "log": str(run_dirs[i] / run_vocab.rank_log(i)),
              "attempt": {"env": {"RANK": "rank", "WORLD_SIZE": "world_size", "MASTER_ADDR": "master_addr",
                                  "MASTER_PORT": "master_port", "NODE_RANK": "node_rank"}}}
             for i, host in enumerate(NODES)]
    nodes = [{"host": host, "address": f"127.0.0.{i + 1}"} for i, host in enumerate(NODES)]
    return {"run_id": "restarts", "job": "t", "store_unit": 0,
            "store": {"host": "127.0.0.1", "port": port, "node": "node-1"},
            "node_timeout": node_timeout, "stall_timeout": 0, "job_timeout": 0, "poll_interval": 0.2, "stop_grace": 1.0,
            "start_timeout": 10.0, "stop_wait": 8.0, "peer_error": None, "units": units,
            "max_restarts": max_restarts, "min_nodes": min_nodes or len(NODES), "restart_backoff": 0.5,
            "rejoin_timeout": 1.0, "checkpoint_shared": False,
            "nodes": nodes, "master_port": 29500,
            "store_candidates": [{"node": n["host"], "host": n["address"], "port": port, "unit": i}
                                 for i, n in enumerate(nodes)]}


class Cluster:
    """Three guards, each in its node's own run folder, started together."""

    def __init__(self, tmp_path, max_restarts, min_nodes=0, crash=(-9, 0), seconds=4.0, wrapped=False,
                 crash_after=0.5, node_timeout=LOSS_TIMEOUT):
        self.dirs = []
        port = None
        self.key = secrets.token_hex(32)  # the run's, on every node
        for i in range(len(NODES)):
            (tmp_path / f"n{i}").mkdir()
            folder, free = guard_folder(tmp_path / f"n{i}", self.key)
            port = port or free
            self.dirs.append(folder)
        script = tmp_path / "unit.py"
        script.write_text(UNIT)
        cfg = config(port, self.dirs, max_restarts, min_nodes, node_timeout)
        self.procs = []
        for i, folder in enumerate(self.dirs):
            (folder / run_vocab.GUARD_CONFIG).write_text(json.dumps(cfg))
            # Wrapped in a shell, the unit is started (Popen) instead of forked from its guard.
            wrapper = ["sh", "-c", 'exec "$0" "$@"'] if wrapped else []
            argv = [sys.executable, str(folder / run_vocab.GUARD_SOURCE), str(folder / run_vocab.GUARD_CONFIG), str(i),
                    "--", *wrapper, sys.executable, str(script), str(crash[0]), str(crash[1]), str(seconds), str(crash_after),
                    str(tmp_path)]
            # As the launch starts a unit: the first attempt's numbers in its environment.
            env = dict(os.environ, RANK=str(i), WORLD_SIZE=str(len(NODES)), MASTER_ADDR="127.0.0.1",
                       TORCHFLEET_RESTART_COUNT="0")
            self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                               start_new_session=True, env=env))

    def wait(self, timeout=90, skip=()):
        deadline = time.monotonic() + timeout
        for i, proc in enumerate(self.procs):
            if i in skip:
                continue
            proc.wait(max(1, deadline - time.monotonic()))
        return [p.returncode for p in self.procs]

    def job(self, i):
        return json.loads((self.dirs[i] / run_vocab.JOB).read_text())

    def record(self, i):
        return json.loads((self.dirs[i] / run_vocab.guard_record(i)).read_text())

    def log(self, i):
        path = self.dirs[i] / run_vocab.rank_log(i)
        return path.read_text() if path.exists() else ""

    def freeze(self, i):
        os.killpg(self.procs[i].pid, signal.SIGSTOP)

    def thaw(self, i):
        os.killpg(self.procs[i].pid, signal.SIGCONT)

    def kill(self):
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGCONT)
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def cluster(tmp_path):
    made = []

    def make(*args, **kwargs):
        made.append(Cluster(tmp_path, *args, **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.kill()


def wait_for(predicate, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("timed out")


@pytest.mark.parametrize("wrapped", [False, True], ids=["forked", "started"])
def test_a_crash_restarts_every_rank_on_the_same_nodes(cluster, wrapped):
    c = cluster(1, crash=(1, 1), seconds=1.5, wrapped=wrapped, node_timeout=CRASH_NODE_TIMEOUT)
    assert c.wait() == [0, 0, 0], [p.stderr.read()[-2000:] for p in c.procs]
    job = c.job(0)
    assert job["state"] == "succeeded" and job["attempt"] == 2 and job["max_attempts"] == 2
    first, second = job["attempts"]
    assert first["cause"]["kind"] == "rank_failed" and "rank 1 on node-2 exited with code 3" in first["cause"]["reason"]
    assert second["state"] == "succeeded" and second["nodes"] == NODES and second["world_size"] == 3
    # What each rank saw in the second attempt, from its own log.
    for i in range(3):
        log = c.log(i)
        assert f"saw RANK={i} WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 TORCHFLEET_RESTART_COUNT=1" in log
        assert run_vocab.ATTEMPT_BANNER + "2 of 2" in log
        attempt_log = c.dirs[i] / run_vocab.attempt_log(run_vocab.rank_log(i), 2)
        assert "TORCHFLEET_RESTART_COUNT=1" in attempt_log.read_text() and "crashing" not in attempt_log.read_text()
    assert "crashing now" in c.log(1)
    assert [a["exit_code"] for a in c.record(1)["attempts"]] == [3]
    assert c.record(1)["state"] == "exited" and c.record(1)["exit_code"] == 0
    # The first attempt's unit came from its guard, before the guard's threads; the second's
    # from a process that has none of them (its fork server), not from the guard, which has.
    alone = int(subprocess.run([sys.executable, "-c", "import os\nfrom torch.distributed import TCPStore\n"
                                "print(len(os.listdir('/proc/self/task')))"], capture_output=True, text=True).stdout)
    for i in range(3):
        first, second = re.findall(r"started by (\d+) with (\d+) threads", c.log(i))
        assert int(first[0]) == c.procs[i].pid
        assert int(second[0]) != c.procs[i].pid and int(second[1]) <= alone


def test_a_rank_that_finished_runs_again_when_another_fails_in_its_attempt(cluster):
    # Ranks 0 and 2 end cleanly, then rank 1 crashes: their guards wait for the attempt's
    # outcome, as torchelastic's exit barrier does, and every node takes part in the next.
    c = cluster(1, crash=(1, 1), seconds=0.2, crash_after=-1, node_timeout=CRASH_NODE_TIMEOUT)
    assert c.wait() == [0, 0, 0], [p.stderr.read()[-2000:] for p in c.procs]
    job = c.job(0)
    assert job["state"] == "succeeded", job
    first, second = job["attempts"]
    assert "rank 1 on node-2 exited with code 3" in first["cause"]["reason"]
    assert second["nodes"] == NODES and second["world_size"] == 3
    for i in (0, 2):
        log = c.log(i)
        assert log.count("step") >= 2 and "TORCHFLEET_RESTART_COUNT=1" in log
        assert [a["exit_code"] for a in c.record(i)["attempts"]] == [0]


def test_a_crash_loop_ends_before_the_restarts_run_out(cluster):
    c = cluster(5, crash=(2, -1), seconds=1.0, node_timeout=CRASH_NODE_TIMEOUT)
    codes = c.wait()
    job = c.job(0)
    assert job["state"] == "failed" and len(job["attempts"]) == 2, job["attempts"]
    assert job["abort"]["final"].startswith("crash loop: rank 2 on node-3 exited with code 3 in attempts 1 and 2")
    assert codes[2] == 3


def test_restarts_that_run_out_end_the_run_with_the_last_failure(cluster):
    # Different failures each time are no crash loop: rank 1 crashes, then rank 1 again but
    # the first attempt lasts longer than the window? No: use max_restarts 1 and a crash in both.
    c = cluster(1, crash=(0, -1), seconds=1.0, node_timeout=CRASH_NODE_TIMEOUT)
    c.wait()
    job = c.job(0)
    assert job["state"] == "failed" and [a["attempt"] for a in job["attempts"]] == [1, 2]
    assert job["abort"]["final"] == "no restarts left (1 of 1 used)"
    assert all(a["cause"]["kind"] == "rank_failed" for a in job["attempts"])


def test_a_lost_worker_is_left_out_and_the_ranks_are_renumbered(cluster):
    c = cluster(1, min_nodes=2, seconds=8.0)
    wait_for(lambda: all("step" in c.log(i) for i in range(3)))
    c.freeze(1)
    try:
        c.wait(skip={1})
    finally:
        c.thaw(1)
    job = c.job(0)
    assert job["state"] == "succeeded", job
    first, second = job["attempts"]
    assert first["cause"]["kind"] == "node_lost" and first["cause"]["host"] == "node-2"
    assert second["nodes"] == ["node-1", "node-3"] and second["world_size"] == 2
    assert "saw RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 TORCHFLEET_RESTART_COUNT=1" in c.log(2)
    # Back again, the lost node's guard finds the run gone on without it, and ends, saying that
    # its node stood still (its container is then run_reap's to remove).
    c.procs[1].wait(30)
    assert c.record(1)["state"] == "left_out", c.procs[1].stderr.read()[-3000:]
    assert c.record(1)["stood_still"] is True


def test_too_few_nodes_left_ends_the_run(cluster):
    c = cluster(2, min_nodes=3, seconds=8.0)
    wait_for(lambda: all("step" in c.log(i) for i in range(3)))
    c.freeze(2)
    try:
        c.wait(skip={2})
    finally:
        c.thaw(2)
    job = c.job(0)
    assert job["state"] == "failed" and len(job["attempts"]) == 1
    assert job["abort"]["final"] == "only 2 nodes answer (node-1, node-2); launch_min_nodes=3"


def test_a_lost_master_hands_the_run_to_the_next_node(cluster):
    c = cluster(1, min_nodes=2, seconds=8.0)
    wait_for(lambda: all("step" in c.log(i) for i in range(3)))
    c.freeze(0)
    try:
        c.wait(skip={0})
        job = c.job(1)
        assert job["state"] == "succeeded", job
        first, second = job["attempts"]
        assert first["cause"]["kind"] == "node_lost" and first["cause"]["host"] == "node-1"
        assert second["master"] == "node-2" and second["nodes"] == ["node-2", "node-3"]
        assert "saw RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.2 TORCHFLEET_RESTART_COUNT=1" in c.log(1)
        assert "saw RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.2 TORCHFLEET_RESTART_COUNT=1" in c.log(2)
    finally:
        c.thaw(0)
    # The old master, back, finds that the run moved on, and says where.
    c.procs[0].wait(30)
    old = c.job(0)
    assert old["state"] == "moved" and old["moved_to"] == "node-2", old
    assert c.record(0)["stood_still"] is True


def test_the_plan_renumbers_in_node_order_and_keeps_each_units_count_of_ranks():
    cfg = {"nodes": [{"host": h, "address": a} for h, a in (("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3"))],
           "master_port": 29500,
           "units": [{"host": "a", "ranks": [0, 1]}, {"host": "b", "ranks": [2, 3]}, {"host": "b", "ranks": [],
                                                                                    "service": True},
                     {"host": "c", "ranks": [4, 5]}]}
    plan = guard_policy.plan_attempt(cfg, ["c", "b"], 3)
    assert plan["nodes"] == ["b", "c"] and plan["master_addr"] == "10.0.0.2" and plan["world_size"] == 4
    assert plan["units"] == {"1": {"ranks": [0, 1], "node_rank": 0}, "3": {"ranks": [2, 3], "node_rank": 1}}
    agent = {"attempt": {"env": {"NODE_RANK": "node_rank"},
                         "argv": {"--nnodes": "num_nodes", "--node-rank": "node_rank", "--master-addr": "master_addr"}}}
    env, argv = guard_policy.unit_attempt(agent, 3, plan, ["python", "-m", "torch.distributed.run", "--nnodes", "3",
                                                           "--node-rank", "2", "--master-addr", "10.0.0.1", "x.py"])
    assert env == {"NODE_RANK": "1", "TORCHFLEET_RESTART_COUNT": "2", "TORCHELASTIC_RESTART_COUNT": "2"}
    assert argv[3:9] == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.2"] and argv[-1] == "x.py"


@pytest.mark.parametrize("abort, used, hosts, why", [
    ({"kind": "stopped"}, 0, ["a"], "a stop on request is not restarted"),
    ({"kind": "timeout"}, 0, ["a"], "a timeout is not restarted"),
    ({"kind": "rank_failed"}, 2, ["a", "b"], "no restarts left (2 of 2 used)"),
    ({"kind": "node_lost"}, 0, ["a"], "only 1 node answers (a); launch_min_nodes=2"),
    ({"kind": "node_lost"}, 0, ["a", "b"], None),
    # A unit its scheduler let go of (a Slurm step ended) is not the guards' to start again.
    ({"kind": "rank_failed", "final": True, "reason": "its step ended"}, 0, ["a", "b"], "its step ended: not restarted"),
])
def test_when_the_run_ends_instead_of_restarting(abort, used, hosts, why):
    attempts = [{"attempt": k + 1, "cause": {"kind": "node_lost", "reason": f"r{k}"}} for k in range(used)]
    attempts.append({"attempt": used + 1, "cause": abort})
    assert guard_policy.restart_refused(abort, attempts, 2, hosts, 2) == why
