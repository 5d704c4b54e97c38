import json

import pytest

from torchfleet.errors import InventoryError
from torchfleet.overlay import allocate, check_endpoints, interface_address, load_state, unreachable_pairs


def addresses(*args, **kwargs):
    return allocate(*args, **kwargs)["addresses"]


def test_first_allocation_takes_the_lowest_addresses_in_name_order():
    assert addresses("10.77.0.0/24", ["node-2", "node-1", "node-3"]) == {
        "node-1": "10.77.0.1", "node-2": "10.77.0.2", "node-3": "10.77.0.3"}


def test_inventory_order_does_not_matter():
    assert addresses("10.77.0.0/24", ["b", "a", "c"]) == addresses("10.77.0.0/24", ["c", "b", "a"])


def test_a_node_keeps_its_address_when_the_inventory_changes():
    first = addresses("10.77.0.0/24", ["node-1", "node-2", "node-3"])
    # node-1 leaves the inventory, a new node arrives in front: nobody moves.
    second = allocate("10.77.0.0/24", ["node-0", "node-3", "node-2"], previous=first)
    assert second["addresses"]["node-2"] == first["node-2"]
    assert second["addresses"]["node-3"] == first["node-3"]
    # The departed node's address is kept for it, so the newcomer gets a fresh one.
    assert second["addresses"]["node-1"] == first["node-1"]
    assert second["addresses"]["node-0"] == "10.77.0.4"
    third = allocate("10.77.0.0/24", ["node-1", "node-0"], previous=second["addresses"])
    assert third["addresses"]["node-1"] == first["node-1"]
    assert third["addresses"]["node-0"] == "10.77.0.4"


def test_an_explicit_address_wins_and_moves_whoever_had_it():
    previous = {"a": "10.77.0.1", "b": "10.77.0.2"}
    result = addresses("10.77.0.0/24", ["a", "b"], explicit={"b": "10.77.0.1", "a": ""}, previous=previous)
    # b's old address is free again, and the lowest one.
    assert result == {"b": "10.77.0.1", "a": "10.77.0.2"}


def test_addresses_outside_a_changed_network_are_given_again():
    previous = {"a": "10.77.0.9", "b": "10.77.0.2"}
    result = allocate("10.78.0.0/29", ["a", "b"], previous=previous)
    assert result == {"network": "10.78.0.0/29", "addresses": {"a": "10.78.0.1", "b": "10.78.0.2"}}


def test_network_and_broadcast_addresses_are_never_given():
    result = addresses("10.77.0.0/30", ["a", "b"], previous={"a": "10.77.0.0", "b": "10.77.0.3"})
    assert result == {"a": "10.77.0.1", "b": "10.77.0.2"}


def test_a_full_network_names_the_host_and_the_variable():
    with pytest.raises(InventoryError) as err:
        allocate("10.77.0.0/30", ["a", "b", "c"])
    assert err.value.host == "c" and err.value.variable == "overlay_network"
    assert "10.77.0.0/30 has no free address left" in str(err.value)


@pytest.mark.parametrize("network", ["10.77.0.1/24", "banana", "fd00::/64", "10.77.0.0/31"])
def test_bad_networks_name_the_variable(network):
    with pytest.raises(InventoryError) as err:
        allocate(network, ["a"])
    assert err.value.variable == "overlay_network"


def test_explicit_address_outside_the_network_names_host_and_variable():
    with pytest.raises(InventoryError) as err:
        allocate("10.77.0.0/24", ["a", "b"], explicit={"b": "10.78.0.5"})
    assert str(err.value) == "host b: overlay_address='10.78.0.5' is not a host address inside overlay_network=10.77.0.0/24"
    assert err.value.variable == "overlay_address"


def test_two_hosts_with_one_explicit_address_are_refused():
    with pytest.raises(InventoryError, match="host b: overlay_address=10.77.0.7 is also set on a"):
        allocate("10.77.0.0/24", ["a", "b"], explicit={"a": "10.77.0.7", "b": "10.77.0.7"})


def test_endpoints_inside_the_overlay_network_are_refused():
    assert check_endpoints("10.77.0.0/24", {"a": "172.29.0.2"}) == "10.77.0.0/24"
    with pytest.raises(InventoryError) as err:
        check_endpoints("172.29.0.0/16", {"a": "10.0.0.1", "b": "172.29.0.3"})
    assert err.value.host == "b" and err.value.variable == "overlay_network"


def test_state_file_round_trip():
    assert load_state("") == {"network": None, "addresses": {}}
    assert load_state(None) == {"network": None, "addresses": {}}
    state = allocate("10.77.0.0/24", ["a"])
    assert load_state(json.dumps(state)) == state


UP = [{"ifname": "lo", "flags": ["LOOPBACK", "UP"], "addr_info": [{"family": "inet", "local": "127.0.0.1"}]},
      {"ifname": "tfwg0", "flags": ["POINTOPOINT", "NOARP", "UP", "LOWER_UP"],
       "addr_info": [{"family": "inet", "local": "10.77.0.2", "prefixlen": 24}]}]


def test_interface_address_reads_the_overlay_address():
    assert interface_address("node-2", "tfwg0", json.dumps(UP)) == "10.77.0.2"


def test_a_missing_overlay_interface_names_the_node():
    with pytest.raises(InventoryError) as err:
        interface_address("node-2", "tfwg0", UP[:1])
    assert str(err.value).startswith("host node-2: the overlay interface tfwg0 does not exist (the overlay is down)")
    assert err.value.variable == "launch_transport"


def test_a_downed_overlay_interface_names_the_node():
    down = [dict(UP[1], flags=["POINTOPOINT", "NOARP"])]
    with pytest.raises(InventoryError, match="host node-3: the overlay interface tfwg0 is down"):
        interface_address("node-3", "tfwg0", down)


def good(age=5):
    return {"configured": True, "handshake_age": age, "connected": True, "error": ""}


def test_a_fully_connected_overlay_has_no_unreachable_pair():
    results = {h: {"peers": {p: good() for p in "abc" if p != h}} for h in "abc"}
    assert unreachable_pairs(results, 180) == []


def test_each_broken_direction_is_named():
    results = {h: {"peers": {p: good() for p in "abc" if p != h}} for h in "abc"}
    results["b"]["peers"]["c"] = {"configured": True, "handshake_age": None, "connected": False, "error": "timed out"}
    results["c"]["peers"]["b"] = {"configured": True, "handshake_age": 400, "connected": True, "error": ""}
    results["a"]["peers"].pop("c")
    assert unreachable_pairs(results, 180) == [
        "a -> c: c is not a WireGuard peer of a (run site.yml)",
        "b -> c: no WireGuard handshake ever; TCP over the overlay failed (timed out)",
        "c -> b: last WireGuard handshake 400 s ago (more than 180 s)",
    ]
