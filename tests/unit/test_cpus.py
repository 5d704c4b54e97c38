from pathlib import Path

import pytest

from torchfleet.cpus import allocate, check_explicit, format_cpulist, parse_cpulist, parse_lscpu, summary
from torchfleet.errors import InventoryError

FIXTURES = Path(__file__).parents[1] / "fixtures"
INTEL = parse_lscpu((FIXTURES / "lscpu-intel-2s-ht.txt").read_text())  # 2 sockets x 4 cores x 2 threads
EPYC = parse_lscpu((FIXTURES / "lscpu-amd-epyc-nps2.txt").read_text())  # 2 sockets x 8 cores x 2, NPS2
SMALL = parse_lscpu((FIXTURES / "lscpu-1s-2c-noht.txt").read_text())  # this test machine: 2 cores


def sets(plan):
    return [(p["cpuset"], p["cpuset_mems"], p["omp_num_threads"]) for p in plan]


def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"


def test_topology_summaries():
    assert summary(INTEL) == {"cpus": 16, "cores": 8, "sockets": 2, "numa_nodes": 2, "threads_per_core": 2}
    assert summary(EPYC) == {"cpus": 32, "cores": 16, "sockets": 2, "numa_nodes": 4, "threads_per_core": 2}
    assert summary(SMALL) == {"cpus": 2, "cores": 2, "sockets": 1, "numa_nodes": 1, "threads_per_core": 1}


def test_intel_two_ranks_one_socket_each_without_hyperthreads():
    assert sets(allocate("x", INTEL, 2)) == [("0-3", "0", 4), ("4-7", "1", 4)]


def test_intel_with_hyperthreads_takes_the_siblings():
    assert sets(allocate("x", INTEL, 2, use_hyperthreads=True)) == [("0-3,8-11", "0", 4), ("4-7,12-15", "1", 4)]


def test_intel_four_ranks_stay_inside_numa_nodes():
    assert sets(allocate("x", INTEL, 4)) == [("0-1", "0", 2), ("2-3", "0", 2), ("4-5", "1", 2), ("6-7", "1", 2)]


def test_intel_rank_larger_than_a_node_spans_both():
    assert sets(allocate("x", INTEL, 1, cores_per_rank=6)) == [("0-5", "0-1", 6)]


def test_epyc_four_ranks_one_per_numa_node():
    assert sets(allocate("x", EPYC, 4)) == [("0-3", "0", 4), ("4-7", "1", 4), ("8-11", "2", 4), ("12-15", "3", 4)]


def test_epyc_reserved_cpus_and_their_siblings_are_left_to_the_system():
    plan = allocate("x", EPYC, 2, cores_per_rank=3, reserved="0,16")
    # Core 0 (CPUs 0 and 16) is the system's, so node 0 has 3 free cores and fits rank 0.
    assert sets(plan) == [("1-3", "0", 3), ("4-6", "1", 3)]


def test_small_machine_one_core_per_rank():
    assert sets(allocate("node-1", SMALL, 2)) == [("0", "0", 1), ("1", "0", 1)]


def test_impossible_request_names_host_request_and_topology():
    with pytest.raises(InventoryError) as err:
        allocate("node-1", SMALL, 3)
    assert str(err.value) == (
        "host node-1: 3 ranks need a core each, but the node has 2 cores (2 CPUs) on 1 socket(s) "
        "and 1 NUMA node(s); 2 cores are usable"
    )
    assert err.value.variable == "torchfleet_procs_per_node"
    with pytest.raises(InventoryError) as err:
        allocate("xeon-01", INTEL, 2, cores_per_rank=4, reserved="0")
    assert str(err.value) == (
        "host xeon-01: cpu_pinning_cores_per_rank=4 for 2 ranks asks for 8 cores, but the node has 8 cores "
        "(16 CPUs) on 2 socket(s) and 2 NUMA node(s); 7 cores are usable after reserving CPUs 0"
    )


def test_allowed_cpus_limit_the_choice():
    assert sets(allocate("x", INTEL, 1, allowed="4-7,12-15")) == [("4-7", "1", 4)]


def test_explicit_cpusets_are_checked_against_the_topology():
    assert sets(check_explicit("x", EPYC, ["0-3", "16-19"], 2)) == [("0-3", "0", 4), ("16-19", "0", 4)]
    with pytest.raises(InventoryError, match=r"host x: cpu_pinning_cpusets\[1\]='40-41' names CPUs 40-41"):
        check_explicit("x", EPYC, ["0-3", "40-41"], 2)
    with pytest.raises(InventoryError, match=r"cpu_pinning_cpusets\[1\] and \[0\] share CPU 3"):
        check_explicit("x", EPYC, ["0-3", "3-5"], 2)
    with pytest.raises(InventoryError, match="has 1 entries for 2 ranks"):
        check_explicit("x", EPYC, ["0-3"], 2)
