import pytest

from torchfleet.errors import InventoryError
from torchfleet.ranks import cluster_address, rank_table


def nodes(*names, **extra):
    return [{"name": n, "address": f"10.0.0.{i + 1}", **extra} for i, n in enumerate(names)]


def test_inventory_order_gives_ranks_and_master():
    table = rank_table(nodes("a", "b", "c"), 29500)
    assert [(r["rank"], r["host"], r["node_rank"], r["local_rank"]) for r in table["ranks"]] == [
        (0, "a", 0, 0),
        (1, "b", 1, 0),
        (2, "c", 2, 0),
    ]
    assert table["master_host"] == "a"
    assert table["master_addr"] == "10.0.0.1"
    assert table["world_size"] == 3


def test_explicit_node_ranks_reorder_the_nodes():
    hosts = nodes("a", "b", "c")
    for h, r in zip(hosts, [2, 0, 1]):
        h["node_rank"] = r
    table = rank_table(hosts)
    assert [r["host"] for r in table["ranks"]] == ["b", "c", "a"]
    assert table["master_addr"] == "10.0.0.2"


def test_several_processes_per_node_number_ranks_node_by_node():
    hosts = nodes("a", "b")
    hosts[0]["procs"] = 2
    hosts[1]["procs"] = "2"
    table = rank_table(hosts)
    assert [(r["rank"], r["host"], r["local_rank"], r["local_world_size"]) for r in table["ranks"]] == [
        (0, "a", 0, 2),
        (1, "a", 1, 2),
        (2, "b", 0, 2),
        (3, "b", 1, 2),
    ]


def test_duplicate_node_rank_names_both_hosts_and_the_variable():
    hosts = nodes("a", "b")
    hosts[0]["node_rank"] = 0
    hosts[1]["node_rank"] = 0
    with pytest.raises(InventoryError) as err:
        rank_table(hosts)
    assert str(err.value) == (
        "host b: torchfleet_node_rank=0 is also set on a; every node needs its own rank"
    )
    assert err.value.host == "b" and err.value.variable == "torchfleet_node_rank"


def test_no_master_is_reported():
    hosts = nodes("a", "b")
    hosts[0]["node_rank"] = 1
    hosts[1]["node_rank"] = 2
    with pytest.raises(InventoryError, match=r"no master: nothing has node rank 0; torchfleet_node_rank must run 0\.\.1"):
        rank_table(hosts)


def test_gap_in_node_ranks_is_reported():
    hosts = nodes("a", "b", "c")
    for h, r in zip(hosts, [0, 1, 3]):
        h["node_rank"] = r
    with pytest.raises(InventoryError, match=r"^host c: node ranks \[2\] are missing"):
        rank_table(hosts)


def test_node_rank_on_some_hosts_only():
    hosts = nodes("a", "b")
    hosts[0]["node_rank"] = 0
    with pytest.raises(InventoryError) as err:
        rank_table(hosts)
    assert str(err.value).startswith("host b: torchfleet_node_rank is set on a but not on b")


def test_empty_group_has_no_master():
    with pytest.raises(InventoryError, match="no master"):
        rank_table([])


@pytest.mark.parametrize("value", ["x", True, -1])
def test_bad_node_rank_values(value):
    hosts = nodes("a")
    hosts[0]["node_rank"] = value
    with pytest.raises(InventoryError, match="host a: torchfleet_node_rank must be"):
        rank_table(hosts)


@pytest.mark.parametrize("port", [0, 70000, "http"])
def test_bad_master_port(port):
    with pytest.raises(InventoryError, match="launch_master_port"):
        rank_table(nodes("a"), port)


def test_bad_procs_per_node():
    with pytest.raises(InventoryError, match="host a: torchfleet_procs_per_node must be >= 1, got 0"):
        rank_table(nodes("a", procs=0))


def test_cluster_address_prefers_explicit_then_network_then_ansible_host():
    assert cluster_address("n", explicit="10.1.1.1")["address"] == "10.1.1.1"
    picked = cluster_address("n", network="192.168.7.0/24", ipv4_addresses=["172.17.0.1", "192.168.7.9"])
    assert picked == {"address": "192.168.7.9", "source": "torchfleet_cluster_network"}
    picked = cluster_address("n", ansible_host="10.0.0.5", ipv4_addresses=["172.17.0.1", "10.0.0.5"],
                             default_ipv4="10.9.9.9")
    assert picked == {"address": "10.0.0.5", "source": "ansible_host"}
    # A hostname in ansible_host, as in most inventories: the default route decides.
    picked = cluster_address("n", ansible_host="node1.example", ipv4_addresses=["10.9.9.9"], default_ipv4="10.9.9.9")
    assert picked["source"] == "ansible_default_ipv4"


def test_loopback_cluster_address_is_refused():
    with pytest.raises(InventoryError) as err:
        cluster_address("n", explicit="127.0.1.1")
    assert "host n: cluster address 127.0.1.1 (from torchfleet_cluster_address) is a loopback address" in str(err.value)


def test_network_without_a_matching_address():
    with pytest.raises(InventoryError, match=r"host n: no address of this node is inside torchfleet_cluster_network=10\.5\.0\.0/16 \(it has 172\.17\.0\.1\)"):
        cluster_address("n", network="10.5.0.0/16", ipv4_addresses=["172.17.0.1"])
