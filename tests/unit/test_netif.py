import json
from pathlib import Path

import pytest

from torchfleet.errors import InventoryError
from torchfleet.netif import address_network, gloo_interface, route_device

FIXTURES = Path(__file__).parents[1] / "fixtures"
# Captured on a docker-in-docker node: docker0 holds 172.17.0.1, the same on every node.
ADDR = json.loads((FIXTURES / "ip-addr-dind-master.json").read_text())
# `ip -j route show table all` (IPv4 and IPv6) on the test machine, a docker host: eth0 and a
# default route, docker0 and a user-defined bridge, and their local-table entries.
ROUTES = json.loads((FIXTURES / "ip-route-all-docker-host.json").read_text())


@pytest.mark.parametrize("address, device", [
    ("172.29.12.30", "br-fed85484df50"),  # the bridge's /24 beats the default route
    ("172.17.0.5", "docker0"),
    ("192.0.2.77", "eth0"),
    ("10.9.9.9", "eth0"),  # only the default route leads there
    ("192.0.2.2", "lo"),  # the node's own address: the local table comes first
    ("fd00::9", "eth0"),
    ("2001:db8::1", "eth0"),  # IPv6's default route
])
def test_route_device_looks_up_as_ip_route_get_does(address, device):
    assert route_device(ROUTES, address) == device
    assert route_device(json.dumps(ROUTES), address) == device


def test_each_family_has_its_own_default_route():
    routes = [{"dst": "default", "dev": "v6only", "family": 6}, {"dst": "10.0.0.0/8", "dev": "eth0", "family": 4}]
    assert route_device(routes, "192.168.1.1") is None
    assert route_device(routes, "2001:db8::1") == "v6only"


def test_the_longest_prefix_wins_then_the_lowest_metric():
    routes = [{"dst": "10.0.0.0/8", "dev": "wide"}, {"dst": "10.1.0.0/16", "dev": "far", "metric": 200},
              {"dst": "10.1.0.0/16", "dev": "near", "metric": 100}]
    assert route_device(routes, "10.1.2.3") == "near"
    assert route_device(routes, "10.2.0.1") == "wide"


def test_unreachable_blackhole_and_prohibit_lead_nowhere_and_throw_goes_on():
    for kind in ("unreachable", "blackhole", "prohibit"):
        assert route_device([{"type": kind, "dst": "10.0.0.0/8"}, {"dst": "default", "dev": "eth0"}], "10.1.1.1") is None
    # A throw in main ends main's lookup; the default table still has a route.
    routes = [{"type": "throw", "dst": "10.0.0.0/8"}, {"dst": "default", "dev": "eth9", "table": "default"}]
    assert route_device(routes, "10.1.1.1") == "eth9"


def test_a_multipath_route_names_its_first_hop_and_other_tables_are_not_looked_up():
    assert route_device([{"dst": "10.0.0.0/8", "nexthops": [{"dev": "bond0"}, {"dev": "bond1"}]}], "10.0.0.1") == "bond0"
    assert route_device([{"dst": "default", "dev": "wg0", "table": "51820"}], "10.0.0.1") is None


def test_a_worker_uses_the_route_to_the_master():
    assert gloo_interface("node-2", "172.29.12.11", [], ROUTES) == "br-fed85484df50"


def test_the_master_uses_the_interface_that_owns_the_address_not_lo():
    master = next(a["local"] for link in ADDR for a in link["addr_info"] if link["ifname"] == "eth0")
    assert gloo_interface("node-1", master, json.dumps(ADDR), [{"type": "local", "dst": master, "dev": "lo",
                                                               "table": "local"}]) == "eth0"


def test_docker0_is_never_picked_for_a_cluster_address():
    # A node whose docker0 comes first and whose cluster interface is not called eth0:
    # the interface that owns the master address wins, whatever its name or position.
    links = [
        {"ifname": "docker0", "addr_info": [{"family": "inet", "local": "172.17.0.1", "prefixlen": 16}]},
        {"ifname": "ens5", "addr_info": [{"family": "inet", "local": "10.1.2.3", "prefixlen": 24}]},
    ]
    assert gloo_interface("node-1", "10.1.2.3", links, []) == "ens5"
    worker = [{"dst": "172.17.0.0/16", "dev": "docker0"}, {"dst": "10.1.2.0/24", "dev": "ens6"}]
    assert gloo_interface("node-2", "10.1.2.3", links[:1], worker) == "ens6"


def test_a_local_alias_of_another_address_fails_naming_the_host():
    # 127.0.1.1 is no interface's address here, yet the local table routes it to lo.
    with pytest.raises(InventoryError, match="host node-1: routes MASTER_ADDR 127.0.1.1 through loopback"):
        gloo_interface("node-1", "127.0.1.1", ADDR, ROUTES)


def test_no_route():
    with pytest.raises(InventoryError, match="host node-3: has no route to MASTER_ADDR 10.9.9.9"):
        gloo_interface("node-3", "10.9.9.9", ADDR, [r for r in ROUTES if r["dst"] != "default"])


def test_address_network_gives_the_cidr_of_the_master_address():
    assert address_network("node-1", "172.29.0.2", ADDR) == "172.29.0.0/24"
    assert address_network("node-1", "172.17.0.1", ADDR) == "172.17.0.0/16"
    with pytest.raises(InventoryError, match="no interface holding 10.9.9.9"):
        address_network("node-1", "10.9.9.9", ADDR)
