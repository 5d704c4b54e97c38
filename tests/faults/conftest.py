"""The fault matrix on the two docker hosts it shares with the API and CLI tests
(tests/conftest.py), and how to break them."""

import configparser
import json
import os
import re
import signal
import subprocess
import time

import pytest

import torchfleet
from harness import ENV, NAME, ROOT, TORCHFLEET, mark_folder, node_sh

WORKLOAD = ROOT / "tests" / "fixtures" / "workloads" / "faults" / "faults.py"
# Short enough to keep the matrix quick, long enough for two cores shared with the nodes.
NODE_TIMEOUT = 4
TIMING = ["-e", f"launch_node_timeout={NODE_TIMEOUT}", "-e", "launch_stop_grace=3", "-e", "launch_poll_interval=1"]


def ssh_args(seconds: int) -> str:
    """ansible.cfg's ssh_args with the controller's SSH giving up on a silent node after about
    ``seconds`` (keepalives, and connecting), as the guards do after NODE_TIMEOUT: the
    defaults (15 s and 10 s) would only add waiting to every lost-node case."""
    config = configparser.ConfigParser()
    config.read(ROOT / "ansible.cfg")
    args = config["ssh_connection"]["ssh_args"]
    for option, value in (("ServerAliveInterval", 1), ("ServerAliveCountMax", seconds), ("ConnectTimeout", seconds)):
        args, found = re.subn(rf"{option}=\d+", f"{option}={value}", args)
        assert found == 1, f"ansible.cfg's ssh_args has no {option}"
    return args


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


class Faults:
    """The cluster, the CLI against it, and the faults a test can inject."""

    def __init__(self, cluster, inventory_dir, runs_dir):
        self.cluster, self.inventory_dir, self.runs_dir = cluster, inventory_dir, runs_dir
        self.env = dict(os.environ, **ENV, **CONTROLLER_ENV, TORCHFLEET_RUNS_DIR=str(runs_dir))

    def args(self, *more):
        return [TORCHFLEET, *more[:1], "-q", "-i", str(self.inventory_dir), *TIMING, *more[1:]]

    def cli(self, *args, timeout=600):
        """Run the CLI to its end: (exit code, JSON document)."""
        done = subprocess.run(self.args(args[0], "--json", *args[1:]), capture_output=True, text=True, env=self.env,
                              timeout=timeout)
        try:
            return done.returncode, json.loads(done.stdout)
        except ValueError:
            raise AssertionError(f"no JSON from {args}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}")

    def launch(self, run_id, *more, seconds=300, workload_args=()):
        """An attached launch of the fault workload, in the background."""
        command = self.args("launch", "--workload", str(WORKLOAD), "--job", "faults", "--run-id", run_id, "--json",
                            *more, "--", "--seconds", str(seconds), *workload_args)
        # Ctrl-C as in a terminal: a suite started in the background (nohup ... &) passes
        # SIGINT on ignored, and the CLI rightly leaves an ignored signal ignored.
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def node(self, node, command, check=True):
        return node_sh(NAME, node, command, check).stdout

    def ranks(self, node, running_only=False):
        """The rank containers docker shows on a node (its own engine)."""
        flag = "" if running_only else "-a"
        return self.node(node, f"docker ps {flag} -q --filter label=torchfleet.run").split()

    def wait_running(self, run_id, count=2, timeout=180, launch=None):
        """Until every rank has printed its first step: the job is past its collective."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if launch is not None and launch.poll() is not None:
                out, err = launch.communicate()
                raise AssertionError(f"the launch of {run_id} ended first, exit {launch.returncode}: "
                                     f"{out[-2000:]}\n{err[-2000:]}")
            steps = sum(self.node(n, f"grep -l 'step at' /var/lib/torchfleet/runs/{run_id}/rank-*.log "
                                     "2>/dev/null | wc -l", check=False).strip() not in ("", "0")
                        for n in ("node-1", "node-2"))
            if steps == count:
                return time.time()
            time.sleep(1)
        raise AssertionError(f"run {run_id} never got going")

    def freeze(self, node):
        """The whole node stands still: its rank containers (siblings in cgroup v1, so docker
        pause of the node alone leaves them running) and then the node itself."""
        inner = self.ranks(node, running_only=True)
        for container in inner:
            pause(["docker", "exec", f"{NAME}-{node}", "docker", "pause", container])
        pause(["docker", "pause", f"{NAME}-{node}"])
        return inner

    def thaw(self, node, inner):
        subprocess.run(["docker", "unpause", f"{NAME}-{node}"], check=True, capture_output=True)
        if inner:
            self.node(node, "docker unpause " + " ".join(inner), check=False)

    def cut(self, node, connect=False):
        action = "connect" if connect else "disconnect"
        subprocess.run(["docker", "network", action, NAME, f"{NAME}-{node}"], check=True, capture_output=True)

    def summary(self, run_id):
        return json.loads((self.runs_dir / run_id / "summary.json").read_text())

    def guards(self, run_id):
        return {json.loads(p.read_text())["name"]: json.loads(p.read_text())
                for p in (self.runs_dir / run_id).glob("guard-*.json")}

    def wait_no_running_ranks(self, node, timeout):
        deadline = time.monotonic() + timeout
        while self.ranks(node, running_only=True):
            if time.monotonic() > deadline:
                raise AssertionError(f"{node} still runs rank containers after {timeout}s")
            time.sleep(1)


def pause(command):
    """docker pause, tried again: the cgroup freezer can fail on a busy machine ("unable to
    freeze") and leave the container running, as bench/scale.py also found."""
    for _ in range(10):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0:
            return
        time.sleep(1)
    raise AssertionError(f"{' '.join(command)} kept failing: {done.stderr.strip()}")


def ended_at(guard):
    from datetime import datetime

    return datetime.fromisoformat(guard["ended_at"].replace("Z", "+00:00")).timestamp()


def finish(process, timeout=300):
    out, err = process.communicate(timeout=timeout)
    try:
        return process.returncode, json.loads(out)
    except ValueError:
        raise AssertionError(f"exit {process.returncode}, no JSON: {out[-2000:]}\n{err[-3000:]}")


__all__ = ["Faults", "NODE_TIMEOUT", "ended_at", "finish", "signal"]
