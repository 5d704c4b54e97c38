from pathlib import Path

import pytest

from torchfleet.cpus import allocate, check_explicit, format_cpulist, parse_cpulist, parse_lscpu, summary
from torchfleet.errors import InventoryError

FIXTURES = Path(__file__).parents[1] / "fixtures"  # tests/fixtures/README.md says where each comes from


def load(name):
    return parse_lscpu((FIXTURES / f"lscpu-{name}.txt").read_text())


INTEL = load("intel-2s-ht")  # 2 sockets x 4 cores x 2 threads
EPYC = load("amd-epyc-nps2")  # 2 sockets x 8 cores x 2, NPS2
SMALL = load("1s-2c-noht")  # this test machine: 2 cores
COD = load("xeon-e5-2683v3-2s-cod")  # 2 sockets x 2 NUMA nodes (cluster-on-die) x 7 cores
OPTERON = load("opteron-6276-4s-8n")  # 4 sockets x 2 NUMA nodes x 8 cores
NONODE = load("xeon-x7550-4s-nonode")  # 4 sockets x 8 cores x 2, round-robin numbering, half with no node
POWER7 = load("power7-smt4")  # 16 cores x SMT4, NUMA node 1 holds no CPU
# lscpu -a: 4 sockets, hyper-threads, CPUs 2, 5, 13, 14 offline (loaded in its tests: the
# first parser could not read this form at all).
OFFLINE = "xeon-4s-ht-offline"
MACHINES = {"intel": "intel-2s-ht", "epyc": "amd-epyc-nps2", "small": "1s-2c-noht",
            "cod": "xeon-e5-2683v3-2s-cod", "opteron": "opteron-6276-4s-8n", "nonode": "xeon-x7550-4s-nonode",
            "power7": "power7-smt4", "offline": OFFLINE}


def sets(plan):
    return [(p["cpuset"], p["cpuset_mems"], p["omp_num_threads"]) for p in plan]


def cores_of(topology, cpuset):
    by_cpu = {r["cpu"]: r for r in topology}
    return {(by_cpu[c]["socket"], by_cpu[c]["core"]) for c in parse_cpulist(cpuset)}


def where(topology, cpuset, key):
    by_cpu = {r["cpu"]: r for r in topology}
    return {by_cpu[c][key] for c in parse_cpulist(cpuset)}


def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpulist(" 0 - 1 , 4 ") == [0, 1, 4]
    assert format_cpulist([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"


@pytest.mark.parametrize("text", ["x-y", "0,a", "3-1", "0,,1", "-1", "0-", "1.5"])
def test_malformed_cpulist_names_host_and_variable(text):
    with pytest.raises(InventoryError) as err:
        parse_cpulist(text, "node-1", "cpu_pinning_reserved_cpus")
    assert err.value.host == "node-1"
    assert err.value.variable == "cpu_pinning_reserved_cpus"
    assert str(err.value) == (
        f"host node-1: cpu_pinning_reserved_cpus is {text!r}, which is not a CPU list such as '0-3,8'")


def test_topology_summaries():
    assert summary(INTEL) == {"cpus": 16, "cores": 8, "sockets": 2, "numa_nodes": 2, "threads_per_core": 2}
    assert summary(EPYC) == {"cpus": 32, "cores": 16, "sockets": 2, "numa_nodes": 4, "threads_per_core": 2}
    assert summary(SMALL) == {"cpus": 2, "cores": 2, "sockets": 1, "numa_nodes": 1, "threads_per_core": 1}
    assert summary(COD) == {"cpus": 28, "cores": 28, "sockets": 2, "numa_nodes": 4, "threads_per_core": 1}
    assert summary(POWER7) == {"cpus": 64, "cores": 16, "sockets": 16, "numa_nodes": 1, "threads_per_core": 4}
    # Offline CPUs are known, not counted.
    assert summary(load(OFFLINE)) == {"cpus": 12, "cores": 7, "sockets": 4, "numa_nodes": 1, "threads_per_core": 2}


def test_cpus_with_no_node_are_not_counted_as_a_node():
    # Before: an empty Node field became node 0, and the summary counted it.
    assert summary(NONODE) == {"cpus": 64, "cores": 32, "sockets": 4, "numa_nodes": 1, "threads_per_core": 2}
    assert {r["node"] for r in NONODE} == {0, None}


def test_parser_reads_the_header_columns_and_the_all_form():
    # An ARM lscpu adds a Cluster column; the header says where Node is.
    arm = parse_lscpu("# CPU,Core,Cluster,Socket,Node,,L1d,L1i,L2\n0,0,0,0,1,,0,0,0\n1,1,0,0,1,,1,1,0\n")
    assert [(r["cpu"], r["core"], r["socket"], r["node"]) for r in arm] == [(0, 0, 0, 1), (1, 1, 0, 1)]
    offline = [r["cpu"] for r in load(OFFLINE) if not r["online"]]
    assert offline == [2, 5, 13, 14]
    # Physical ids (lscpu -y) may print "-" for an unknown socket.
    assert parse_lscpu("# CPU,Core,Socket,Node\n0,0,-,0\n")[0]["socket"] is None


def test_intel_two_ranks_one_socket_each_without_hyperthreads():
    assert sets(allocate("x", INTEL, 2)) == [("0-3", "0", 4), ("4-7", "1", 4)]


def test_hyperthreads_give_one_openmp_thread_per_cpu():
    # Before: OMP_NUM_THREADS was the number of cores, leaving half the CPUs idle.
    assert sets(allocate("x", INTEL, 2, use_hyperthreads=True)) == [("0-3,8-11", "0", 8), ("4-7,12-15", "1", 8)]
    # SMT4: before, three quarters of the set got no thread.
    assert sets(allocate("x", POWER7, 2, use_hyperthreads=True)) == [("0-31", "0", 32), ("32-63", "0", 32)]
    assert sets(allocate("x", POWER7, 2)) == [
        ("0,4,8,12,16,20,24,28", "0", 8), ("32,36,40,44,48,52,56,60", "0", 8)]


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


def test_sub_numa_clustering_keeps_a_rank_in_the_socket_where_it_fits():
    # One socket per rank, both of its nodes.
    assert sets(allocate("x", COD, 2)) == [("0-13", "0-1", 14), ("14-27", "2-3", 14)]
    # Before, rank 1 took CPUs 9-17 from both sockets although socket 1 had 14 free cores.
    assert sets(allocate("x", COD, 3, cores_per_rank=9)) == [
        ("0-8", "0-1", 9), ("14-22", "2-3", 9), ("9-13,23-26", "1,3", 9)]


def test_four_sockets_a_rank_stays_in_one_socket_when_one_would_do():
    # Before: rank 1 got CPUs 12-23 from sockets 0 and 1.
    assert sets(allocate("x", OPTERON, 2, cores_per_rank=12)) == [("0-11", "0-1", 12), ("16-27", "2-3", 12)]
    # Before: CPUs 4-7,12-19 from three nodes of two sockets; socket 1 holds 12 cores in two nodes.
    assert sets(allocate("x", OPTERON, 1, cores_per_rank=12, reserved="0-3,8-11")) == [("16-27", "2-3", 12)]


def test_round_robin_numbering_keeps_ranks_in_one_socket():
    # Sockets 1 and 3 have no NUMA node: their ranks bind no memory. Before, every rank
    # named memory node 0 and took CPUs 0-7 from all four sockets.
    plan = allocate("x", NONODE, 4)
    assert sets(plan) == [
        ("1,5,9,13,17,21,25,29", "", 8),
        ("3,7,11,15,19,23,27,31", "", 8),
        ("0,4,8,12,16,20,24,28", "0", 8),
        ("2,6,10,14,18,22,26,30", "0", 8),
    ]
    assert [where(NONODE, p["cpuset"], "socket") for p in plan] == [{1}, {3}, {0}, {2}]


def test_memory_nodes_are_online_memory_nodes_holding_the_ranks_cpus():
    # Node 2 has no memory (or is offline): rank 2 binds none rather than a missing node.
    plan = allocate("x", EPYC, 4, memory_nodes="0-1,3")
    assert [p["cpuset_mems"] for p in plan] == ["0", "1", "", "3"]
    # POWER7: node 1 has memory but no CPU; no rank names it.
    assert {p["cpuset_mems"] for p in allocate("x", POWER7, 4, memory_nodes="0-1")} == {"0"}


def test_memory_nodes_are_limited_by_the_nodes_cgroup():
    plan = allocate("x", EPYC, 4, memory_nodes="0-3", mems_allowed="0-1")
    assert [p["cpuset_mems"] for p in plan] == ["0", "1", "", ""]
    plan = check_explicit("x", EPYC, ["0-5"], 1, memory_nodes="0-3", mems_allowed="1")
    assert plan[0]["cpuset_mems"] == "1"


def test_offline_cpus_are_never_used():
    topology = load(OFFLINE)
    assert sets(allocate("x", topology, 3)) == [("0,4", "0", 2), ("3,7", "0", 2), ("6,10", "0", 2)]
    assert sets(allocate("x", topology, 3, use_hyperthreads=True)) == [
        ("0,4,8,12", "0", 4), ("3,7,11,15", "0", 4), ("6,10", "0", 2)]
    with pytest.raises(InventoryError, match=r"cpu_pinning_cpusets\[0\]='2' names CPUs 2 that are offline"):
        check_explicit("x", topology, ["2"], 1)


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


@pytest.mark.parametrize("count", [0, -1, -4])
def test_a_core_count_below_one_is_refused(count):
    # Before: an empty cpuset and OMP_NUM_THREADS=0, with no error.
    with pytest.raises(InventoryError) as err:
        allocate("node-1", INTEL, 2, cores_per_rank=count)
    assert err.value.host == "node-1"
    assert err.value.variable == "cpu_pinning_cores_per_rank"
    assert str(err.value) == (
        f"host node-1: cpu_pinning_cores_per_rank={count} must be 1 or more (0 in the role splits the cores evenly)")


def test_malformed_reserved_cpus_are_an_input_error():
    with pytest.raises(InventoryError) as err:
        allocate("node-1", INTEL, 2, reserved="0,a")
    assert (err.value.host, err.value.variable) == ("node-1", "cpu_pinning_reserved_cpus")
    assert str(err.value) == "host node-1: cpu_pinning_reserved_cpus is '0,a', which is not a CPU list such as '0-3,8'"


def test_allowed_cpus_limit_the_choice():
    assert sets(allocate("x", INTEL, 1, allowed="4-7,12-15")) == [("4-7", "1", 4)]


def test_explicit_cpusets_are_checked_against_the_topology():
    assert sets(check_explicit("x", EPYC, ["0-3", "4-7"], 2)) == [("0-3", "0", 4), ("4-7", "1", 4)]
    with pytest.raises(InventoryError, match=r"host x: cpu_pinning_cpusets\[1\]='40-41' names CPUs 40-41"):
        check_explicit("x", EPYC, ["0-3", "40-41"], 2)
    with pytest.raises(InventoryError, match=r"cpu_pinning_cpusets\[1\] and \[0\] share CPU 3"):
        check_explicit("x", EPYC, ["0-3", "3-5"], 2)
    with pytest.raises(InventoryError, match="has 1 entries for 2 ranks"):
        check_explicit("x", EPYC, ["0-3"], 2)


def test_explicit_cpusets_never_share_a_physical_core():
    # Before: CPUs 16-19 are the hyper-threads of 0-3, and the sets were accepted.
    with pytest.raises(InventoryError) as err:
        check_explicit("x", EPYC, ["0-3", "16-19"], 2)
    assert err.value.variable == "cpu_pinning_cpusets"
    assert str(err.value) == (
        "host x: cpu_pinning_cpusets[1] and [0] share a physical core (CPUs 16 and 0), and ranks never share a core")
    # One rank may use both threads of its cores; then every CPU gets a thread.
    assert sets(check_explicit("x", EPYC, ["0-3,16-19"], 1)) == [("0-3,16-19", "0", 8)]


def test_malformed_explicit_cpuset_names_host_and_variable():
    # Before: a bare ValueError naming no host and no variable.
    with pytest.raises(InventoryError) as err:
        check_explicit("node-2", EPYC, ["0-3", "x-y"], 2)
    assert (err.value.host, err.value.variable) == ("node-2", "cpu_pinning_cpusets")
    assert str(err.value) == "host node-2: cpu_pinning_cpusets[1] is 'x-y', which is not a CPU list such as '0-3,8'"


def test_explicit_cpusets_stay_within_the_cpus_the_node_allows():
    # Before: a set outside the node's own affinity (its cgroup cpuset) was accepted.
    with pytest.raises(InventoryError) as err:
        check_explicit("node-1", INTEL, ["0-1", "8-9"], 2, allowed="0-7")
    assert err.value.variable == "cpu_pinning_cpusets"
    assert str(err.value) == (
        "host node-1: cpu_pinning_cpusets[1]='8-9' names CPUs 8-9 outside the CPUs the node lets processes use (0-7)")
    with pytest.raises(InventoryError, match=r"cpu_pinning_cpusets\[0\]='0-1' names CPUs 0 that "
                                             "cpu_pinning_reserved_cpus leaves to the system"):
        check_explicit("node-1", INTEL, ["0-1"], 1, reserved="0")


@pytest.mark.parametrize("name", sorted(MACHINES))
@pytest.mark.parametrize("hyperthreads", [False, True])
def test_properties_on_every_machine(name, hyperthreads):
    topology = load(MACHINES[name])
    online = {r["cpu"] for r in topology if r["online"]}
    nodes = {r["node"] for r in topology if r["node"] is not None}
    facts = summary(topology)
    for ranks in range(1, facts["cores"] + 1):
        plan = allocate(name, topology, ranks, use_hyperthreads=hyperthreads, memory_nodes=format_cpulist(nodes))
        seen = set()
        for p in plan:
            cpus = set(parse_cpulist(p["cpuset"]))
            cores = cores_of(topology, p["cpuset"])
            assert cpus <= online, "no offline CPU"
            assert not cores & seen, "no core shared between ranks"
            seen |= cores
            assert p["omp_num_threads"] == len(cpus), "one OpenMP thread per CPU"
            if not hyperthreads:
                assert len(cpus) == len(cores), "no siblings unless asked"
            mems = set(parse_cpulist(p["cpuset_mems"]))
            assert mems <= nodes and mems == where(topology, p["cpuset"], "node") - {None}, "memory nodes exist"
        assert len({len(cores_of(topology, p["cpuset"])) for p in plan}) == 1, "every rank the same cores"


@pytest.mark.parametrize("name", ["intel", "epyc", "cod", "opteron"])
def test_one_rank_stays_in_the_smallest_unit_that_fits(name):
    topology = load(MACHINES[name])
    per_node = max(len({(r["socket"], r["core"]) for r in topology if r["node"] == n})
                   for n in {r["node"] for r in topology})
    per_socket = summary(topology)["cores"] // summary(topology)["sockets"]
    for k in range(1, summary(topology)["cores"] + 1):
        cpuset = allocate(name, topology, 1, cores_per_rank=k)[0]["cpuset"]
        spans_nodes = len(where(topology, cpuset, "node"))
        spans_sockets = len(where(topology, cpuset, "socket"))
        assert spans_nodes == -(-k // per_node), f"{k} cores span as few NUMA nodes as possible"
        assert spans_sockets == -(-k // per_socket), f"{k} cores span as few sockets as possible"


def test_settings_read_the_role_variables_and_refuse_a_negative_core_count():
    from torchfleet.cpus import settings

    assert settings({"cpu_pinning_enabled": False}, "n1")["enabled"] is False
    got = settings({"cpu_pinning_enabled": True, "cpu_pinning_cores_per_rank": 2, "cpu_pinning_reserved_cpus": "0",
                    "cpu_pinning_cpusets": ["1-2"], "cpu_pinning_use_hyperthreads": True}, "n1")
    assert got == {"enabled": True, "use_hyperthreads": True, "cores_per_rank": 2, "reserved": "0", "cpusets": ["1-2"]}
    with pytest.raises(InventoryError) as err:
        settings({"cpu_pinning_cores_per_rank": -1}, "n3")
    assert (err.value.host, err.value.variable) == ("n3", "cpu_pinning_cores_per_rank")


def test_plan_from_a_nodes_reading_splits_evenly_takes_explicit_sets_or_pins_nothing():
    from torchfleet.cpus import plan, settings

    reading = {"lscpu": (FIXTURES / "lscpu-intel-2s-ht.txt").read_text(), "allowed": list(range(16)),
               "memory_nodes": "0-1", "mems_allowed": "0-1"}
    on = settings({"cpu_pinning_enabled": True}, "n1")
    # Two ranks split the 8 cores, one socket (and its memory node) each, hyper-threads left out.
    assert sets(plan("n1", reading, 2, on)) == [("0-3", "0", 4), ("4-7", "1", 4)]
    explicit = settings({"cpu_pinning_cpusets": ["0", "1"]}, "n1")
    assert [p["cpuset"] for p in plan("n1", reading, 2, explicit)] == ["0", "1"]
    assert plan("n1", {}, 2, settings({"cpu_pinning_enabled": False}, "n1")) == []
    with pytest.raises(InventoryError, match="has 2 entries for 3 ranks"):
        plan("n1", reading, 3, explicit)
