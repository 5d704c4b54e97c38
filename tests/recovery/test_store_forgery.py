"""The guards' store takes no orders from outside the run (issue 58, docs/security.md): a
container on the cluster network, not one of the run's, writes a forged abort and a forged
attempt plan into a running run's store. The run goes on; a rank's real crash still ends
its attempt, the next one runs on the nodes and at the MASTER_ADDR its own guards decided,
and the run finishes. Every guard's log says what it rejected."""

import json
import re
import subprocess

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab

from .conftest import NAME, NODES, RUNS, finish

# The guards' store: launch_guard_port (the role's default) on the master's cluster address.
GUARD_PORT = 29510
IMAGE = "torchfleet/train:2.13.0-cpu"
ELSEWHERE = "10.66.66.66"
FORGER = """
import json, sys
from datetime import timedelta
from torch.distributed import TCPStore
host, port, abort_key, next_key, elsewhere = sys.argv[1:]
store = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
store.set(abort_key, json.dumps({"kind": "stopped", "host": "node-1", "unit": None, "reason": "forged: stop everything"}))
plan = {"attempt": 2, "nodes": ["node-1"], "master": "node-1", "master_addr": elsewhere, "master_port": 29500,
        "world_size": 1, "num_nodes": 1, "units": {"0": {"ranks": [0], "node_rank": 0}}, "ranks": {"node-1": [0]}}
store.set(next_key, json.dumps({"plan": plan, "attempts": []}))
print("forged", flush=True)
"""


def address(node):
    return subprocess.run(["docker", "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}",
                           f"{NAME}-{node}"], capture_output=True, text=True, check=True).stdout.strip()


def test_a_forged_abort_and_a_forged_plan_from_another_container_are_rejected_and_the_run_finishes(recovery):
    r = recovery
    if any(r.ranks(node, running_only=True) for node in NODES):
        r.cli("down")
    abort_key, next_key = run_vocab.abort_key(1), run_vocab.next_key(1)
    master = address("node-1")
    # The forger waits for the run's store, whose guard comes up before the ranks, and writes
    # at once: well before rank 1 crashes (a step takes some 30 ms), so within attempt 1.
    forger = subprocess.Popen(["docker", "run", "--rm", "--network", NAME, IMAGE, "python3", "-c", FORGER, master,
                               str(GUARD_PORT), abort_key, next_key, ELSEWHERE], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    launch = r.launch("forged", 1, ["--epoch", "1", "--checkpoint-every", "10", "--crash-rank", "1",
                                    "--crash-at-step", "30"])
    out, err = forger.communicate(timeout=180)
    assert out.strip() == "forged", err[-2000:]

    code, out = finish(launch)
    assert code == 0, out
    attempts = r.summary("forged")["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    cause = attempts[0]["cause"]
    assert cause["kind"] == "rank_failed" and cause["host"] == "node-2" and "code 137" in cause["reason"], cause
    assert attempts[1]["nodes"] == list(NODES) and attempts[1]["master"] == "node-1"
    logs = {node: r.node(node, f"cat {RUNS}/forged/rank-*.log") for node in NODES}
    for node, log in logs.items():
        banner = re.search(r"\[torchfleet guard\] attempt 2 of 2: .*\(MASTER_ADDR=([\d.]+),", log)
        assert banner and banner[1] == master, (node, banner)
        assert ELSEWHERE not in log
        # Every guard waited on the forged abort in attempt 1, and the workers' guards read the
        # forged plan once it ended.
        rejected = re.search(rf"rejected {re.escape(abort_key)} from the store: no valid MAC", log)
        assert rejected and rejected.start() < banner.start(), node
        if node != "node-1":
            assert re.search(rf"rejected {re.escape(next_key)} from the store: no valid MAC", log), node
    job = r.node_json("node-1", "forged", "job.json")
    assert job["state"] == "succeeded" and "stop everything" not in json.dumps(job) and ELSEWHERE not in json.dumps(job)
    r.assert_nothing_left()
