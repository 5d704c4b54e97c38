"""torchfleet.spec: the launch spec of every mode, built from a realistic 3-node input.

Expected values are written out here (or computed from the input), never taken from the
builder's own intermediate results.
"""

import json
import shlex
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from harness.inputs import role_guard
from torchfleet import inputs, modes, preflight, spec
from torchfleet.modes import context
from torchfleet.errors import InventoryError
from torchfleet.ranks import rank_table

RUN_ID = "20240501-101500-beef"
JOB = "mnist"
PREFIX = "tfjob"
PORT = 29555
IMAGE = "registry.local/train:1"
MASTER = "node-1"
MASTER_ADDR = "10.0.0.11"
NODE_DIR = "/var/lib/tfnode"
DATASET = "/srv/datasets/mnist"
PYTHON = "/opt/tf/venv/bin/python3"
TLS_NODE_DIR = "/etc/tf/pki"
TLS_MOUNT = "/ppml/certs"
AESM = "/var/run/aesmd/aesm.socket"
SSH_PORT = 2222
SSH_UID, SSH_GID = 1500, 1600
# name, address, ranks, nproc
HOSTS = [("node-1", "10.0.0.11", 2, 8), ("node-2", "10.0.0.12", 1, 4), ("node-3", "10.0.0.13", 1, 2)]
ADDRESS = {h: a for h, a, _, _ in HOSTS}
# (rank, host, node_rank, local_rank, local_world_size)
EXPECTED_RANKS = [(0, "node-1", 0, 0, 2), (1, "node-1", 0, 1, 2), (2, "node-2", 1, 0, 1), (3, "node-3", 2, 0, 1)]
# Pinning per host and local rank: cpuset, cpuset_mems, omp_num_threads.
PINNING = {
    "node-1": [{"cpuset": "0-2", "cpuset_mems": "0", "omp_num_threads": 3},
               {"cpuset": "4-7", "cpuset_mems": "1", "omp_num_threads": 4}],
    "node-2": [{"cpuset": "0-1", "cpuset_mems": "", "omp_num_threads": 2}],
    "node-3": [{"cpuset": "1,3,5", "cpuset_mems": "0", "omp_num_threads": 3}],
}
# nproc // local ranks
SHARED_THREADS = {"node-1": 4, "node-2": 4, "node-3": 2}

# (mode, torchrun_runtime) -> the runtime the ranks run under.
MODES = [("container", None), ("process", None), ("torchrun", "container"), ("torchrun", "process"),
         ("mpirun", None)]
MODE_IDS = ["container", "process", "torchrun-container", "torchrun-process", "mpirun"]
RUNTIME = {("container", None): "container", ("process", None): "process", ("torchrun", "container"): "container",
           ("torchrun", "process"): "process", ("mpirun", None): "container"}


def settings(**over):
    s = {
        "node_dir": NODE_DIR, "dataset_dir": DATASET, "python": PYTHON, "omp_num_threads": 0,
        "proxy_env": {}, "extra_env": {}, "extra_volumes": [], "extra_devices": [], "sgx_devices": [],
        "sgx_aesm_socket": False, "sgx_aesm_socket_path": AESM, "sgx_enabled": False, "sgx_log_level": "error",
        "gloo_tls": False, "tls_node_dir": TLS_NODE_DIR, "tls_mount": TLS_MOUNT, "oom_kill_disable": False,
        "mpirun_args": [], "ssh_port": SSH_PORT, "ssh_user": "trainer", "ssh_uid": SSH_UID, "ssh_gid": SSH_GID,
        "ssh_node_dir": "/etc/tf/ssh", "ssh_client_dir": "/etc/tf/ssh-client", "ssh_container_dir": "/etc/tf/sshc",
        "sshd_path": "/usr/sbin/sshd", "ssh_launcher": "", "malloc": "default", "checkpoint_dir": "",
    }
    s.update(over)
    return s


def make(mode="container", runtime=None, *, pinning=False, secret=None, args=None, workload=None, command=None,
         per_host=None, guard=None, **common):
    """(job, table, nodes) for the 3-node cluster. ``common`` overrides every node's settings,
    ``per_host`` {host: {setting: value}} one node's."""
    job = {"run_id": RUN_ID, "job": JOB, "mode": mode, "transport": "tcp", "image": IMAGE,
           "torchrun_runtime": runtime or "container", "container_prefix": PREFIX, "command": command or [],
           "args": list(args or []), "workload_argv": workload or ["python3", "mnist.py"],
           "guard": dict(role_guard(), **(guard or {}))}
    table = rank_table([{"name": h, "address": a, "procs": p} for h, a, p, _ in HOSTS], PORT)
    nodes = {}
    for host, address, _, nproc in HOSTS:
        s = settings(**common)
        s.update((per_host or {}).get(host, {}))
        parts = inputs.split_site_env(s, secret, host)
        nodes[host] = {"address": address, "interface": "eth0", "nproc": nproc,
                       "pinning": [dict(p) for p in PINNING[host]] if pinning else [],
                       "mpi_network": "10.0.0.0/24" if (mode == "mpirun" and host == MASTER) else "",
                       "settings": s, "env_public": parts["public"], "env_shown": parts["shown"]}
    return job, table, nodes


def build(mode="container", runtime=None, **kw):
    return spec.build(*make(mode, runtime, **kw))


def paths(runtime):
    if runtime == "container":
        return {"data": "/data", "out": "/out", "workload": "/workload"}
    return {"data": DATASET, "out": f"{NODE_DIR}/runs/{RUN_ID}", "workload": f"{NODE_DIR}/workloads/{JOB}"}


def node_env(text):
    """node.env as a dict; each line is NAME='value' for a shell."""
    out = {}
    for line in text.splitlines():
        (word,) = shlex.split(line)
        key, _, value = word.partition("=")
        out[key] = value
    return out


def units_of(built, host=None, role=None):
    return [u for u in built.units if (host is None or u.host == host) and (role is None or u.role == role)]


# --- ranks and their environment, every mode -----------------------------------------------


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_world_and_rank_layout(mode, runtime):
    built = build(mode, runtime)
    assert built.world_size == 4 and built.num_nodes == 3
    assert (built.master_host, built.master_addr, built.master_port) == (MASTER, MASTER_ADDR, PORT)
    assert [r.rank for r in built.ranks] == [0, 1, 2, 3]
    assert [(r.rank, r.host, r.node_rank, r.local_rank, r.local_world_size) for r in built.ranks] == EXPECTED_RANKS
    assert [r.address for r in built.ranks] == ["10.0.0.11", "10.0.0.11", "10.0.0.12", "10.0.0.13"]
    assert all(r.interface == "eth0" for r in built.ranks)
    assert (built.run_id, built.job, built.mode) == (RUN_ID, JOB, mode)
    assert built.image == (None if RUNTIME[(mode, runtime)] == "process" else IMAGE)
    runner = {"container": "container", "process": "process", "torchrun": "torchrun", "mpirun": "mpirun"}[mode]
    assert {r.runner for r in built.ranks} == {runner}


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_two_phases_the_masters_units_first(mode, runtime):
    """start.yml imports phase 0 and phase 1, no others: a third would never start."""
    built = build(mode, runtime)
    assert built.phases == [0, 1]
    assert all(u.phase == 0 for u in built.units if u.role in ("rank", "torchrun") and u.host == MASTER)
    # A detached start waits for listeners in phase 0 only (the start_units action).
    assert {u.phase for u in built.units if u.listen} == {0}


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_rank_env(mode, runtime):
    built = build(mode, runtime)
    p = paths(RUNTIME[(mode, runtime)])
    for r, (rank, host, node_rank, local, local_size) in zip(built.ranks, EXPECTED_RANKS):
        expected = {"RANK": str(rank), "WORLD_SIZE": "4", "LOCAL_RANK": str(local),
                    "LOCAL_WORLD_SIZE": str(local_size), "NODE_RANK": str(node_rank), "MASTER_ADDR": MASTER_ADDR,
                    "GLOO_SOCKET_IFNAME": "eth0", "OMP_NUM_THREADS": str(SHARED_THREADS[host]),
                    "TORCHFLEET_DATA_DIR": p["data"], "TORCHFLEET_OUT_DIR": p["out"], "TORCHFLEET_RUN_ID": RUN_ID}
        assert {k: r.env.get(k) for k in expected} == expected, r.rank
        if mode == "torchrun":
            # torchrun picks its ranks' MASTER_PORT itself.
            assert "MASTER_PORT" not in r.env
            assert r.runner_env == ["MASTER_PORT"]
        else:
            assert r.env["MASTER_PORT"] == str(PORT)
            assert r.runner_env == []
        assert r.threads == SHARED_THREADS[host]
        assert r.workdir == p["workload"]
        assert r.cpuset is None and r.cpuset_mems is None
        assert all(isinstance(v, str) for v in r.env.values())


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_each_rank_names_a_unit_that_holds_it(mode, runtime):
    built = build(mode, runtime)
    # Names are per node (a container's name is its docker host's).
    by_name = {(u.host, u.name): u for u in built.units}
    assert len(by_name) == len(built.units), "unit names must be unique on a node"
    for r in built.ranks:
        # mpirun starts every rank from the master's unit; the others on the rank's own node.
        host = MASTER if mode == "mpirun" else r.host
        assert r.rank in by_name[(host, r.unit)].ranks


def test_interface_is_each_nodes_own():
    job, table, nodes = make("container")
    nodes["node-3"]["interface"] = "ens5"
    built = spec.build(job, table, nodes)
    assert [r.env["GLOO_SOCKET_IFNAME"] for r in built.ranks] == ["eth0", "eth0", "eth0", "ens5"]
    assert [r.interface for r in built.ranks] == ["eth0", "eth0", "eth0", "ens5"]


def test_a_node_without_interface_is_refused():
    job, table, nodes = make("container")
    nodes["node-2"]["interface"] = ""
    with pytest.raises(InventoryError) as exc:
        spec.build(job, table, nodes)
    assert (exc.value.variable, exc.value.host) == ("GLOO_SOCKET_IFNAME", "node-2")


# --- threads --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_threads_explicit_setting_wins_over_pinning(mode, runtime):
    built = build(mode, runtime, pinning=True, omp_num_threads=5)
    assert [r.threads for r in built.ranks] == [5, 5, 5, 5]
    assert [r.env["OMP_NUM_THREADS"] for r in built.ranks] == ["5"] * 4


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_threads_from_pinning(mode, runtime):
    built = build(mode, runtime, pinning=True)
    assert [r.threads for r in built.ranks] == [3, 4, 2, 3]
    assert [r.env["OMP_NUM_THREADS"] for r in built.ranks] == ["3", "4", "2", "3"]


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_threads_share_the_nodes_cpus_at_least_one(mode, runtime):
    job, table, nodes = make(mode, runtime)
    nodes["node-1"]["nproc"] = 1  # two ranks on one CPU: still one thread each
    nodes["node-2"]["nproc"] = 6
    nodes["node-3"]["nproc"] = 3
    built = spec.build(job, table, nodes)
    assert [r.threads for r in built.ranks] == [1, 1, 6, 3]
    assert [r.env["OMP_NUM_THREADS"] for r in built.ranks] == ["1", "1", "6", "3"]


def test_threads_function_directly():
    assert context.threads({"nproc": 7, "settings": {}}, 2) == [3, 3]
    assert context.threads({"nproc": 7, "settings": {"omp_num_threads": "2"}}, 3) == [2, 2, 2]
    assert context.threads({"nproc": 0, "settings": {}}, 4) == [1, 1, 1, 1]
    assert context.threads({"nproc": 16, "pinning": PINNING["node-1"], "settings": {"omp_num_threads": 0}}, 2) == [3, 4]


# --- pinning --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_pinning_reaches_each_rank(mode, runtime):
    built = build(mode, runtime, pinning=True)
    assert [r.cpuset for r in built.ranks] == ["0-2", "4-7", "0-1", "1,3,5"]
    # Memory is bound only where docker applies it: a rank's own container, or torchrun's
    # container for all of its node's ranks; taskset binds CPUs only.
    expected = {("container", None): ["0", "1", None, "0"],
                ("torchrun", "container"): ["0,1", "0,1", None, "0"]}.get((mode, runtime), [None] * 4)
    assert [r.cpuset_mems for r in built.ranks] == expected


@pytest.mark.parametrize("mode", ["container", "process"])
def test_pinning_on_rank_units(mode):
    built = build(mode, pinning=True)
    # A container unit's cpuset is docker's cpuset_cpus (the start_units action); a process's, taskset's.
    mems = ["0", "1", None, "0"] if mode == "container" else [None] * 4
    assert [(u.ranks, u.cpuset, u.cpuset_mems) for u in built.units] == [
        ([r], c, m) for r, c, m in zip(range(4), ["0-2", "4-7", "0-1", "1,3,5"], mems)]


@pytest.mark.parametrize("runtime", ["container", "process"])
def test_torchrun_pins_the_agent_to_the_union_and_passes_each_ranks_cpuset(runtime):
    built = build("torchrun", runtime, pinning=True)
    agents = {u.host: u for u in built.units}
    assert agents["node-1"].cpuset == "0-2,4-7"
    assert agents["node-2"].cpuset == "0-1"
    assert agents["node-3"].cpuset == "1,3,5"
    assert agents["node-1"].env["TORCHFLEET_CPUSETS"] == "0-2;4-7"
    assert agents["node-1"].env["TORCHFLEET_THREADS"] == "3;4"
    assert agents["node-3"].env["TORCHFLEET_CPUSETS"] == "1,3,5"
    # The agent's ranks pin themselves through the wrapper.
    argv = agents["node-1"].argv
    assert "--no-python" in argv and "taskset" in argv[argv.index("-c") + 1]
    for r in built.ranks:
        assert r.env["TORCHFLEET_CPUSETS"] == {"node-1": "0-2;4-7", "node-2": "0-1", "node-3": "1,3,5"}[r.host]


@pytest.mark.parametrize("runtime", ["container", "process"])
def test_torchrun_without_pinning_sets_no_cpusets(runtime):
    built = build("torchrun", runtime)
    for u in built.units:
        assert u.cpuset is None
        assert "TORCHFLEET_CPUSETS" not in u.env
        assert "--no-python" not in u.argv


def test_mpirun_node_env_carries_the_cpusets():
    built = build("mpirun", pinning=True)
    env1 = node_env(built.files["node-1"]["node.env"])
    assert env1["TORCHFLEET_CPUSETS"] == "0-2;4-7" and env1["TORCHFLEET_THREADS"] == "3;4"
    assert node_env(built.files["node-3"]["node.env"])["TORCHFLEET_CPUSETS"] == "1,3,5"


# --- units ----------------------------------------------------------------------------------


def test_container_units_one_per_rank_master_first():
    built = build("container")
    assert [(u.name, u.host, u.kind, u.role, u.phase, u.ranks) for u in built.units] == [
        (f"{PREFIX}-{RUN_ID}-rank0", "node-1", "container", "rank", 0, [0]),
        (f"{PREFIX}-{RUN_ID}-rank1", "node-1", "container", "rank", 0, [1]),
        (f"{PREFIX}-{RUN_ID}-rank2", "node-2", "container", "rank", 1, [2]),
        (f"{PREFIX}-{RUN_ID}-rank3", "node-3", "container", "rank", 1, [3]),
    ]
    assert [u.listen for u in built.units] == [{"host": MASTER_ADDR, "port": PORT}, None, None, None]
    assert built.phases == [0, 1]
    for u in built.units:
        assert u.argv == ["python3", "mnist.py"]
        assert u.env["RANK"] == str(u.ranks[0])
        assert u.labels == {"torchfleet.run": RUN_ID, "torchfleet.job": JOB, "torchfleet.role": "rank",
                            "torchfleet.rank": str(u.ranks[0])}
        assert u.mounts[:3] == [
            {"type": "bind", "source": DATASET, "target": "/data", "read_only": True},
            {"type": "bind", "source": f"{NODE_DIR}/workloads/{JOB}", "target": "/workload", "read_only": True},
            {"type": "bind", "source": f"{NODE_DIR}/runs/{RUN_ID}", "target": "/out", "read_only": False},
        ]
        assert u.workdir == "/workload"
    # Each unit starts under its guard, which reads the same guard.json on every node.
    for i, u in enumerate(built.units):
        assert u.command == ["python3", "/out/guard.py", "/out/guard.json", str(i), "--", *u.argv]
        assert u.env["TORCHFLEET_HEARTBEAT"] == f"/out/heartbeat-{u.name}"
    assert built.guard["store"] == {"host": MASTER_ADDR, "port": 29510, "node": "node-1"}
    assert built.guard["store_unit"] == 0
    # The guards tell a rank that lost a peer the way the report does (a Gloo reset, say).
    import re
    assert re.search(built.guard["peer_error"], "[pair.cc:598] Read error: Connection reset by peer", re.I)
    assert {h: json.loads(f["guard.json"]) for h, f in built.files.items()} == {
        h: built.guard for h in ("node-1", "node-2", "node-3")}


def test_process_units():
    built = build("process")
    assert [(u.name, u.host, u.kind, u.role, u.phase, u.ranks) for u in built.units] == [
        ("rank-0", "node-1", "process", "rank", 0, [0]), ("rank-1", "node-1", "process", "rank", 0, [1]),
        ("rank-2", "node-2", "process", "rank", 1, [2]), ("rank-3", "node-3", "process", "rank", 1, [3]),
    ]
    assert [u.listen for u in built.units] == [{"host": MASTER_ADDR, "port": PORT}, None, None, None]
    for u in built.units:
        assert u.argv == [PYTHON, "mnist.py"]
        assert u.mounts == []
        assert u.oom_kill_disable is False
        assert u.workdir == f"{NODE_DIR}/workloads/{JOB}"
    out = f"{NODE_DIR}/runs/{RUN_ID}"
    for i, u in enumerate(built.units):
        assert u.command == [PYTHON, f"{out}/guard.py", f"{out}/guard.json", str(i), "--", *u.argv]


@pytest.mark.parametrize("runtime", ["container", "process"])
def test_torchrun_one_agent_per_node(runtime):
    built = build("torchrun", runtime)
    python = "python3" if runtime == "container" else PYTHON
    kind = runtime
    names = [f"{PREFIX}-{RUN_ID}-torchrun"] * 3 if runtime == "container" else ["torchrun"] * 3
    assert [(u.name, u.host, u.kind, u.role, u.phase, u.ranks) for u in built.units] == [
        (names[0], "node-1", kind, "torchrun", 0, [0, 1]),
        (names[1], "node-2", kind, "torchrun", 1, [2]),
        (names[2], "node-3", kind, "torchrun", 1, [3]),
    ]
    assert [u.listen for u in built.units] == [{"host": MASTER_ADDR, "port": PORT}, None, None]
    for u, (host, _, procs, _), node_rank in zip(built.units, HOSTS, [0, 1, 2]):
        a = u.argv
        assert a[:3] == [python, "-m", "torch.distributed.run"]
        opt = {a[i]: a[i + 1] for i in range(3, a.index("--tee") + 1, 2)}
        assert opt["--nnodes"] == "3"
        assert opt["--nproc-per-node"] == str(procs)
        assert opt["--node-rank"] == str(node_rank)
        assert opt["--rdzv-backend"] == "static"
        assert (opt["--master-addr"], opt["--master-port"]) == (MASTER_ADDR, str(PORT))
        assert opt["--rdzv-id"] == RUN_ID
        assert a[-1] == "mnist.py"
        assert u.env["OMP_NUM_THREADS"] == str(SHARED_THREADS[host])
        assert u.env["NODE_RANK"] == str(node_rank)
        assert "RANK" not in u.env and "MASTER_PORT" not in u.env
        assert u.mounts == [] if runtime == "process" else u.mounts[0]["target"] == "/data"
    for r in built.ranks:
        assert r.argv == [python, "-u", "mnist.py"]
    assert built.phases == [0, 1]


def test_torchrun_runs_a_module_entry_point():
    built = build("torchrun", workload=["python3", "-m", "pkg.train"], args=["--epochs", "2"])
    assert built.units[0].argv[-4:] == ["-m", "pkg.train", "--epochs", "2"]
    assert built.ranks[0].argv == ["python3", "-u", "-m", "pkg.train", "--epochs", "2"]
    pinned = build("torchrun", workload=["python3", "-m", "pkg.train"], pinning=True)
    assert pinned.units[0].argv[-5:] == ["rank", "python3", "-u", "-m", "pkg.train"]


@pytest.mark.parametrize("mode, runtime", [("container", None), ("torchrun", "container"), ("mpirun", None)])
def test_explicit_command_replaces_the_entry_point(mode, runtime):
    built = build(mode, runtime, command=["bash", "run.sh"], args=["--x", "1"])
    for r in built.ranks:
        assert r.argv == ["bash", "run.sh", "--x", "1"]
    master = [u for u in built.units if u.host == MASTER and u.role != "sshd"][0]
    assert master.argv[-4:] == ["bash", "run.sh", "--x", "1"]


def test_mpirun_units():
    built = build("mpirun", args=["--epochs", "3"])
    user = f"{SSH_UID}:{SSH_GID}"
    assert [(u.name, u.host, u.kind, u.role, u.phase) for u in built.units] == [
        (f"{PREFIX}-{RUN_ID}-mpirun", "node-1", "container", "mpirun", 1),
        (f"{PREFIX}-{RUN_ID}-sshd", "node-2", "container", "sshd", 0),
        (f"{PREFIX}-{RUN_ID}-sshd", "node-3", "container", "sshd", 0),
    ]
    mpirun, sshd2, sshd3 = built.units
    assert sshd2.listen == {"host": "10.0.0.12", "port": SSH_PORT}
    assert sshd3.listen == {"host": "10.0.0.13", "port": SSH_PORT}
    assert mpirun.listen is None
    assert sshd2.argv == ["/usr/sbin/sshd", "-D", "-e", "-f", "/etc/tf/sshc/sshd_config"]
    assert {"type": "bind", "source": "/etc/tf/ssh", "target": "/etc/tf/sshc", "read_only": True} in sshd2.mounts
    assert {"type": "bind", "source": "/etc/tf/ssh-client", "target": "/home/trainer/.ssh",
            "read_only": True} in mpirun.mounts
    assert mpirun.argv[:5] == ["mpirun", "-np", "4", "-H", "node-1:2,node-2:1,node-3:1"]
    assert mpirun.argv[-5:] == ["rank", "python3", "mnist.py", "--epochs", "3"]
    a = mpirun.argv
    assert [a[i + 1] for i, x in enumerate(a) if x == "--mca"] == ["oob_tcp_if_include", "btl_tcp_if_include"]
    assert a.count("10.0.0.0/24") == 2
    assert mpirun.ranks == [0, 1, 2, 3]
    assert mpirun.env == {"MASTER_ADDR": MASTER_ADDR, "MASTER_PORT": str(PORT), "PYTHONUNBUFFERED": "1"}
    assert {u.user for u in built.units} == {user}
    assert {r.user for r in built.ranks} == {user}
    assert [r.argv for r in built.ranks] == [["python3", "mnist.py", "--epochs", "3"]] * 4
    assert built.phases == [0, 1]
    assert set(built.files) == {"node-1", "node-2", "node-3"}
    env2 = node_env(built.files["node-2"]["node.env"])
    assert env2["GLOO_SOCKET_IFNAME"] == "eth0"
    assert env2["NODE_RANK"] == "1"
    assert env2["TORCHFLEET_OUT_DIR"] == "/out"
    # mpirun starts after the sshds, yet the master's unit hosts the store; sshd is a service.
    assert built.guard["store_unit"] == next(i for i, u in enumerate(built.units) if u.role == "mpirun")
    assert [u["service"] for u in built.guard["units"]] == [u.role == "sshd" for u in built.units]


def test_mpirun_passes_mpirun_args_before_the_rank_command():
    built = build("mpirun", mpirun_args=["--mca", "plm_rsh_args", "-p 2222"])
    a = built.units[0].argv
    assert a[a.index("plm_rsh_args") + 1] == "-p 2222"
    assert a.index("plm_rsh_args") < a.index("/bin/sh")


def test_mpirun_ranks_get_their_thread_count_without_pinning():
    """Each mpirun rank's environment is node.env, Open MPI's numbers and mpirun's -x: the
    spec says OMP_NUM_THREADS is the node's CPUs shared out, so node.env must carry it
    (the pin wrapper exports it only when the node is pinned)."""
    built = build("mpirun")
    from_elsewhere = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",  # from OMPI_COMM_WORLD_*
                      "MASTER_ADDR", "MASTER_PORT", "PYTHONUNBUFFERED"}  # mpirun -x
    for host in ("node-1", "node-2", "node-3"):
        env = node_env(built.files[host]["node.env"])
        assert env.get("OMP_NUM_THREADS") == str(SHARED_THREADS[host]), host
        for r in built.ranks:
            if r.host == host:
                missing = set(r.env) - from_elsewhere - set(env) - set(r.secret_env)
                assert not missing, (host, sorted(missing))


# --- every option in mpirun, TLS in the others -----------------------------------------------

FULL = dict(gloo_tls=True, extra_volumes=["/srv/x:/x:ro"], sgx_devices=["/dev/sgx_enclave"], sgx_aesm_socket=True,
            sgx_enabled=True, extra_devices=["/dev/fuse"], oom_kill_disable=True)
TLS_MOUNT_ENTRY = {"type": "bind", "source": TLS_NODE_DIR, "target": TLS_MOUNT, "read_only": True}
EXTRA_MOUNT = {"type": "bind", "source": "/srv/x", "target": "/x", "read_only": True}
AESM_MOUNT = {"type": "bind", "source": AESM, "target": AESM, "read_only": False}


def test_mpirun_gets_every_option():
    built = build("mpirun", **FULL)
    assert len(built.units) == 3
    for thing in built.units + built.ranks:
        for m in (TLS_MOUNT_ENTRY, EXTRA_MOUNT, AESM_MOUNT):
            assert m in thing.mounts, (getattr(thing, "name", thing.rank if hasattr(thing, "rank") else None), m)
        assert sorted(thing.devices) == ["/dev/fuse", "/dev/sgx_enclave"]
    for u in built.units:
        assert u.oom_kill_disable is True
    for r in built.ranks:
        assert r.env["GLOO_DEVICE_TRANSPORT"] == "TCP_TLS"
        assert r.env["GLOO_DEVICE_TRANSPORT_TCP_TLS_PKEY"] == f"{TLS_MOUNT}/node.key"
        assert r.env["GLOO_DEVICE_TRANSPORT_TCP_TLS_CERT"] == f"{TLS_MOUNT}/node.crt"
        assert r.env["GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_FILE"] == f"{TLS_MOUNT}/ca.crt"
        assert r.env["SGX_ENABLED"] == "true"
    # The ranks read all of it from node.env.
    for host in ("node-1", "node-2", "node-3"):
        env = node_env(built.files[host]["node.env"])
        assert env["GLOO_DEVICE_TRANSPORT"] == "TCP_TLS"
        assert env["GLOO_DEVICE_TRANSPORT_TCP_TLS_PKEY"] == f"{TLS_MOUNT}/node.key"
        assert env["SGX_ENABLED"] == "true"


@pytest.mark.parametrize("mode, runtime", [("container", None), ("torchrun", "container")])
def test_container_modes_get_every_option(mode, runtime):
    built = build(mode, runtime, **FULL)
    for thing in built.units + built.ranks:
        for m in (TLS_MOUNT_ENTRY, EXTRA_MOUNT, AESM_MOUNT):
            assert m in thing.mounts
        assert sorted(thing.devices) == ["/dev/fuse", "/dev/sgx_enclave"]
        assert thing.env["GLOO_DEVICE_TRANSPORT_TCP_TLS_PKEY"] == f"{TLS_MOUNT}/node.key"
    assert all(u.oom_kill_disable for u in built.units)


@pytest.mark.parametrize("mode, runtime", [("process", None), ("torchrun", "process")])
def test_process_runtime_reads_tls_files_on_the_node(mode, runtime):
    built = build(mode, runtime, gloo_tls=True)
    for thing in built.units + built.ranks:
        assert thing.env["GLOO_DEVICE_TRANSPORT"] == "TCP_TLS"
        assert thing.env["GLOO_DEVICE_TRANSPORT_TCP_TLS_PKEY"] == f"{TLS_NODE_DIR}/node.key"
        assert thing.env["GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_FILE"] == f"{TLS_NODE_DIR}/ca.crt"
        assert thing.mounts == []


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_no_tls_env_without_gloo_tls(mode, runtime):
    built = build(mode, runtime)
    for r in built.ranks:
        assert not any(k.startswith("GLOO_DEVICE_TRANSPORT") for k in r.env)
        assert TLS_MOUNT_ENTRY not in r.mounts


# --- secrets --------------------------------------------------------------------------------

SECRET = {"TOKEN": "tfsecret-123"}
PROXY = {"https_proxy": "http://u:pw@proxy:3128", "no_proxy": "localhost,10.0.0.0/24"}


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_secrets_never_enter_the_spec(mode, runtime):
    built = build(mode, runtime, secret=SECRET, proxy_env=PROXY)
    for text in (json.dumps(spec.redacted(built)), json.dumps(built.to_dict())):
        assert "tfsecret-123" not in text
        assert "pw@" not in text
    names = {"TOKEN", "https_proxy"}
    for r in built.ranks:
        assert r.env["TOKEN"] == "<secret>"
        assert r.env["https_proxy"] == "http://***@proxy:3128"
        assert r.env["no_proxy"] == "localhost,10.0.0.0/24"
        assert set(r.secret_env) == names
    for u in built.units:
        if "TOKEN" in u.env or "https_proxy" in u.env:
            assert set(u.secret_env) == names, u.name
        else:
            assert u.secret_env == [], u.name
    if mode != "mpirun":
        # Every unit that starts ranks itself gets the site env.
        assert all(set(u.secret_env) == names for u in built.units)


def test_mpirun_node_env_leaves_secrets_to_the_secret_file():
    built = build("mpirun", secret=SECRET, proxy_env=PROXY)
    for host in ("node-1", "node-2", "node-3"):
        env = node_env(built.files[host]["node.env"])
        assert "TOKEN" not in env and "https_proxy" not in env
        assert env["no_proxy"] == "localhost,10.0.0.0/24"


def test_redacted_masks_credentials_in_arguments_too():
    built = build("container", args=["--index", "https://bob:hunter2@pypi.local/simple"])
    text = json.dumps(spec.redacted(built))
    assert "hunter2" not in text
    assert "https://***@pypi.local/simple" in text


def test_redacted_takes_a_dict():
    built = build("container")
    assert spec.redacted(built.to_dict()) == spec.redacted(built)


# --- refusals -------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("name", ["RANK", "MASTER_PORT", "TORCHFLEET_OUT_DIR", "WORLD_SIZE", "TORCHFLEET_CPUSETS"])
def test_extra_env_may_not_set_what_the_launch_sets(mode, runtime, name):
    job, table, nodes = make(mode, runtime, per_host={"node-2": {"extra_env": {name: "7"}}})
    with pytest.raises(InventoryError) as exc:
        spec.build(job, table, nodes)
    assert (exc.value.variable, exc.value.host) == ("launch_extra_env", "node-2")
    assert name in str(exc.value)


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_gloo_tcp_iface_is_refused(mode, runtime):
    job, table, nodes = make(mode, runtime, per_host={"node-3": {"extra_env": {"GLOO_TCP_IFACE": "eth1"}}})
    with pytest.raises(InventoryError) as exc:
        spec.build(job, table, nodes)
    assert (exc.value.variable, exc.value.host) == ("launch_extra_env", "node-3")
    assert "GLOO_SOCKET_IFNAME" in str(exc.value)


def test_secret_named_rank_is_refused_when_split():
    with pytest.raises(InventoryError) as exc:
        inputs.split_site_env(settings(), {"RANK": "1"}, "node-2")
    assert (exc.value.variable, exc.value.host) == ("launch_secret_env", "node-2")


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
@pytest.mark.parametrize("name", ["RANK", "TORCHFLEET_OUT_DIR"])
def test_secret_named_like_a_launch_variable_is_refused_by_build(mode, runtime, name):
    # Past split_site_env (which knows only the rank variables): the spec refuses it itself.
    job, table, nodes = make(mode, runtime)
    nodes["node-2"]["env_shown"] = dict(nodes["node-2"]["env_shown"], **{name: "<secret>"})
    with pytest.raises(InventoryError) as exc:
        spec.build(job, table, nodes)
    assert (exc.value.variable, exc.value.host) == ("launch_secret_env", "node-2")


def test_secret_torchfleet_out_dir_through_split_site_env_is_refused_by_build():
    job, table, nodes = make("container", secret={"TORCHFLEET_OUT_DIR": "/tmp/x"})
    with pytest.raises(InventoryError) as exc:
        spec.build(job, table, nodes)
    assert (exc.value.variable, exc.value.host) == ("launch_secret_env", "node-1")


@pytest.mark.parametrize("mode, runtime, where", [
    ("process", None, "launch_mode=process"),
    ("torchrun", "process", "launch_mode=torchrun with launch_torchrun_runtime=process"),
])
def test_extra_volumes_refused_without_containers(mode, runtime, where):
    job, table, nodes = make(mode, runtime, per_host={"node-3": {"extra_volumes": ["/srv/x:/x"]}})
    with pytest.raises(InventoryError) as exc:
        spec.build(job, table, nodes)
    assert (exc.value.variable, exc.value.host) == ("launch_extra_volumes", "node-3")
    assert where in str(exc.value)


@pytest.mark.parametrize("mode, runtime", [("process", None), ("torchrun", "process")])
def test_oom_kill_disable_refused_without_containers(mode, runtime):
    job, table, nodes = make(mode, runtime, per_host={"node-2": {"oom_kill_disable": True}})
    with pytest.raises(InventoryError) as exc:
        spec.build(job, table, nodes)
    assert (exc.value.variable, exc.value.host) == ("launch_oom_kill_disable", "node-2")
    assert f"launch_mode={mode}" in str(exc.value)


@pytest.mark.parametrize("mode, runtime", [("container", None), ("torchrun", "container"), ("mpirun", None)])
def test_container_modes_accept_volumes_and_oom_kill_disable(mode, runtime):
    built = build(mode, runtime, extra_volumes=["/srv/x:/x"], oom_kill_disable=True)
    assert {"type": "bind", "source": "/srv/x", "target": "/x", "read_only": False} in built.ranks[0].mounts


def test_mpirun_launcher_must_be_the_master():
    job, table, nodes = make("mpirun", per_host={"node-2": {"ssh_launcher": "node-2"}})
    with pytest.raises(InventoryError) as exc:
        spec.build(job, table, nodes)
    assert (exc.value.variable, exc.value.host) == ("ssh_mesh_launcher", "node-2")
    assert "node-1" in str(exc.value)
    # The master itself, or nothing, is fine.
    assert build("mpirun", ssh_launcher="node-1").world_size == 4
    assert build("mpirun", ssh_launcher="").world_size == 4


def test_ssh_launcher_matters_to_mpirun_only():
    assert build("container", ssh_launcher="node-2").world_size == 4


@pytest.mark.parametrize("volume", ["nocolon", ":/x", "/srv/x:"])
@pytest.mark.parametrize("mode, runtime", [("container", None), ("torchrun", "container"), ("mpirun", None)])
def test_bad_extra_volume_is_refused(mode, runtime, volume):
    job, table, nodes = make(mode, runtime, per_host={"node-2": {"extra_volumes": [volume]}})
    with pytest.raises(InventoryError) as exc:
        spec.build(job, table, nodes)
    assert (exc.value.variable, exc.value.host) == ("launch_extra_volumes", "node-2")
    assert volume in str(exc.value)


def test_bad_mode_is_refused():
    with pytest.raises(InventoryError) as exc:
        build("teleport")
    assert exc.value.variable == "launch_mode" and exc.value.host is None
    assert "teleport" in str(exc.value)


# --- placeholders ---------------------------------------------------------------------------

ARGS = ["--data", "{data_dir}", "--out={out_dir}", "--code={workload_dir}", "{unknown}", "{{x}}"]


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_placeholders_become_the_modes_paths(mode, runtime):
    built = build(mode, runtime, args=ARGS)
    p = paths(RUNTIME[(mode, runtime)])
    expected = ["--data", p["data"], f"--out={p['out']}", f"--code={p['workload']}", "{unknown}", "{{x}}"]
    for r in built.ranks:
        assert r.argv[-len(expected):] == expected
    for u in built.units:
        if u.role != "sshd":
            assert u.argv[-len(expected):] == expected, u.name
    assert ARGS[1] == "{data_dir}"  # the job's args are not changed in place


# --- check_job, new_run_id ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["", "a b", "-x", ".hidden", "a/b", "x" * 64, None, 7])
def test_check_job_refuses(name):
    with pytest.raises(InventoryError) as exc:
        inputs.check_job(name)
    assert exc.value.variable == "launch_job"


@pytest.mark.parametrize("name", ["mnist", "job_1.2", "A-b", "x" * 63])
def test_check_job_accepts(name):
    assert inputs.check_job(name) == name


def test_new_run_id_unique_across_100_calls():
    ids = [inputs.new_run_id() for _ in range(100)]
    assert len(set(ids)) == 100


def test_new_run_id_unique_within_one_second():
    """Two launches in the same second must not share a run id (it names containers and
    folders). With a 4-hex-digit suffix, 1000 ids in one second collide almost surely."""
    now = datetime(2024, 5, 1, 10, 15, 0, tzinfo=timezone.utc)
    ids = [inputs.new_run_id(now) for _ in range(1000)]
    assert len(set(ids)) == len(ids)


def test_new_run_id_sorts_by_time():
    base = datetime(2024, 9, 30, 23, 59, 59, tzinfo=timezone.utc)
    times = [base + timedelta(seconds=s) for s in (0, 1, 61, 3600, 86400 * 40, 86400 * 400)]
    ids = [inputs.new_run_id(t) for t in times]
    assert sorted(ids) == ids
    assert ids[0].startswith("20240930-235959-") and ids[1].startswith("20241001-000000-")
    later = inputs.new_run_id()
    assert later > inputs.new_run_id(datetime(2020, 1, 1, tzinfo=timezone.utc))


def test_new_run_id_is_a_valid_job_name():
    # It names containers and folders just as launch_job does.
    assert inputs.check_job(inputs.new_run_id())


# --- to_dict --------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_to_dict_round_trips_through_json(mode, runtime):
    built = build(mode, runtime, pinning=True, secret=SECRET, proxy_env=PROXY, args=ARGS)
    data = built.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["phases"] == [0, 1]
    assert data["phases"] == sorted({u["phase"] for u in data["units"]})
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2, 3]
    assert data["world_size"] == 4 and data["master_addr"] == MASTER_ADDR


def test_phases_of_a_single_node_job():
    job = {"run_id": RUN_ID, "job": JOB, "mode": "container", "image": IMAGE, "container_prefix": PREFIX,
           "command": [], "args": [], "workload_argv": ["python3", "mnist.py"], "guard": role_guard()}
    table = rank_table([{"name": "solo", "address": "10.0.0.50", "procs": 3}], PORT)
    parts = inputs.split_site_env(settings(), None, "solo")
    nodes = {"solo": {"address": "10.0.0.50", "interface": "eth0", "nproc": 6, "pinning": [],
                      "settings": settings(), "env_public": parts["public"], "env_shown": parts["shown"]}}
    built = spec.build(job, table, nodes)
    assert built.to_dict()["phases"] == [0]
    assert [r.threads for r in built.ranks] == [2, 2, 2]
    # No unit waits for MASTER_PORT: no deadline to listen, and no wait before the start says
    # the run started (a job whose ranks never open it, such as one rank alone, runs on).
    assert [u.listen for u in built.units] == [None, None, None]
    assert built.to_dict()["guard"]["units"][0]["listen"] is None
    assert built.transport == "tcp"


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_without_waiting_for_master_port_only_sshd_gates_a_phase(mode, runtime):
    """launch_wait_master_listen: false starts every rank at once, and nothing waits for
    MASTER_PORT (their stores retry until it listens); mpirun still starts once sshd listens."""
    job, table, nodes = make(mode, runtime)
    waiting = spec.build(job, table, nodes)
    eager = spec.build(dict(job, wait_master_listen=False), table, nodes)
    listens = lambda s: {(u.host, u.role): u.listen for u in s.units if u.listen}  # noqa: E731
    after = lambda s: {g["name"]: g["after"] for g in s.to_dict()["guard"]["units"] if g["after"]}  # noqa: E731
    if mode == "mpirun":
        assert listens(eager) == listens(waiting) and {r for _, r in listens(eager)} == {"sshd"}
        assert after(eager) == after(waiting) and [u.role for u in eager.units if u.phase] == ["mpirun"]
    else:
        role = "torchrun" if mode == "torchrun" else "rank"
        assert listens(waiting) == {("node-1", role): {"host": MASTER_ADDR, "port": PORT}}
        assert listens(eager) == {} and after(eager) == {} and {u.phase for u in eager.units} == {0}
        assert after(waiting) and all(u.phase == (u.host != "node-1") for u in waiting.units)


# --- the guard's settings -------------------------------------------------------------------


@pytest.mark.parametrize("guard, variable", [
    ({"port": PORT}, "launch_guard_port"),
    ({"port": 0}, "launch_guard_port"),
    ({"port": 70000}, "launch_guard_port"),
    ({"node_timeout": 0}, "launch_node_timeout"),
    ({"node_timeout": 0.5, "poll_interval": 0.5}, "launch_node_timeout"),
    ({"poll_interval": 0}, "launch_guard_poll_interval"),
    ({"stall_timeout": -1}, "launch_stall_timeout"),
    ({"timeout": -5}, "launch_timeout"),
    ({"stop_grace": -1}, "launch_stop_grace"),
])
def test_guard_settings_refuse_what_makes_no_sense(guard, variable):
    with pytest.raises(InventoryError) as err:
        build("container", guard=guard)
    assert err.value.variable == variable


def test_guard_settings_reach_every_guard():
    built = build("container", guard={"port": 31000, "node_timeout": 7, "stall_timeout": 30, "timeout": 600,
                                      "master_wait_timeout": 45})
    g = built.guard
    assert (g["store"]["port"], g["node_timeout"], g["stall_timeout"], g["job_timeout"]) == (31000, 7, 30, 600)
    # The master's allowance to listen is its guard's, for a run no controller follows too.
    assert (g["listen_timeout"], g["start_timeout"]) == (45, 45 + 7)


def test_numbers_out_of_range_are_each_named_with_their_bounds():
    checks = [{"name": "launch_timeout", "value": -1, "min": 0, "max": None, "why": " (0: no limit)"},
              {"name": "launch_guard_port", "value": "70000", "min": 1, "max": 65535},
              {"name": "launch_guard_poll_interval", "value": 0, "min": 0.05, "max": 60},
              {"name": "launch_keep_runs", "value": 3, "min": 1, "max": None},
              {"name": "launch_node_timeout", "value": "soon", "min": 1, "max": None}]
    assert inputs.out_of_range(checks) == [
        {"variable": "launch_timeout", "message": "launch_timeout=-1 must be at least 0 (0: no limit)"},
        {"variable": "launch_guard_port", "message": "launch_guard_port=70000 must be between 1 and 65535"},
        {"variable": "launch_guard_poll_interval",
         "message": "launch_guard_poll_interval=0 must be between 0.05 and 60"},
        {"variable": "launch_node_timeout", "message": "launch_node_timeout=soon must be at least 1"},
    ]


def _input_values(**over):
    values = {"launch_timeout": 0, "launch_poll_interval": 2, "launch_progress_interval": 30,
              "launch_master_wait_timeout": 120, "launch_guard_port": 29510, "launch_guard_poll_interval": 0.5,
              "launch_node_timeout": 10, "launch_stall_timeout": 0, "launch_stop_grace": 5, "launch_keep_runs": 10,
              "launch_omp_num_threads": "2", "launch_collect_out_max_mb": 1024, "launch_mode": "process",
              "launch_max_restarts": 0, "launch_min_nodes": 0, "launch_restart_backoff": 2, "launch_rejoin_timeout": 5,
              "launch_gloo_tls": "yes",
              "launch_tls_node_dir": "/etc/pki", "launch_ssh_port": "2222", "ssh_mesh_launcher": "node-1",
              "launch_proxy_env": {"https_proxy": "http://u:pw@proxy:3128"}, "launch_extra_env": {"A": 1},
              "launch_secret_env": {"TOKEN": "s3cret"}}
    values.update(over)
    return values


def test_node_input_reads_each_setting_from_its_variable_typed():
    got = inputs.node_input(_input_values(), "node-2")
    s = got["settings"]
    assert (s["omp_num_threads"], s["gloo_tls"], s["tls_node_dir"]) == (2, True, "/etc/pki")
    # A mode's own settings (mpirun's SSH mesh) are read under that mode only.
    assert "ssh_launcher" not in s and "ssh_port" not in s
    mesh = inputs.node_input(_input_values(launch_mode="mpirun"), "node-2")["settings"]
    assert (mesh["ssh_launcher"], mesh["ssh_port"]) == ("node-1", 2222)
    # The builder reads the same names as the settings the tests build by hand.
    assert set(mesh) == set(settings()) - {"proxy_env", "extra_env"}


def test_node_input_says_whether_the_ranks_run_bare_as_the_spec_decides_its_image():
    cases = {("process", "container"): True, ("torchrun", "process"): True, ("torchrun", "container"): False,
             ("container", "process"): False, ("mpirun", "process"): False}
    for (mode, runtime), bare in cases.items():
        got = inputs.node_input(_input_values(launch_mode=mode, launch_torchrun_runtime=runtime), "node-2")
        assert got["bare"] is bare, (mode, runtime)
        assert (modes.get(mode).runtime({"torchrun_runtime": runtime}) == "process") is bare
    # An unset runtime is the container's, as launch_torchrun_runtime's default.
    assert inputs.node_input(_input_values(launch_mode="torchrun"), "node-2")["bare"] is False


def test_node_input_keeps_secret_values_out_and_shows_them_masked():
    got = inputs.node_input(_input_values(), "node-2")
    assert got["has_secrets"] is True
    assert "s3cret" not in repr(got) and "pw@" not in repr(got)
    assert got["env_public"] == {"A": "1"}
    assert got["env_shown"]["TOKEN"] != "s3cret" and "***" in got["env_shown"]["https_proxy"]
    assert inputs.node_input(_input_values(launch_secret_env={}, launch_proxy_env={}), "n")["has_secrets"] is False


def test_node_input_names_every_bad_number_and_bad_secret_name_at_once():
    with pytest.raises(InventoryError) as err:
        inputs.node_input(_input_values(launch_keep_runs=0, launch_guard_poll_interval=0,
                                      launch_secret_env={"BAD NAME": "x"}), "node-3")
    assert (err.value.host, err.value.variable) == ("node-3", "launch_guard_poll_interval")
    assert "launch_keep_runs=0 must be at least 1" in str(err.value) and "BAD NAME" in str(err.value)


def test_every_variable_node_input_reads_is_a_role_default():
    defaults = (Path(__file__).parents[2] / "roles/launch/defaults/main.yml").read_text()
    launch_vars = [v for v in inputs.input_variables() if v.startswith("launch_")]
    assert [v for v in launch_vars if f"\n{v}:" not in defaults] == []


def test_node_entry_takes_the_interface_to_the_master_and_the_first_ranks_address():
    table = {"master_addr": "10.0.0.1", "master_host": "a", "ranks": [
        {"rank": 0, "host": "a", "address": "10.0.0.1"}, {"rank": 1, "host": "b", "address": "10.0.0.2"}]}
    ip_addr = [{"ifname": "eth1", "addr_info": [{"local": "10.0.0.2", "prefixlen": 24}]}]
    routes = [{"dst": "10.0.0.0/24", "dev": "eth1"}]
    checked = {"settings": {"python": "p"}, "env_public": {}, "env_shown": {}}
    b = spec.node_entry("b", table, "process", {"nproc": "8", "ip_addr": ip_addr, "routes": routes}, checked, None)
    assert (b["address"], b["interface"], b["nproc"], b["pinning"]) == ("10.0.0.2", "eth1", 8, [])
    # Only mpirun's master reads the network of its address (LaunchMode.node_facts).
    assert "mpi_network" not in b
    a_addr = [{"ifname": "eth0", "addr_info": [{"local": "10.0.0.1", "prefixlen": 24}]}]
    a = spec.node_entry("a", table, "mpirun", {"nproc": 4, "ip_addr": a_addr, "routes": []}, checked, [{"cpuset": "0"}])
    assert (a["interface"], a["mpi_network"], a["pinning"]) == ("eth0", "10.0.0.0/24", [{"cpuset": "0"}])
    with pytest.raises(InventoryError) as err:
        spec.node_entry("b", table, "process", {"nproc": 1, "ip_addr": [], "routes": []}, checked, None)
    assert err.value.host == "b"


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_unit_index_gives_each_host_its_own_units(mode, runtime):
    units = build(mode, runtime).to_dict()["units"]
    index = spec.unit_index(units)
    assert sorted(i for ids in index.values() for i in ids) == list(range(len(units)))
    for host, ids in index.items():
        assert all(units[i]["host"] == host for i in ids)
    assert spec.listen_hosts(units) == sorted({u["host"] for u in units if u["listen"]})


@pytest.mark.parametrize("mode, runtime", MODES, ids=MODE_IDS)
def test_each_unit_of_a_later_phase_starts_after_every_earlier_unit_that_listens(mode, runtime):
    """What each guard waits for before it starts its unit (the controller starts them all
    at once): a unit of phase 0 for nothing, any other for every listener of phase 0."""
    built = build(mode, runtime)
    units = built.to_dict()["guard"]["units"]
    listeners = [i for i, u in enumerate(built.units) if u.listen]
    assert listeners and all(built.units[i].phase == 0 for i in listeners)
    for unit, guarded in zip(built.units, units):
        assert guarded["after"] == ([] if unit.phase == 0 else listeners)
        assert guarded["listen"] == unit.listen


def test_node_input_checks_the_overlays_numbers_only_under_wireguard():
    overlay = {"launch_transport": "wireguard", "launch_overlay_interface": "tfwg0", "launch_master_port": 29500,
               "launch_overlay_probe_port": 29501, "launch_overlay_probe_timeout": 3,
               "launch_overlay_handshake_max_age": 180}
    assert inputs.node_input(_input_values(**overlay), "n")["overlay_interface"] == "tfwg0"
    assert inputs.node_input(_input_values(**{**overlay, "launch_transport": "tcp", "launch_overlay_probe_port": 0}),
                           "n")["overlay_interface"] == ""
    for bad, variable in (({"launch_overlay_probe_port": 29500}, "launch_overlay_probe_port"),
                          ({"launch_overlay_probe_port": 70000}, "launch_overlay_probe_port"),
                          ({"launch_overlay_probe_timeout": 0}, "launch_overlay_probe_timeout"),
                          ({"launch_overlay_handshake_max_age": 0}, "launch_overlay_handshake_max_age")):
        with pytest.raises(InventoryError) as err:
            inputs.node_input(_input_values(**{**overlay, **bad}), "node-2")
        assert (err.value.host, err.value.variable) == ("node-2", variable)


# --- the memory allocator (launch_malloc) -------------------------------------------------------


def _rank_envs(s):
    """What each rank's own process sees: its RankSpec env, and under mpirun its node.env."""
    envs = [r.env for r in s.ranks]
    if s.mode == "mpirun":
        envs += [node_env(files["node.env"]) for files in s.files.values() if "node.env" in files]
    return envs


@pytest.mark.parametrize(("mode", "runtime"), MODES, ids=MODE_IDS)
@pytest.mark.parametrize("malloc", ["tcmalloc", "jemalloc"])
def test_every_mode_preloads_the_chosen_allocator_in_every_rank(mode, runtime, malloc):
    s = build(mode, runtime, malloc=malloc)
    library = {"tcmalloc": "libtcmalloc.so.4", "jemalloc": "libjemalloc.so.2"}[malloc]
    for env in _rank_envs(s):
        assert env["LD_PRELOAD"] == library
        assert ("MALLOC_CONF" in env) == (malloc == "jemalloc")
    # The unit that starts the ranks carries it too (torchrun's agent, the rank's container).
    assert all(u.env.get("LD_PRELOAD") == library for u in s.units if u.role in ("rank", "torchrun"))


@pytest.mark.parametrize(("mode", "runtime"), MODES, ids=MODE_IDS)
def test_the_default_allocator_preloads_nothing(mode, runtime):
    s = build(mode, runtime, malloc="default")
    assert not any("LD_PRELOAD" in env or "MALLOC_CONF" in env for env in _rank_envs(s))


def test_a_sites_own_preload_and_malloc_conf_are_kept():
    s = build("container", extra_env={"LD_PRELOAD": "/opt/lib/libhook.so", "MALLOC_CONF": "narenas:2"},
              malloc="jemalloc")
    env = s.ranks[0].env
    assert env["LD_PRELOAD"] == "libjemalloc.so.2:/opt/lib/libhook.so" and env["MALLOC_CONF"] == "narenas:2"


def test_node_input_reads_launch_malloc():
    assert inputs.node_input(_input_values(launch_malloc="jemalloc"), "node-2")["settings"]["malloc"] == "jemalloc"


@pytest.mark.parametrize("bare", [True, False])
def test_a_node_without_the_allocator_is_refused_naming_the_variable(bare):
    table = {"master_port": 29500, "master_addr": "10.0.0.1", "master_host": "node-1"}
    kw = dict(bare=bare, runtime="/opt/venv/bin/python" if bare else "train:1", job="j", replace=False)
    missing = {"libtcmalloc.so.4": None}
    checks = preflight.node_checks("node-2", {}, True, [], table, settings={"malloc": "tcmalloc"}, planning=False,
                              libraries=missing, **kw)
    failed = [c for c in checks if not c["that"]]
    assert [c["variable"] for c in failed] == ["launch_malloc"]
    assert "libtcmalloc.so.4" in failed[0]["msg"] and "libgoogle-perftools4" in failed[0]["msg"]
    assert ("launch_python" if bare else "launch_image train:1") in failed[0]["msg"]
    found = {"libtcmalloc.so.4": "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4"}
    assert all(c["that"] for c in preflight.node_checks("node-2", {}, True, [], table, settings={"malloc": "tcmalloc"},
                                                   planning=False, libraries=found, **kw))
    # A plan reports, and a node without the runtime is left to the runtime's own check.
    assert all(c["that"] for c in preflight.node_checks("node-2", {}, True, [], table, settings={"malloc": "tcmalloc"},
                                                   planning=True, libraries=missing, **kw))
    assert not [c for c in preflight.node_checks("node-2", {}, False, [], table, settings={"malloc": "tcmalloc"},
                                            planning=False, libraries=None, **kw) if c["variable"] == "launch_malloc"]
