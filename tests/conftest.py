"""The local docker-host cluster that the API and CLI tests (tests/cluster) and the fault
matrix (tests/faults) share: two docker hosts, made once per session and removed at its end.
Sharing saves a cluster's creation, provisioning and removal (about 90 s on two busy cores);
the API and CLI tests run first, and the fault matrix then starts from nodes with no rank
running (its clean_start)."""

import pytest
from ansible.plugins.loader import init_plugin_loader

from harness import ROOT
from harness.cluster import NAME, SUBNET, cli, local_cluster, local_cluster_down

# Ansible's collection finder, before any test imports the collection, as in ansible-test's
# units: installed later (a render in this process, torchfleet plan --format), it would find
# the collection's packages imported without their metadata, and the modules would fail.
init_plugin_loader([str(ROOT / "collections")])


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
