"""What the cluster test folders share: one local docker-host cluster (its own name and
subnet, apart from every molecule scenario's, so the suite's lanes can run side by side),
made and removed through the API, and a way into its nodes. Run the API/CLI tests and the
fault matrix in one pytest session (test.sh's `pytest`), not as two at once."""

import configparser
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

import torchfleet
from harness import ROOT

TORCHFLEET = str(Path(sys.executable).parent / "torchfleet")
# The two docker hosts that the API and CLI tests and the fault matrix share (tests/conftest.py);
# every molecule scenario has a subnet of its own.
# Another name and subnet (TORCHFLEET_TEST_CLUSTER, TORCHFLEET_TEST_CLUSTER_SUBNET) let a
# second suite run beside this one.
NAME = os.environ.get("TORCHFLEET_TEST_CLUSTER", "pytest-cluster")
SUBNET = os.environ.get("TORCHFLEET_TEST_CLUSTER_SUBNET", "172.29.6.0/24")
# The nodes' engines start with the training image, from the seed that scripts/test.sh makes
# (loading it is the molecule default and tls scenarios' test); without a seed, they load it.
ENV = {"TORCHFLEET_STATE_DIR": str(ROOT / ".torchfleet"),
       "TORCHFLEET_ENGINE_SEED": f"{os.environ.get('TORCHFLEET_TEST_PREFIX', 'molecule')}-engine-seed"}


def mark_folder(items, conftest: str, marker: pytest.MarkDecorator) -> None:
    """Every test in the folder of ``conftest`` (a conftest's ``__file__``) carries ``marker``."""
    for item in items:
        if Path(item.fspath).parent == Path(conftest).parent:
            item.add_marker(marker)


def local_cluster(name: str, subnet: str, inventory_dir: Path, runs_dir: Path, nodes: int = 2,
                  **kwargs) -> torchfleet.Cluster:
    # The nodes load the image from the archive folder they share with this machine.
    cluster, _ = torchfleet.local_up(nodes, name=name, subnet=subnet, inventory_dir=inventory_dir, runs_dir=runs_dir,
                                     env=ENV, extra_vars={"image_archive_on_node": True}, **kwargs)
    return cluster


def local_cluster_down(name: str, inventory_dir: Path, **kwargs) -> None:
    torchfleet.local_down(name=name, inventory_dir=inventory_dir, env=ENV, **kwargs)


def node_sh(cluster: str, node: str, command: str, check: bool = True) -> subprocess.CompletedProcess:
    """A shell command inside one docker host (on the host's own engine)."""
    done = subprocess.run(["docker", "exec", f"{cluster}-{node}", "sh", "-c", command], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise AssertionError(f"{node}: {command}: {done.stderr}")
    return done


def cli(*args, inventory_dir: Path, runs_dir: Path) -> tuple[int, dict]:
    """The torchfleet command to its end: (exit code, its --json document)."""
    env = dict(os.environ, **ENV, TORCHFLEET_RUNS_DIR=str(runs_dir))
    done = subprocess.run([TORCHFLEET, *args], capture_output=True, text=True, env=env, timeout=600)
    assert done.stdout.lstrip().startswith("{"), done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout)


def ssh_args(seconds: int) -> str:
    """ansible.cfg's ssh_args with the controller's SSH giving up on a silent node after about
    ``seconds`` (keepalives, and connecting), as the guards do after their node timeout: the
    defaults (15 s and 10 s) would only add waiting to every lost-node case."""
    config = configparser.ConfigParser()
    config.read(ROOT / "ansible.cfg")
    args = config["ssh_connection"]["ssh_args"]
    for option, value in (("ServerAliveInterval", 1), ("ServerAliveCountMax", seconds), ("ConnectTimeout", seconds)):
        args, found = re.subn(rf"{option}=\d+", f"{option}={value}", args)
        assert found == 1, f"ansible.cfg's ssh_args has no {option}"
    return args


def pause(command):
    """docker pause, tried again: the cgroup freezer can fail on a busy machine ("unable to
    freeze") and leave the container running, as bench/scale.py also found."""
    for _ in range(10):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode == 0:
            return
        time.sleep(1)
    raise AssertionError(f"{' '.join(command)} kept failing: {done.stderr.strip()}")


class ClusterCli:
    """The CLI against a local cluster's inventory with the timings ``timing`` (extra vars),
    its nodes' own engines, and the faults a test injects by hand."""

    def __init__(self, name, inventory_dir, runs_dir, timing, node_timeout):
        self.name, self.inventory_dir, self.runs_dir, self.timing = name, inventory_dir, runs_dir, timing
        self.env = dict(os.environ, **ENV, ANSIBLE_SSH_ARGS=ssh_args(node_timeout), TORCHFLEET_RUNS_DIR=str(runs_dir))

    def args(self, *more):
        return [TORCHFLEET, *more[:1], "-q", "-i", str(self.inventory_dir), *self.timing, *more[1:]]

    def cli(self, *args, timeout=600):
        """The CLI to its end: (exit code, its JSON document)."""
        done = subprocess.run(self.args(args[0], "--json", *args[1:]), capture_output=True, text=True, env=self.env,
                              timeout=timeout)
        try:
            return done.returncode, json.loads(done.stdout)
        except ValueError:
            raise AssertionError(f"no JSON from {args}: {done.stdout[-2000:]}\n{done.stderr[-2000:]}")

    def node(self, node, command, check=True):
        return node_sh(self.name, node, command, check).stdout

    @staticmethod
    def still_launching(run_id, launch):
        """Fails where the attached launch ``launch`` (a Popen) has already ended."""
        if launch.poll() is not None:
            out, err = launch.communicate()
            raise AssertionError(f"the launch of {run_id} ended first, exit {launch.returncode}: "
                                 f"{out[-2000:]}\n{err[-2000:]}")

    def ranks(self, node, running_only=False):
        """The rank containers docker shows on a node (its own engine)."""
        flag = "" if running_only else "-a"
        return self.node(node, f"docker ps {flag} -q --filter label=torchfleet.run").split()

    def wait_no_running_ranks(self, node, timeout):
        """Until ``node`` runs no rank container: a lost node's guard, back, ends its own."""
        deadline = time.monotonic() + timeout
        while self.ranks(node, running_only=True):
            if time.monotonic() > deadline:
                raise AssertionError(f"{node} still runs rank containers after {timeout}s: "
                                     + self.node(node, "docker ps -a --filter label=torchfleet.run", check=False))
            time.sleep(1)

    def freeze(self, node):
        """The whole node stands still: its rank containers (siblings in cgroup v1, so docker
        pause of the node alone leaves them running) and then the node itself."""
        inner = self.ranks(node, running_only=True)
        for container in inner:
            pause(["docker", "exec", f"{self.name}-{node}", "docker", "pause", container])
        pause(["docker", "pause", f"{self.name}-{node}"])
        return inner

    def thaw(self, node, inner):
        """The node, then its rank containers, each until docker says it is no longer paused (a
        failed unpause was once ignored, leaving a rank and its guard frozen for the next case),
        then until the controller reaches the node again."""
        subprocess.run(["docker", "unpause", f"{self.name}-{node}"], check=True, capture_output=True)
        for container in inner:
            for _ in range(10):
                node_sh(self.name, node, f"docker unpause {container}", check=False)
                still = node_sh(self.name, node, f"docker inspect -f '{{{{.State.Paused}}}}' {container}", check=False)
                if still.returncode != 0 or still.stdout.strip() == "false":
                    break  # running again, or removed meanwhile
                time.sleep(1)
            else:
                raise AssertionError(f"{node}: {container} stayed paused after 10 docker unpause")
        self.wait_reachable(node)

    def wait_reachable(self, node, timeout=120):
        """Until the controller's SSH reaches ``node`` again, with the cases' own SSH settings: a
        thawed node wakes every process at once, and on a loaded machine the next case's first
        connection to it gave up after ConnectTimeout (the node timeout), failing that case's
        launch (exit 3, the node unreachable) before any fault. The connection made here stays
        open (ControlPersist) for the next case to reuse."""
        deadline = time.monotonic() + timeout
        while True:
            done = subprocess.run([str(Path(sys.executable).parent / "ansible"), node, "-i", str(self.inventory_dir),
                                   "-m", "ansible.builtin.raw", "-a", "true"], capture_output=True, text=True,
                                  env=self.env, cwd=ROOT)
            if done.returncode == 0 and done.stdout.startswith(f"{node} |"):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{node} not reachable over SSH {timeout}s after its thaw: {done.stdout[-500:]}")
            time.sleep(1)

    def summary(self, run_id):
        return json.loads((self.runs_dir / run_id / "summary.json").read_text())


def finish(process, timeout=300):
    """An attached launch (a Popen with --json) to its end: (exit code, its JSON document)."""
    out, err = process.communicate(timeout=timeout)
    try:
        return process.returncode, json.loads(out)
    except ValueError:
        raise AssertionError(f"exit {process.returncode}, no JSON: {out[-2000:]}\n{err[-3000:]}")
