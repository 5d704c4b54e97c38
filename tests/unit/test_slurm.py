import json
import os
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.inputs import role_guard
from torchfleet import inputs, spec
from torchfleet.errors import InventoryError
from torchfleet.slurm import check_names, conf_nodes, controller, hardware, memory_mib, node_line, unready

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"  # tests/fixtures/README.md says where each comes from
# /proc/meminfo of this test machine (24 GiB), its first lines.
MEMINFO = "MemTotal:       24684096 kB\nMemFree:        16521388 kB\nMemAvailable:   23748256 kB\n"


def lscpu(name):
    return (FIXTURES / f"lscpu-{name}.txt").read_text()


def node(name, rank=None, machine="1s-2c-noht", hostname=None, address=None):
    return {"name": name, "node_rank": rank, "hostname": hostname or name.split(".")[0],
            "address": address or f"10.0.0.{name.split('.')[0][-1]}", "lscpu": lscpu(machine), "allowed": None, "meminfo": MEMINFO}


@pytest.mark.parametrize("machine, sockets, cores, threads", [
    ("1s-2c-noht", 1, 2, 1),  # this machine: `slurmd -C` on it says Sockets 1, CoresPerSocket 2, ThreadsPerCore 1
    ("intel-2s-ht", 2, 4, 2),
    ("amd-epyc-nps2", 2, 8, 2),  # NPS2: NUMA nodes are not sockets
    ("xeon-e5-2683v3-2s-cod", 2, 14, 1),
    ("opteron-6276-4s-8n", 4, 16, 1),
    ("xeon-x7550-4s-nonode", 4, 8, 2),  # round-robin numbering, half the CPUs in no NUMA node
    ("power7-smt4", 16, 1, 4),
])
def test_hardware_counts_whole_sockets_cores_and_threads(machine, sockets, cores, threads):
    found = hardware("n", lscpu(machine), MEMINFO)
    assert (found["sockets"], found["cores_per_socket"], found["threads_per_core"]) == (sockets, cores, threads)
    assert found["cpus"] == sockets * cores * threads
    assert found["real_memory"] == 24105  # 24684096 kB // 1024


def test_offline_cpus_under_claim_and_never_over():
    # 4 sockets x 2 cores x 2 threads with CPUs 2, 5, 13 and 14 offline: 12 online CPUs on 7
    # cores. slurmd counts 7 // 4 cores per socket and 12 // 7 threads; the line claims no more.
    found = hardware("n", lscpu("xeon-4s-ht-offline"), MEMINFO)
    assert (found["sockets"], found["cores_per_socket"], found["threads_per_core"], found["cpus"]) == (4, 1, 1, 4)


def test_only_the_cpus_the_node_allows_count():
    # A cpuset of one socket's CPUs (socket 0 of the 2-socket machine: CPUs 0-3 and 8-11).
    found = hardware("n", lscpu("intel-2s-ht"), MEMINFO, allowed=[0, 1, 2, 3, 8, 9, 10, 11])
    assert (found["sockets"], found["cores_per_socket"], found["threads_per_core"], found["cpus"]) == (1, 4, 2, 8)


def test_memory_reserve_and_bad_meminfo():
    assert hardware("n", lscpu("1s-2c-noht"), MEMINFO, reserve_mib=1024)["real_memory"] == 24105 - 1024
    assert memory_mib("MemTotal: 2048 kB\n") == 2
    with pytest.raises(InventoryError, match="slurm_memory_reserve_mib=30000 leaves no memory") as err:
        hardware("n", lscpu("1s-2c-noht"), MEMINFO, reserve_mib=30000)
    assert (err.value.host, err.value.variable) == ("n", "slurm_memory_reserve_mib")
    with pytest.raises(InventoryError, match="host n: its /proc/meminfo has no MemTotal"):
        memory_mib("MemFree: 1 kB\n", "n")


def test_controller_is_node_rank_0_unless_chosen():
    hosts = [{"name": "a"}, {"name": "b"}, {"name": "c"}]
    assert controller(hosts) == "a"
    assert controller(hosts, "") == "a"
    assert controller([dict(h, node_rank=r) for h, r in zip(hosts, [2, 0, 1])]) == "b"
    assert controller(hosts, "c") == "c"


def test_a_controller_outside_the_nodes_is_refused_naming_the_variable():
    with pytest.raises(InventoryError) as err:
        controller([{"name": "a"}, {"name": "b"}], "login-1")
    assert err.value.variable == "slurm_controller"
    assert str(err.value) == "slurm_controller='login-1' is not one of the Slurm nodes (a, b)"


@pytest.mark.parametrize("cluster, partition, variable", [
    ("Torchfleet", "batch", "slurm_cluster_name"),
    ("tf", "my batch", "slurm_partition"),
    ("tf", "", "slurm_partition"),
])
def test_names_slurm_would_reject_are_refused(cluster, partition, variable):
    with pytest.raises(InventoryError, match=f"^{variable}=") as err:
        check_names(cluster, partition)
    assert err.value.variable == variable


def test_conf_nodes_in_node_rank_order_with_the_controller():
    nodes = [node("n1.example.org", 1), node("n2.example.org", 0, machine="intel-2s-ht"), node("n3.example.org", 2)]
    conf = conf_nodes(nodes)
    assert conf["controller"] == {"name": "n2.example.org", "hostname": "n2", "address": "10.0.0.2"}
    assert conf["node_list"] == "n2,n1,n3"
    assert conf["lines"][0] == ("NodeName=n2 NodeAddr=10.0.0.2 CPUs=16 Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 "
                                "RealMemory=24105 State=UNKNOWN")
    assert conf_nodes(nodes, "n3.example.org")["controller"]["hostname"] == "n3"
    assert node_line(conf["nodes"][1]).startswith("NodeName=n1 NodeAddr=10.0.0.1 CPUs=2 Sockets=1 ")


def test_two_nodes_with_one_hostname_are_refused():
    with pytest.raises(InventoryError, match="host b: has the hostname 'node', as a does") as err:
        conf_nodes([node("a", hostname="node"), node("b", hostname="node")])
    assert err.value.variable == "slurm_group"


def test_unready_names_each_node_that_does_not_serve_jobs():
    sinfo = "node-1 idle\nnode-2 down*\nnode-1 idle\nnode-4 allocated\nnode-5 mixed\nnode-6 drained\n"
    assert unready(sinfo, ["node-1", "node-4", "node-5"]) == {}
    assert unready(sinfo, ["node-1", "node-2", "node-3", "node-6"]) == {
        "node-2": "down*", "node-3": "missing", "node-6": "drained"}


PLAY = """
- name: Check the slurm role's input as site.yml's first play does
  hosts: torchfleet_nodes
  gather_facts: false
  tasks:
    - name: Check it
      ansible.builtin.include_role:
        name: slurm
        tasks_from: validate
"""


def validate(tmp_path, **variables):
    """site.yml's input check of the slurm role, on two hosts that are never contacted."""
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "hosts.ini").write_text("[torchfleet_nodes]\nn1 ansible_connection=local\nn2 ansible_connection=local\n")
    args = [str(Path(sys.executable).parent / "ansible-playbook"), str(tmp_path / "play.yml"),
            "-i", str(tmp_path / "hosts.ini"),
            "-e", json.dumps({"ansible_python_interpreter": sys.executable, **variables})]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))


@pytest.mark.parametrize("variables, message", [
    ({"slurm_controller": "login-1"}, "slurm_controller='login-1' is not one of the Slurm nodes (n1, n2)"),
    ({"slurm_partition": "My Batch"}, "slurm_partition='My Batch' must be lower-case letters"),
    ({"slurm_slurmd_port": 6817}, "slurm_slurmd_port=6817 is slurm_slurmctld_port too"),
])
def test_bad_input_is_refused_before_any_node_changes(tmp_path, variables, message):
    result = validate(tmp_path, **variables)
    out = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert message in out, out[-2000:]
    assert f'"variable": "{next(iter(variables))}"' in out or f"variable: {next(iter(variables))}" in out, out[-2000:]


def test_good_input_passes(tmp_path):
    result = validate(tmp_path, slurm_controller="n2")
    assert result.returncode == 0, result.stdout[-2000:]
