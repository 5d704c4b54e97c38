"""The fault matrix on the two docker hosts it shares with the API and CLI tests
(tests/conftest.py), and how to break them."""

import json
import signal
import subprocess
import time

import pytest

import torchfleet
from harness import ROOT
from harness.cluster import NAME, ClusterCli, finish, mark_folder, ssh_args

WORKLOAD = ROOT / "tests" / "fixtures" / "workloads" / "faults" / "faults.py"
# Short enough to keep the matrix quick, long enough for two cores shared with the nodes.
NODE_TIMEOUT = 4
TIMING = ["-e", f"launch_node_timeout={NODE_TIMEOUT}", "-e", "launch_stop_grace=3", "-e", "launch_poll_interval=1"]


# The controller's side of this cluster: its SSH settings (see ssh_args), for the API and the CLI.
CONTROLLER_ENV = {"ANSIBLE_SSH_ARGS": ssh_args(NODE_TIMEOUT)}


def pytest_collection_modifyitems(items):
    mark_folder(items, __file__, pytest.mark.faults)


@pytest.fixture(scope="session")
def faults_cluster(provisioned, inventory_dir, tmp_path_factory):
    """The shared cluster, through a Cluster of the matrix's own: its SSH settings, and a runs
    folder apart from the API and CLI tests' runs."""
    shared = provisioned[0]
    runs_dir = tmp_path_factory.mktemp("faults-runs")
    cluster = torchfleet.Cluster(shared.inventory, extra_vars=shared.extra_vars, project_dir=shared.project_dir,
                                 runs_dir=runs_dir, progress=False,
                                 env={**shared.env, **CONTROLLER_ENV})
    yield Faults(cluster, inventory_dir, runs_dir)
    for node in ("node-1", "node-2"):
        subprocess.run(["docker", "unpause", f"{NAME}-{node}"], capture_output=True)


class Faults(ClusterCli):
    """The cluster, the CLI against it, and the faults a test can inject."""

    def __init__(self, cluster, inventory_dir, runs_dir):
        super().__init__(NAME, inventory_dir, runs_dir, TIMING, NODE_TIMEOUT)
        self.cluster = cluster

    def launch(self, run_id, *more, seconds=300, workload_args=()):
        """An attached launch of the fault workload, in the background."""
        command = self.args("launch", "--workload", str(WORKLOAD), "--job", "faults", "--run-id", run_id, "--json",
                            *more, "--", "--seconds", str(seconds), *workload_args)
        # Ctrl-C as in a terminal: a suite started in the background (nohup ... &) passes
        # SIGINT on ignored, and the CLI rightly leaves an ignored signal ignored.
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def wait_running(self, run_id, count=2, timeout=180, launch=None):
        """Until every rank has printed its first step: the job is past its collective."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if launch is not None:
                self.still_launching(run_id, launch)
            steps = sum(self.node(n, f"grep -l 'step at' /var/lib/torchfleet/runs/{run_id}/rank-*.log "
                                     "2>/dev/null | wc -l", check=False).strip() not in ("", "0")
                        for n in ("node-1", "node-2"))
            if steps == count:
                return time.time()
            time.sleep(1)
        raise AssertionError(f"run {run_id} never got going")

    def cut(self, node, connect=False):
        action = "connect" if connect else "disconnect"
        subprocess.run(["docker", "network", action, NAME, f"{NAME}-{node}"], check=True, capture_output=True)

    def guards(self, run_id):
        return {json.loads(p.read_text())["name"]: json.loads(p.read_text())
                for p in (self.runs_dir / run_id).glob("guard-*.json")}


def ended_at(guard):
    from datetime import datetime

    return datetime.fromisoformat(guard["ended_at"].replace("Z", "+00:00")).timestamp()


__all__ = ["Faults", "NODE_TIMEOUT", "ended_at", "finish", "signal"]
