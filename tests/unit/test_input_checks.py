"""Issue 43 (inputs, success shown as failure) and issue 39's run id: what is refused before
any node is touched, and how it is said.

The CLI tests here run the real playbooks against an inventory whose hosts are TEST-NET
addresses (RFC 5737) that nothing answers: an exit of 2 with its message shows the refusal
came from the controller's own check, since reaching for any node would have ended
unreachable (exit 3)."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from torchfleet import hosts, inputs
from torchfleet.api import Failure, input_error
from torchfleet.errors import InventoryError
from torchfleet.progress import summary_line

ROOT = Path(__file__).resolve().parents[2]
TORCHFLEET = str(Path(sys.executable).parent / "torchfleet")


# --- finding 2: the group --------------------------------------------------------------------


def test_a_missing_group_is_named_with_the_groups_found():
    with pytest.raises(InventoryError) as info:
        hosts.group_hosts({"all": ["a"], "ungrouped": [], "workers": ["a"], "gpu": []}, "torchfleet_nodes")
    assert info.value.variable == "launch_hosts_group"
    assert "the inventory has no group torchfleet_nodes" in info.value.message
    assert info.value.message.endswith("the groups found: gpu, workers")


def test_an_empty_group_says_it_is_empty():
    with pytest.raises(InventoryError, match="the inventory's group torchfleet_nodes has no hosts"):
        hosts.group_hosts({"all": [], "torchfleet_nodes": []}, "torchfleet_nodes")
    assert hosts.group_hosts({"torchfleet_nodes": ["n1", "n2"]}, "torchfleet_nodes") == ["n1", "n2"]


# --- finding 1: two names for one machine ----------------------------------------------------------


def targets(**variables):
    return {h: hosts.connection_target(h, v) for h, v in variables.items()}


def test_two_hosts_at_one_address_and_port_are_refused_naming_both():
    with pytest.raises(InventoryError) as info:
        hosts.refuse_shared_targets(targets(**{"node-1": {"ansible_host": "192.0.2.1"},
                                               "node-2": {"ansible_host": "192.0.2.2"},
                                               "node-3": {"ansible_host": "192.0.2.2", "ansible_port": 22}}))
    assert info.value.hosts == ["node-2", "node-3"] and info.value.variable == "ansible_host"
    assert info.value.message.startswith("hosts node-2, node-3: connect to one machine (ssh to 192.0.2.2 port 22)")


def test_a_name_is_compared_by_the_address_it_resolves_to():
    with pytest.raises(InventoryError, match="hosts a, b: connect to one machine"):
        hosts.refuse_shared_targets(targets(a={"ansible_host": "localhost"}, b={"ansible_host": "127.0.0.1"}))


def test_one_address_with_two_ports_is_two_machines_and_local_connections_are_one():
    hosts.refuse_shared_targets(targets(a={"ansible_host": "192.0.2.1", "ansible_port": 2201},
                                        b={"ansible_host": "192.0.2.1", "ansible_port": 2202}))
    with pytest.raises(InventoryError, match="hosts a, b: connect to one machine \\(local to this controller\\)"):
        hosts.refuse_shared_targets(targets(a={"ansible_connection": "local"}, b={"ansible_connection": "local"}))


# Two docker hosts on one kernel share the boot id, and from one image the machine-id too
# (the local cluster's nodes do): only the network namespace tells them apart.
DOCKER_1 = {"boot_id": "b1", "machine_id": "m-image", "netns": "4026532001"}
DOCKER_2 = {"boot_id": "b1", "machine_id": "m-image", "netns": "4026532002"}


def test_containers_on_one_kernel_are_distinct_machines():
    hosts.refuse_same_identity({"node-1": DOCKER_1, "node-2": DOCKER_2})
    assert hosts.same_identity_checks({"node-1": DOCKER_1, "node-2": DOCKER_2}) == []


def test_two_names_whose_nodes_report_one_identity_are_refused():
    with pytest.raises(InventoryError) as info:
        hosts.refuse_same_identity({"node-1": DOCKER_1, "node-2": DOCKER_2, "node-3": dict(DOCKER_2)})
    assert info.value.hosts == ["node-2", "node-3"]
    assert info.value.message.startswith("hosts node-2, node-3: are one machine")
    checks = hosts.same_identity_checks({"node-1": DOCKER_1, "node-2": DOCKER_2, "node-3": dict(DOCKER_2)})
    assert [(c["host"], c["that"], c["variable"]) for c in checks] == [("node-2", False, "ansible_host"),
                                                                        ("node-3", False, "ansible_host")]


def test_a_node_that_cannot_say_is_not_taken_for_another():
    hosts.refuse_same_identity({"a": {"boot_id": "", "netns": ""}, "b": {"boot_id": "", "netns": ""}, "c": None})


# --- issue 39, item 4: the run id ----------------------------------------------------------------


@pytest.mark.parametrize("run_id", ["../x", "a b", "x" * 200, "", ".", "..", "a/b", "-rf", 7])
def test_a_run_id_that_is_not_a_plain_name_is_refused_naming_launch_run_id(run_id):
    with pytest.raises(InventoryError) as info:
        inputs.check_run_id(run_id)
    assert info.value.variable == "launch_run_id" and len(info.value.message) < 200


def test_generated_and_plain_run_ids_pass():
    for run_id in (inputs.new_run_id(), "cli-ok", "taken", "r1.2_b", "x" * 64):
        assert inputs.check_run_id(run_id) == run_id


# --- finding 4: an input error is said once ------------------------------------------------------


def test_an_input_error_of_every_node_is_one_sentence_naming_the_hosts():
    sentence = "launch_poll_interval=0 must be between 0.1 and 3600"
    failures = [Failure(host=h, task="Check the launch's input", message=f"host {h}: {sentence}", kind="input",
                        variable="launch_poll_interval") for h in ("node-1", "node-2", "node-3")]
    error = input_error(failures)
    assert error.message == f"hosts node-1, node-2, node-3: {sentence}"
    assert error.hosts == ["node-1", "node-2", "node-3"] and error.variable == "launch_poll_interval"


def test_different_sentences_each_keep_their_hosts_and_an_error_about_no_host_has_none():
    failures = [Failure(host="node-1", task="t", message="host node-1: a is wrong", kind="input"),
                Failure(host="node-2", task="t", message="host node-2: b is wrong", kind="input"),
                Failure(host="node-3", task="t", message="host node-3: a is wrong", kind="input")]
    assert input_error(failures).message == "hosts node-1, node-3: a is wrong; host node-2: b is wrong"
    error = input_error([Failure(host=None, task="t", message="launch_job='' must be ...", kind="input")])
    assert error.message == "launch_job='' must be ..." and error.hosts == []


# --- finding 7: only failures are red ----------------------------------------------------------


def result(status, interrupted=None, failed=0):
    return SimpleNamespace(ok=status == "successful", interrupted=interrupted, duration_s=3.0,
                           hosts={"node-1": SimpleNamespace(changed=1, failed=failed, unreachable=0)})


def test_a_done_or_interrupted_command_never_says_failed_nor_shows_red():
    for line in (summary_line("stop r1", result("successful")), summary_line("attach r1", result("canceled", 2))):
        assert "failed" not in line and "red" not in line and "✗" not in line
    assert summary_line("attach r1", result("canceled", 2)).startswith("[yellow]")
    assert summary_line("up", result("failed", failed=1)).startswith("[red]✗[/]")
    assert "1 failed" in summary_line("up", result("failed", failed=1))


# --- the command, against hosts that nothing answers ---------------------------------------------


def torchfleet(tmp_path, inventory, *args, json_out=True):
    path = tmp_path / "hosts.yml"
    path.write_text(inventory)
    env = dict(os.environ, TORCHFLEET_RUNS_DIR=str(tmp_path / "runs"), TORCHFLEET_PROJECT=str(ROOT))
    done = subprocess.run([TORCHFLEET, args[0], "-i", str(path), *(["--json"] if json_out else []), *args[1:]],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    return done.returncode, json.loads(done.stdout) if json_out else done.stdout, done.stderr


NODES = "torchfleet_nodes:\n  hosts:\n    node-1: {ansible_host: 192.0.2.1}\n    node-2: {ansible_host: 192.0.2.2}\n"


def test_an_inventory_without_the_group_exits_2_naming_the_groups_found(tmp_path):
    code, out, _ = torchfleet(tmp_path, "workers:\n  hosts:\n    node-1: {ansible_host: 192.0.2.1}\n", "plan")
    assert code == 2 and out["error"]["variable"] == "launch_hosts_group"
    message = out["error"]["message"]
    assert "no group torchfleet_nodes" in message and "the groups found: workers" in message


@pytest.mark.parametrize("command", ["plan", "launch", "up"])
def test_two_hosts_at_one_address_exit_2_naming_both_after_the_warnings(tmp_path, command):
    inventory = ("torchfleet_nodes:\n  vars: {command: [python3, t.py], rank: 0}\n  hosts:\n"
                 "    node-1: {ansible_host: 192.0.2.1}\n    node-2: {ansible_host: 192.0.2.2}\n"
                 "    node-3: {ansible_host: 192.0.2.2, sgx_aesm_socket: true}\n")
    code, out, stderr = torchfleet(tmp_path, inventory, command)
    assert code == 2 and out["error"]["variable"] == "ansible_host" and out["error"]["hosts"] == ["node-2", "node-3"]
    meant = {w["variable"]: (w["hosts"], w["meant"]) for w in out["warnings"]}
    assert meant == {"command": (["node-1", "node-2", "node-3"], "launch_command"),
                     "rank": (["node-1", "node-2", "node-3"], "torchfleet_node_rank"),
                     "sgx_aesm_socket": (["node-3"], "launch_sgx_aesm_socket")}
    assert "did you mean launch_command?" in stderr
    code, text, stderr = torchfleet(tmp_path, inventory, command, "-q", json_out=False)
    assert code == 2 and stderr.index("did you mean launch_command?") < stderr.index("error")


@pytest.mark.parametrize("args", [["launch", "--run-id", "../x"], ["launch", "--run-id", "a b"],
                                  ["plan", "--run-id", "r" * 200], ["stop", "../x"], ["attach", "a b"],
                                  ["launch", "-e", "launch_run_id=../x"], ["runs", "-e", "launch_run_id=x/y"]])
def test_a_bad_run_id_exits_2_naming_launch_run_id_wherever_it_enters(tmp_path, args):
    code, out, _ = torchfleet(tmp_path, NODES, *args)
    assert code == 2 and out["error"]["variable"] == "launch_run_id", out
    assert not (tmp_path / "runs").exists()


def test_the_inventory_is_checked_first_also_when_a_launch_runs_its_check_alone(tmp_path):
    """launch.yml --tags check: a bad run id fails on the controller, naming the variable,
    and no node is contacted (those of NODES do not exist: TEST-NET addresses)."""
    path = tmp_path / "hosts.yml"
    path.write_text(NODES)
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(ROOT / "playbooks" / "launch.yml"),
                           "-i", str(path), "--tags", "check", "-e", "launch_run_id=../x"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=dict(os.environ, TORCHFLEET_RUNS_DIR=str(tmp_path / "runs")))
    assert done.returncode != 0
    assert "launch_run_id='../x' must be" in done.stdout + done.stderr
    assert "UNREACHABLE" not in done.stdout and "node-1" not in done.stdout.split("PLAY RECAP")[-1]


def test_an_input_error_is_said_once_without_ansibles_task_unless_verbose(tmp_path):
    inventory = NODES.replace("192.0.2.2}", "192.0.2.1}")
    code, _, stderr = torchfleet(tmp_path, inventory, "plan", json_out=False)
    assert code == 2 and stderr.count("connect to one machine") == 1
    assert "Warn about variables" not in stderr and "✗ node" not in stderr
    code, _, stderr = torchfleet(tmp_path, inventory, "plan", "-v", json_out=False)
    assert code == 2 and "task Warn about variables" in stderr


def test_a_node_reports_its_kernels_boot_and_its_network_namespace():
    from ansible_collections.torchfleet.cluster.plugins.modules.node_probe import identity

    found = identity()
    assert found["boot_id"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert os.readlink("/proc/self/ns/net") == f"net:[{found['netns']}]"
    assert hosts.identity_key(found) == hosts.identity_key(identity())


def test_the_hosts_of_an_input_error_come_in_the_nodes_order_not_the_events():
    failures = [Failure(host=h, task="t", message=f"host {h}: a is wrong", kind="input")
                for h in ("node-10", "node-2", "node-1")]
    assert input_error(failures).message == "hosts node-1, node-2, node-10: a is wrong"
    assert input_error(failures).host == "node-1"


@pytest.mark.parametrize("host_vars, master", [
    ({"node-1": {}, "node-2": {}, "node-3": {}}, "node-1"),
    ({"node-1": {"torchfleet_node_rank": 2}, "node-2": {"torchfleet_node_rank": "{{ 1 - 1 }}"},
      "node-3": {"torchfleet_node_rank": 1}}, "node-2"),
    ({"node-1": {"torchfleet_node_rank": 0}, "node-2": {}, "node-3": {}}, None),
])
def test_the_inventory_check_names_the_master_that_a_status_or_a_stop_asks_first(tmp_path, host_vars, master):
    """The status and stop playbooks ask the node that a launch makes the master first; the
    inventory's check adds it to the group they read, or none where the node ranks cannot
    say, and the master's play then has only the controller. Naming it changes nothing."""
    (tmp_path / "hosts.yml").write_text(json.dumps({"torchfleet_nodes": {"hosts": {
        h: {"ansible_host": f"192.0.2.{i}", **v} for i, (h, v) in enumerate(host_vars.items(), 1)}}}))
    book = tmp_path / "book.yml"
    book.write_text(f"- import_playbook: {ROOT / 'playbooks' / 'inventory.yml'}\n"
                    "  vars: {launch__master_group: torchfleet_run_master}\n"
                    "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
                    "    - debug: {msg: \"MASTER={{ groups.torchfleet_run_master | default(['none']) | join(',') }}\"}\n")
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(book), "-i", str(tmp_path / "hosts.yml")],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-2000:]
    assert f"MASTER={master or 'none'}\n" in done.stdout
    assert "changed=0" in done.stdout.split("PLAY RECAP")[-1]
