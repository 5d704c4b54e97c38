import json
from pathlib import Path

import pytest

from torchfleet.errors import InventoryError
from torchfleet.netif import gloo_interface

# Captured on a docker-in-docker node: docker0 holds 172.17.0.1, the same on every node.
ADDR = json.loads((Path(__file__).parents[1] / "fixtures" / "ip-addr-dind-master.json").read_text())
WORKER_ROUTE = [{"dst": "172.29.0.2", "dev": "eth0", "prefsrc": "172.29.0.3", "flags": [], "uid": 0, "cache": []}]
MASTER_ROUTE = [{"type": "local", "dst": "172.29.0.2", "dev": "lo", "prefsrc": "172.29.0.2", "cache": ["local"]}]


def test_worker_uses_the_route_to_master():
    assert gloo_interface("node-2", "172.29.0.2", [], WORKER_ROUTE) == "eth0"


def test_master_uses_the_interface_that_owns_the_address_not_lo():
    assert gloo_interface("node-1", "172.29.0.2", json.dumps(ADDR), json.dumps(MASTER_ROUTE)) == "eth0"


def test_docker0_is_never_picked_for_a_cluster_address():
    # A node whose docker0 comes first and whose cluster interface is not called eth0:
    # the interface that owns the master address wins, whatever its name or position.
    links = [
        {"ifname": "docker0", "addr_info": [{"family": "inet", "local": "172.17.0.1", "prefixlen": 16}]},
        {"ifname": "ens5", "addr_info": [{"family": "inet", "local": "10.1.2.3", "prefixlen": 24}]},
    ]
    route = [{"type": "local", "dst": "10.1.2.3", "dev": "lo", "prefsrc": "10.1.2.3"}]
    assert gloo_interface("node-1", "10.1.2.3", links, route) == "ens5"
    worker_route = [{"dst": "10.1.2.3", "dev": "ens6", "prefsrc": "10.1.2.4"}]
    assert gloo_interface("node-2", "10.1.2.3", links[:1], worker_route) == "ens6"


def test_loopback_route_to_a_foreign_address_fails_naming_the_host():
    with pytest.raises(InventoryError, match="host node-1: routes MASTER_ADDR 127.0.1.1 through loopback"):
        gloo_interface("node-1", "127.0.1.1", ADDR, [{"dst": "127.0.1.1", "dev": "lo"}])


def test_no_route():
    with pytest.raises(InventoryError, match="host node-3: has no route to MASTER_ADDR 10.9.9.9"):
        gloo_interface("node-3", "10.9.9.9", ADDR, [])


def test_address_network_gives_the_cidr_of_the_master_address():
    from torchfleet.netif import address_network

    assert address_network("node-1", "172.29.0.2", ADDR) == "172.29.0.0/24"
    assert address_network("node-1", "172.17.0.1", ADDR) == "172.17.0.0/16"
    with pytest.raises(InventoryError, match="no interface holding 10.9.9.9"):
        address_network("node-1", "10.9.9.9", ADDR)
