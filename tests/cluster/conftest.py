"""The API and CLI tests, on the two docker hosts they share with the fault matrix
(tests/conftest.py)."""

import pytest

from harness.cluster import ENV, NAME, SUBNET, TORCHFLEET, cli, mark_folder
from harness.cluster import node_sh as _node_sh

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
def crashing_workload(tmp_path_factory):
    path = tmp_path_factory.mktemp("workload") / "crash.py"
    path.write_text(CRASHING_WORKLOAD)
    return path


def node_sh(node, command):
    """Run a shell command inside one of this cluster's docker hosts."""
    return _node_sh(NAME, node, command).stdout
