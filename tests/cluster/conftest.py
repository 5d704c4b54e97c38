"""A two-node local docker-host cluster of its own, shared by the API and CLI tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ENV, local_cluster, local_cluster_down, mark_folder
from harness import node_sh as _node_sh

NAME = "pytest-api"
SUBNET = "172.29.6.0/24"
TORCHFLEET = str(Path(sys.executable).parent / "torchfleet")
__all__ = ["ENV", "NAME", "SUBNET", "TORCHFLEET", "cli", "node_sh"]

CRASHING_WORKLOAD = """
import sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} joined", flush=True)
if dist.get_rank() == 1:
    time.sleep(1)
    print("rank 1: simulated crash", flush=True)
    sys.exit(3)
time.sleep(300)
"""


def pytest_collection_modifyitems(items):
    mark_folder(items, __file__, pytest.mark.cluster)


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def inventory_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("inventory")


@pytest.fixture(scope="session")
def cluster(inventory_dir, runs_dir):
    """Two docker hosts, created through the API; removed at the end."""
    yield local_cluster(NAME, SUBNET, inventory_dir, runs_dir)
    local_cluster_down(NAME, inventory_dir)


@pytest.fixture(scope="session")
def provisioned(cluster, inventory_dir, runs_dir):
    """site.yml twice: through the API, then through `torchfleet up --json` (exit code and
    document), which must change nothing."""
    first = cluster.provision()
    return cluster, first, cli("up", "-i", str(inventory_dir), "--json", inventory_dir=inventory_dir, runs_dir=runs_dir)


@pytest.fixture(scope="session")
def crashing_workload(tmp_path_factory):
    path = tmp_path_factory.mktemp("workload") / "crash.py"
    path.write_text(CRASHING_WORKLOAD)
    return path


def cli(*args, inventory_dir, runs_dir):
    """The torchfleet command to its end: (exit code, its --json document)."""
    env = dict(os.environ, **ENV, TORCHFLEET_RUNS_DIR=str(runs_dir))
    done = subprocess.run([TORCHFLEET, *args], capture_output=True, text=True, env=env, timeout=600)
    assert done.stdout.lstrip().startswith("{"), done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout)


def node_sh(node, command):
    """Run a shell command inside one of this cluster's docker hosts."""
    return _node_sh(NAME, node, command).stdout
