"""The Python API against real docker hosts: plan, provision, launch, logs, down."""

import hashlib
import ipaddress
import os

import pytest

import torchfleet
from torchfleet import HostUnreachable, InventoryError, Job, JobFailed, TaskFailed

from .conftest import SUBNET, node_sh

FAST_JOB = Job(args=["--epoch", "1", "--seed", "42", "--no-cuda", "--save-model", "--log-interval", "2"])


def test_plan_gives_each_rank_its_address_interface_and_env_and_changes_nothing(cluster):
    events = []
    watching = torchfleet.Cluster(cluster.inventory, runs_dir=cluster.runs_dir, env=cluster.env, progress=events.append)
    plan = watching.plan()

    assert [r.host for r in plan.ranks] == ["node-1", "node-2"]
    assert [r.rank for r in plan.ranks] == [0, 1]
    assert plan.world_size == 2 and plan.launch_mode == "container"
    assert plan.master_addr == plan.ranks[0].address and plan.master_port == 29500
    assert plan.master == f"{plan.ranks[0].address}:29500"
    for r in plan.ranks:
        assert ipaddress.ip_address(r.address) in ipaddress.ip_network(SUBNET)
        assert r.interface == "eth0"
        assert r.env["RANK"] == str(r.rank) and r.env["WORLD_SIZE"] == "2"
        assert r.env["MASTER_ADDR"] == plan.master_addr and r.env["GLOO_SOCKET_IFNAME"] == "eth0"
        assert r.env["OMP_NUM_THREADS"] == str(r.omp_num_threads)

    stats = next(e["event_data"] for e in events if e.get("event") == "playbook_on_stats")
    assert stats["changed"] == {} and stats["failures"] == {}
    assert node_sh("node-1", f"ls /var/lib/torchfleet/runs 2>/dev/null | grep -c {plan.run_id} || true").strip() == "0"


@pytest.mark.parametrize(
    "host_vars, extra_vars, host, variable, text",
    [
        ({"node-1": 0, "node-2": 0}, {}, "node-2", "torchfleet_node_rank", "is also set on node-1"),
        ({"node-1": 1, "node-2": 2}, {}, None, "torchfleet_node_rank", "no master"),
        ({}, {"torchfleet_procs_per_node": 0}, "node-1", "torchfleet_procs_per_node", "must be >= 1"),
        ({}, {"launch_master_port": 70000}, None, "launch_master_port", "is not a TCP port"),
        ({}, {"launch_mode": "teleport"}, None, "launch_mode", "must be one of"),
        ({}, {"launch_extra_env": {"GLOO_TCP_IFACE": "eth0"}}, None, "launch_extra_env", "GLOO_TCP_IFACE"),
    ],
    ids=["duplicate-rank", "no-master", "zero-procs", "bad-port", "bad-mode", "gloo-tcp-iface"],
)
def test_plan_names_the_host_and_variable_of_bad_input(cluster, tmp_path, host_vars, extra_vars, host, variable, text):
    inventories = list(cluster.inventory)
    if host_vars:
        extra = tmp_path / "ranks.yml"
        extra.write_text("all:\n  hosts:\n" + "".join(
            f"    {h}: {{torchfleet_node_rank: {r}}}\n" for h, r in host_vars.items()))
        inventories.append(extra)
    bad = torchfleet.Cluster(inventories, extra_vars=extra_vars, env=cluster.env, progress=False)
    with pytest.raises(InventoryError) as info:
        bad.plan()
    error = info.value
    assert error.variable == variable
    assert text in str(error)
    assert error.host in ({host} if host else {"node-1", "node-2"})
    # Input every node fails alike (an -e) is said once, naming both (issue 43, finding 4).
    assert str(error).startswith(f"host {error.host}:") or (
        str(error).startswith("hosts node-1, node-2: ") and error.hosts == ["node-1", "node-2"])
    assert error.task


def test_an_unreachable_node_raises_host_unreachable(cluster, tmp_path):
    ghost = tmp_path / "ghost.yml"
    # An address inside the test network that no container has.
    ghost.write_text("all:\n  children:\n    torchfleet_nodes:\n      hosts:\n"
                     "        ghost: {ansible_host: 172.29.6.250, ansible_ssh_common_args: '-o ConnectTimeout=3'}\n")
    with pytest.raises(HostUnreachable) as info:
        torchfleet.Cluster(ghost, env=cluster.env, progress=False).plan()
    assert info.value.host == "ghost"
    assert isinstance(info.value, TaskFailed)
    assert "ghost" in str(info.value)


def test_provision_reports_each_host_and_a_second_run_changes_nothing(provisioned):
    _, first, (code, second) = provisioned
    assert set(first.hosts) == {"node-1", "node-2"}
    assert all(h.failed == 0 and h.unreachable == 0 for h in first.hosts.values())
    assert all(h.changed > 0 for h in first.hosts.values())
    # The second run, through the CLI: exit 0, and a document in which no host changed.
    assert code == 0 and second["ok"] and set(second["result"]["hosts"]) == {"node-1", "node-2"}
    assert second["result"]["changed"] == 0, second["result"]["hosts"]


def test_launch_runs_the_job_end_to_end_and_reports_every_rank(provisioned):
    cluster = provisioned[0]
    run = cluster.launch(FAST_JOB)

    assert run.ok and run.failed_rank is None
    assert [(r.rank, r.host, r.exit_code, r.outcome) for r in run.ranks] == [
        (0, "node-1", 0, "ok"), (1, "node-2", 0, "ok")]
    for r in run.ranks:
        assert r.duration_s > 0 and r.steps > 0 and isinstance(r.last_loss, float)
        assert "Train Epoch: 1" in r.log()
    assert run.checksums_equal
    with open(run.loss_plot, "rb") as png:
        assert png.read(8) == b"\x89PNG\r\n\x1a\n"
    assert run.model and run.model.endswith("model.pt")

    assert cluster.report(run.run_id) == run
    logs = cluster.logs(run.run_id)
    assert sorted(logs) == [0, 1] and all("Parameter checksum" in text for text in logs.values())
    assert list(cluster.logs(rank=1)) == [1]


def test_a_failing_rank_raises_job_failed_naming_it(provisioned, crashing_workload):
    cluster = provisioned[0]
    with pytest.raises(JobFailed) as info:
        cluster.launch(Job(workload=crashing_workload, args=[]))
    error = info.value
    assert error.rank == 1 and error.host == "node-2"
    assert error.task == "Write the summary and fail naming the rank that broke the run"
    assert "rank 1 on node-2 exited with code 3" in error.message
    assert "simulated crash" in error.message
    assert {r.rank: r.outcome for r in error.run.ranks} == {0: "stopped", 1: "failed"}
    # Rank 0 sat in a sleep, in no collective: its guard stopped it, and says why.
    assert error.run.ranks[0].stopped_because == "rank 1 on node-2 exited with code 3"
    assert "[torchfleet guard] stopped rank 0 on node-1" in error.run.ranks[0].log()
    assert isinstance(error, TaskFailed)
    assert node_sh("node-1", "docker ps -aq --filter label=torchfleet.run") == ""


def test_down_removes_every_rank_left_on_the_nodes(provisioned):
    cluster = provisioned[0]
    node_sh("node-2", "docker run -d --label torchfleet.run=stray --label torchfleet.rank=0 "
                      "torchfleet/train:2.13.0-cpu sleep 600")
    assert node_sh("node-2", "docker ps -q --filter label=torchfleet.run") != ""
    result = cluster.down()
    assert result.hosts["node-2"].changed == 1 and result.hosts["node-1"].changed == 0
    assert node_sh("node-2", "docker ps -aq --filter label=torchfleet.run") == ""


def test_a_workload_folder_is_mirrored_to_every_node(provisioned, tmp_path):
    cluster = provisioned[0]
    folder = tmp_path / "project"
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "__init__.py").write_text("")
    (folder / "pkg" / "train.py").write_text(
        "import os, sys\nfrom pkg.helper import NAME\n"
        "print(f'{NAME} rank {os.environ[\"RANK\"]} of {os.environ[\"WORLD_SIZE\"]} in {os.getcwd()}', flush=True)\n")
    (folder / "pkg" / "helper.py").write_text("NAME = 'helper-module'\n")
    (folder / "old.py").write_text("")
    (folder / ".git").mkdir()
    (folder / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (folder / "scratch").mkdir()
    (folder / "scratch" / "big.bin").write_text("x")
    (folder / ".torchfleetignore").write_text("# local only\nscratch/\n")
    job = Job(workload=folder, entrypoint="-m pkg.train", name="mirror", args=[])
    listing = "cd /var/lib/torchfleet/workloads/mirror && find . -type f | sort"

    run = cluster.launch(job)
    assert run.ok and all("helper-module rank" in r.log() for r in run.ranks)
    assert "in /workload" in run.ranks[1].log()
    for node in ("node-1", "node-2"):
        assert node_sh(node, listing).split() == ["./old.py", "./pkg/__init__.py", "./pkg/helper.py", "./pkg/train.py"]

    # A change to an ignored file alone sends nothing again.
    copied = node_sh("node-2", "stat -c %Y /var/lib/torchfleet/workloads/mirror.tar")
    (folder / "scratch" / "big.bin").write_text("changed, but ignored")
    assert cluster.launch(job).ok
    assert node_sh("node-2", "stat -c %Y /var/lib/torchfleet/workloads/mirror.tar") == copied

    # A file removed is removed on the nodes; over 1 MiB the tar goes ahead of the call
    # instead of inside it, and the same folder lands.
    (folder / "old.py").unlink()
    blob = os.urandom(3 << 19)
    (folder / "weights.bin").write_bytes(blob)
    assert cluster.launch(job).ok
    assert node_sh("node-2", listing).split() == ["./pkg/__init__.py", "./pkg/helper.py", "./pkg/train.py", "./weights.bin"]
    assert node_sh("node-1", "sha256sum /var/lib/torchfleet/workloads/mirror/weights.bin").split()[0] == \
        hashlib.sha256(blob).hexdigest()
