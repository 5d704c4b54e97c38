"""Runs that recover (launch_max_restarts, docs/recovery.md), on three docker hosts of their
own: a run that loses one node must still have two to go on with, and the API/CLI tests and
the fault matrix share only two (tests/conftest.py). Besides the cluster: the CLI against it,
the faults a test injects, and what the ranks themselves logged, read on the nodes."""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness import ROOT
from harness.cluster import ENV, ClusterCli, local_cluster, local_cluster_down, mark_folder
from harness.cluster import finish as harness_finish

# Apart from every molecule scenario's and the shared pytest cluster's, as molecule/README.md
# names and addresses them, so that this stage can run in a lane beside the others.
NAME = f"{os.environ.get('TORCHFLEET_TEST_PREFIX', 'molecule')}-recovery"
SUBNET = f"{os.environ.get('TORCHFLEET_TEST_SUBNET_BASE', '172.29')}.16.0/24"
NODES = ("node-1", "node-2", "node-3")
RUNS = "/var/lib/torchfleet/runs"
WORKLOAD = ROOT / "files" / "workloads" / "mnist.py"
NODE_TIMEOUT = 4
# As the fault matrix's, plus a short wait between attempts and for a lost node to come back.
TIMING = ["-e", f"launch_node_timeout={NODE_TIMEOUT}", "-e", "launch_stop_grace=3", "-e", "launch_poll_interval=1",
          "-e", "launch_restart_backoff=1", "-e", "launch_rejoin_timeout=2"]
# The bundled workload on the local cluster's dataset (1920 samples): 3 ranks take 40 steps
# an epoch, 2 ranks 60; every step is logged, so the logs say exactly where each attempt was.
MNIST = ["--batch-size", "16", "--seed", "42", "--log-interval", "1"]

BANNER = re.compile(r"\[torchfleet guard\] attempt (\d+) of (\d+)")
DISTRIBUTED = re.compile(r"\[rank (\d+)\] Using distributed PyTorch with gloo backend \(rank \d+ of (\d+)")
# Where a rank starts (the step resumed from, 0 without a checkpoint), with the restart count it saw.
RESUMED = re.compile(r"\[rank \d+\] (?:resumed from step (\d+) |starting from step (0): ).*?TORCHFLEET_RESTART_COUNT=(\d+)")
# Each node's first rank saves on its own node.
SAVED = re.compile(r"\[rank \d+\] Saved checkpoint at step (\d+)")
CRASHED = re.compile(r"\[rank (\d+)\] crashing at step (\d+)")
TRAINED = re.compile(r"^(\S+Z) .*\[rank (\d+)\] Train Epoch: (\d+) \[(\d+)/(\d+) ")


def pytest_collection_modifyitems(items):
    mark_folder(items, __file__, pytest.mark.recovery)


@pytest.fixture(scope="session")
def recovery():
    """Three docker hosts, provisioned; removed at the end, thawed first if a case failed
    with a node frozen. Their inventory and runs live in the state folder, not in pytest's
    temporary ones, which another pytest session on this machine may prune meanwhile; the
    folder is named after the cluster, so that two prefixes' sessions run side by side."""
    folder = Path(ENV["TORCHFLEET_STATE_DIR"]) / NAME
    shutil.rmtree(folder, ignore_errors=True)
    inventory_dir, runs_dir = folder / "inventory", folder / "runs"
    runs_dir.mkdir(parents=True)
    cluster = local_cluster(NAME, SUBNET, inventory_dir, runs_dir, nodes=len(NODES))
    try:
        cluster.provision()
        yield Recovery(inventory_dir, runs_dir)
    finally:
        for node in NODES:
            subprocess.run(["docker", "unpause", f"{NAME}-{node}"], capture_output=True)
        local_cluster_down(NAME, inventory_dir)


@pytest.fixture(autouse=True)
def fresh_round(request, recovery):
    """bench/load.py runs every case several times in one session (tests/load_rounds.py). A
    round's runs reuse the last round's ids, which the nodes and the runs folder refuse (and
    whose checkpoints a run would resume from): each round after the first starts without them
    on the nodes. The controller's copies (summaries, collected logs) move to rounds/K/ beside
    the runs folder, so that a round that failed can still be read after the next one."""
    callspec = getattr(request.node, "callspec", None)
    number = callspec.params.get("load_round", 1) if callspec else 1
    if number > 1 and number not in recovery.rounds:
        recovery.rounds.add(number)
        for node in NODES:
            # The exited containers too: a launch saves their logs into their run's folder.
            recovery.node(node, f"docker ps -aq --filter label=torchfleet.run | xargs -r docker rm -f; rm -rf {RUNS}/*")
        kept = recovery.runs_dir.parent / "rounds" / str(number - 1)
        kept.mkdir(parents=True, exist_ok=True)
        for folder in recovery.runs_dir.iterdir():
            shutil.move(folder, kept / folder.name)


class Recovery(ClusterCli):
    """The CLI against the three hosts, the faults a test can inject, and the nodes' own files."""

    def __init__(self, inventory_dir, runs_dir):
        super().__init__(NAME, inventory_dir, runs_dir, TIMING, NODE_TIMEOUT)
        self.rounds = set()  # the rounds that fresh_round has cleared for

    def launch(self, run_id, restarts, workload_args, *more):
        """An attached launch of the bundled workload with ``restarts`` restarts, in the background."""
        command = self.args("launch", "--workload", str(WORKLOAD), "--job", "recovery", "--run-id", run_id, "--json",
                            "-e", f"launch_max_restarts={restarts}", *more, "--", *MNIST, *workload_args)
        # Ctrl-C as in a terminal (tests/faults/conftest.py says why); a session of its own, so
        # that killing the controller takes its playbook runs with it.
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), start_new_session=True)

    def assert_nothing_left(self, nodes=NODES):
        for node in nodes:
            assert self.ranks(node) == [], f"{node} kept rank containers"

    def wait_saved(self, run_id, launch, node="node-1", timeout=240):
        """Until ``node``'s rank 0 has logged a saved checkpoint: the time, and its step."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.still_launching(run_id, launch)
            found = SAVED.findall(self.node(node, f"cat {RUNS}/{run_id}/rank-0.log 2>/dev/null", check=False))
            if found:
                return time.time(), int(found[-1])
            time.sleep(0.5)
        raise AssertionError(f"run {run_id}: rank 0 never saved a checkpoint")

    def wait_trained(self, run_id, launch, nodes=NODES, timeout=240):
        """Until every node's rank has logged a training step: the job is past its rendezvous."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.still_launching(run_id, launch)
            if all(self.node(node, f"grep -l 'Train Epoch' {RUNS}/{run_id}/rank-*.log 2>/dev/null", check=False)
                   for node in nodes):
                return
            time.sleep(0.5)
        raise AssertionError(f"run {run_id} never got going")

    def node_json(self, node, run_id, name):
        """A JSON record in the run's folder on ``node``; None where there is none."""
        text = self.node(node, f"cat {RUNS}/{run_id}/{name} 2>/dev/null", check=False)
        return json.loads(text) if text.strip() else None

    def ran(self, run_id, nodes=NODES):
        """What each rank logged in each attempt, read from the unit logs on the nodes: one row
        per (node, log, attempt) with the rank, the world size, the step resumed from and the
        restart count the rank saw, the checkpoints saved, the crash and the steps trained."""
        rows = []
        for node in nodes:
            listing = self.node(node, f"cd {RUNS}/{run_id} 2>/dev/null && for f in rank-*.log; do case $f in "
                                      "*.attempt-*) continue;; esac; printf '==> %s\\n' \"$f\"; cat \"$f\"; done",
                                check=False)
            for name, text in re.findall(r"^==> (\S+)\n(.*?)(?=^==> |\Z)", listing, re.S | re.M):
                rows += [dict(row, node=node, log=name) for row in attempts_of(text)]
        return rows


def attempts_of(log):
    """A unit log cut at the guard's attempt banners (attempt 1 has none), each part read for
    what the rank said of itself."""
    parts, attempt, current = [], 1, []
    for line in log.splitlines():
        banner = BANNER.search(line)
        if banner:
            parts.append((attempt, current))
            attempt, current = int(banner[1]), []
        else:
            current.append(line)
    parts.append((attempt, current))
    rows = []
    for number, lines in parts:
        text = "\n".join(lines)
        if not text.strip():
            continue
        row = {"attempt": number, "text": text, "rank": None, "world_size": None, "resumed": None,
               "restart_count": None, "saved": [int(s) for s in SAVED.findall(text)],
               "crashed": [int(step) for _, step in CRASHED.findall(text)], "trained": []}
        if (found := DISTRIBUTED.search(text)):
            row["rank"], row["world_size"] = int(found[1]), int(found[2])
        if (found := RESUMED.search(text)):
            row["resumed"], row["restart_count"] = int(found[1] or found[2]), int(found[3])
        for stamp, _, epoch, batch, per_epoch in (m.groups() for line in lines if (m := TRAINED.search(line))):
            row["trained"].append((stamp, (int(epoch) - 1) * int(per_epoch) + int(batch) + 1))
        rows.append(row)
    return rows


def finish(process):
    """harness.finish, with the longer wait that a run of several attempts takes."""
    return harness_finish(process, timeout=420)
