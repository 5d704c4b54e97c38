"""A two-node local docker-host cluster of its own, shared by the API and CLI tests."""

import pytest

from harness import ENV, local_cluster, local_cluster_down, mark_folder
from harness import node_sh as _node_sh

NAME = "pytest-api"
SUBNET = "172.29.6.0/24"
__all__ = ["ENV", "NAME", "SUBNET", "node_sh"]

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
def provisioned(cluster):
    """site.yml through the API, twice: the second run must change nothing."""
    return cluster, cluster.provision(), cluster.provision()


@pytest.fixture(scope="session")
def crashing_workload(tmp_path_factory):
    path = tmp_path_factory.mktemp("workload") / "crash.py"
    path.write_text(CRASHING_WORKLOAD)
    return path


def node_sh(node, command):
    """Run a shell command inside one of this cluster's docker hosts."""
    return _node_sh(NAME, node, command).stdout
