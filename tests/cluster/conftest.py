"""A two-node local docker-host cluster of its own, shared by the API and CLI tests."""

from pathlib import Path

import pytest

import torchfleet

ROOT = Path(__file__).resolve().parents[2]
NAME = "pytest-api"
SUBNET = "172.29.6.0/24"
ENV = {"TORCHFLEET_STATE_DIR": str(ROOT / ".torchfleet")}

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
    for item in items:
        if Path(item.fspath).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.cluster)


@pytest.fixture(scope="session")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="session")
def inventory_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("inventory")


@pytest.fixture(scope="session")
def cluster(inventory_dir, runs_dir):
    """Two docker hosts, created through the API; removed at the end."""
    # The nodes load the image from the archive folder they share with this machine.
    cluster, _ = torchfleet.local_up(2, name=NAME, subnet=SUBNET, inventory_dir=inventory_dir,
                                     runs_dir=runs_dir, env=ENV, extra_vars={"image_archive_on_node": True})
    yield cluster
    torchfleet.local_down(name=NAME, inventory_dir=inventory_dir, env=ENV)


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
    """Run a shell command inside one docker host (on the host's own engine)."""
    import subprocess

    return subprocess.run(["docker", "exec", f"{NAME}-{node}", "sh", "-c", command],
                          capture_output=True, text=True, check=True).stdout
