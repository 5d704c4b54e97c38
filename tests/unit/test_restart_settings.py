"""The restart settings (issue 40): their defaults and ranges, the launch modes that refuse
restarts, launch_min_nodes against the launch's nodes, and the checkpoint folder of the run's
own that every node gets with restarts on and no launch_checkpoint_dir. The spec is built
through the launch_spec action, as check.yml builds it."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task

from ansible_collections.torchfleet.cluster.plugins.action import launch_spec
from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab
from ansible_collections.torchfleet.cluster.plugins.module_utils.out_folder import listing
from ansible_collections.torchfleet.cluster.plugins.plugin_utils.core import check_role_types
from harness.inputs import LAUNCH_RENDERED, launch_values, role_guard
from torchfleet import inputs, outputs
from torchfleet.errors import InventoryError
from torchfleet.ranks import rank_table

ROLE = Path(__file__).resolve().parents[2] / "roles" / "launch"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
OPTIONS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
CHECK = yaml.safe_load((ROLE / "tasks" / "check.yml").read_text())
RUN_ID = "20261127-120000-cafe"
NODE_DIR = "/srv/tfnode"
HOSTS = [("node-1", "10.0.0.11"), ("node-2", "10.0.0.12"), ("node-3", "10.0.0.13")]
# The role's required values, which argument_specs checks with the others.
REQUIRED = {k: v for k, v in LAUNCH_RENDERED.items() if OPTIONS[k].get("required")}
# What each restart variable must be by default (issue 40), and its key in the spec's guard block.
RESTART = {"launch_max_restarts": ("max_restarts", 0), "launch_min_nodes": ("min_nodes", 0),
           "launch_restart_backoff": ("restart_backoff", 2), "launch_rejoin_timeout": ("rejoin_timeout", 5),
           "launch_checkpoint_shared": ("checkpoint_shared", False)}


def launch(mode="container", guard=None, hosts=HOSTS, **over):
    """The launch_spec action's result for ``hosts``, one rank each, every node's input
    checked by node_input from the role's values and ``over``."""
    table = rank_table([{"name": h, "address": a} for h, a in hosts], 29500)
    hostvars = {}
    for host, address in hosts:
        checked = inputs.node_input(launch_values(**{"launch_mode": mode, "launch_node_dir": NODE_DIR, **over}), host)
        checked["pinning"] = {"enabled": False}
        probe = {"identity": None, "nproc": 4, "routes": [{"dst": "10.0.0.0/24", "dev": "eth0"}],
                 "ip_addr": [{"ifname": "eth0", "addr_info": [{"local": address, "prefixlen": 24}]}]}
        hostvars[host] = {"launch__input": checked, "launch__node_state": probe}
    task = Task()
    task.args = {"hosts": [h for h, _ in hosts], "group": [h for h, _ in hosts], "table": table,
                 "job": {"run_id": RUN_ID, "job": "mnist", "mode": mode, "transport": "tcp", "image": "train:1",
                         "torchrun_runtime": "container", "container_prefix": "tf", "command": [], "args": [],
                         "workload_argv": ["python3", "mnist.py"], "wait_master_listen": True,
                         "guard": dict(role_guard(), **(guard or {}))}}
    action = launch_spec.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp")), PlayContext(),
                                      None, None, None)
    return action.run(task_vars={"inventory_hostname": hosts[0][0], "hostvars": hostvars})


def refusal(result):
    assert result.get("failed"), result
    return result["torchfleet_error"]["variable"], result["msg"]


# --- defaults and argument specs ---------------------------------------------------------------

def test_the_defaults_keep_todays_behaviour_and_the_argument_spec_says_the_same():
    for variable, (_, default) in RESTART.items():
        assert DEFAULTS[variable] == default, variable
        assert OPTIONS[variable]["default"] == default, variable
    assert {OPTIONS[v]["type"] for v in ("launch_max_restarts", "launch_min_nodes")} == {"int"}
    assert {OPTIONS[v]["type"] for v in ("launch_restart_backoff", "launch_rejoin_timeout")} == {"float"}
    assert OPTIONS["launch_checkpoint_shared"]["type"] == "bool"


def test_check_yml_hands_every_restart_setting_to_the_spec_under_its_guard_key():
    [task] = [t for t in CHECK if "torchfleet.cluster.launch_spec" in t]
    guard = task["torchfleet.cluster.launch_spec"]["job"]["guard"]
    for variable, (key, _) in RESTART.items():
        assert variable in guard[key], key


@pytest.mark.parametrize("variable, value", [
    ("launch_max_restarts", "1.5"), ("launch_max_restarts", "often"), ("launch_min_nodes", "two"),
    ("launch_restart_backoff", "soon"), ("launch_checkpoint_shared", "perhaps")])
def test_a_value_of_the_wrong_type_is_refused_naming_its_variable(variable, value):
    with pytest.raises(InventoryError) as err:
        check_role_types(OPTIONS, {**REQUIRED, variable: value}, "node-2")
    assert (err.value.host, err.value.variable) == ("node-2", variable)


@pytest.mark.parametrize("variable, value, bound", [
    ("launch_max_restarts", -1, "between 0 and 1000"), ("launch_max_restarts", 1001, "between 0 and 1000"),
    ("launch_min_nodes", -1, "at least 0"), ("launch_restart_backoff", 3601, "between 0 and 3600"),
    ("launch_rejoin_timeout", -0.5, "between 0 and 3600")])
def test_a_number_out_of_range_is_refused_on_its_node_naming_the_variable(variable, value, bound):
    with pytest.raises(InventoryError) as err:
        inputs.node_input(launch_values(**{variable: value}), "node-3")
    assert (err.value.host, err.value.variable) == ("node-3", variable)
    assert f"{variable}={value} must be {bound}" in str(err.value)


def test_the_bounds_themselves_pass():
    inputs.node_input(launch_values(launch_max_restarts=1000, launch_restart_backoff=0, launch_rejoin_timeout=3600,
                                    launch_min_nodes=64), "node-1")


def test_shared_checkpoints_without_a_checkpoint_folder_are_refused():
    with pytest.raises(InventoryError) as err:
        inputs.node_input(launch_values(launch_checkpoint_shared=True), "node-1")
    assert (err.value.host, err.value.variable) == ("node-1", "launch_checkpoint_shared")
    checked = inputs.node_input(launch_values(launch_checkpoint_shared="yes", launch_checkpoint_dir="/nfs/ckpt"), "n")
    assert checked["settings"]["checkpoint_dir"] == "/nfs/ckpt"


# --- launch_min_nodes against the launch's nodes -----------------------------------------------

@pytest.mark.parametrize("given, nodes, count", [(0, 3, 3), (1, 3, 1), (3, 3, 3), ("2", 3, 2)])
def test_min_nodes_is_a_count_of_nodes_and_0_means_every_node(given, nodes, count):
    assert inputs.check_min_nodes(given, nodes) == count
    assert inputs.check_min_nodes(count, nodes) == count


def test_more_min_nodes_than_the_launch_has_are_refused_before_anything_starts():
    variable, message = refusal(launch(guard={"max_restarts": 2, "min_nodes": 4}))
    assert variable == "launch_min_nodes"
    assert "launch_min_nodes=4" in message and "3 nodes" in message
    variable, _ = refusal(launch(guard={"min_nodes": 3}, hosts=HOSTS[:2]))
    assert variable == "launch_min_nodes"


def test_the_guards_get_min_nodes_as_a_count():
    for given, count in ((0, 3), (2, 2)):
        result = launch(guard={"max_restarts": 1, "min_nodes": given})
        assert not result.get("failed"), result.get("msg")
        assert result["spec"]["guard"]["min_nodes"] == count


# --- modes that cannot restart -----------------------------------------------------------------

@pytest.mark.parametrize("mode, why, over", [
    ("mpirun", "one mpirun launcher starts every rank over SSH", {}),
    ("slurm", "sbatch --requeue", {"launch_slurm_partition": "torchfleet"})])
def test_restarts_are_refused_where_the_guards_cannot_restart_the_ranks(mode, why, over):
    variable, message = refusal(launch(mode, guard={"max_restarts": 1}, **over))
    assert variable == "launch_max_restarts"
    assert f"launch_mode={mode}" in message and why in message
    result = launch(mode, guard={"max_restarts": 0}, **over)
    assert not result.get("failed"), result.get("msg")


@pytest.mark.parametrize("mode", ["container", "process", "torchrun"])
def test_the_modes_whose_guards_start_every_rank_take_restarts(mode):
    result = launch(mode, guard={"max_restarts": 3})
    assert not result.get("failed"), result.get("msg")


# --- the run's own checkpoint folder -----------------------------------------------------------

def checkpoint_view(result):
    """What each node's ranks see of their checkpoint folder: the variable, and the node
    folder behind it (a container's mount, else the variable itself)."""
    seen = {}
    for unit in result["spec"]["units"]:
        env = unit.get("env") or {}
        mounts = {m["target"]: m["source"] for m in unit.get("mounts") or []}
        folder = env.get("TORCHFLEET_CHECKPOINT_DIR")
        seen[unit["host"]] = (folder, mounts.get(folder, folder))
    return seen


@pytest.mark.parametrize("mode", ["container", "process"])
def test_restarts_without_a_checkpoint_folder_give_each_node_one_in_the_runs_folder(mode):
    result = launch(mode, guard={"max_restarts": 2})
    own = f"{NODE_DIR}/runs/{RUN_ID}/checkpoints"
    visible = "/checkpoints" if mode == "container" else own
    assert checkpoint_view(result) == {h: (visible, own) for h, _ in HOSTS}
    # The start makes it (launch__run_folder.dirs reads the node's entry).
    assert {h: n["settings"]["checkpoint_dir"] for h, n in result["nodes"].items()} == {h: own for h, _ in HOSTS}


def test_a_checkpoint_folder_given_is_kept_with_restarts_and_none_is_made_without_them():
    given = launch(guard={"max_restarts": 2}, launch_checkpoint_dir="/srv/ckpt/mnist")
    assert set(checkpoint_view(given).values()) == {("/checkpoints", "/srv/ckpt/mnist")}
    assert set(checkpoint_view(launch()).values()) == {(None, None)}
    assert {n["settings"]["checkpoint_dir"] for n in launch()["nodes"].values()} == {""}


def test_the_collect_step_leaves_the_runs_checkpoints_on_the_node(tmp_path):
    result = launch(guard={"max_restarts": 1})
    run = tmp_path / RUN_ID
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "checkpoint-000000010.pt").write_bytes(b"x" * 64)
    (run / "metrics.csv").write_text("step,loss\n")
    own = outputs.own_files(result["spec"], "node-2")
    assert listing(str(run), own) == [("metrics.csv", 10)]


def test_the_start_makes_the_runs_checkpoint_folder_inside_the_run_folder(tmp_path):
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_folder

    result = launch(guard={"max_restarts": 1}, launch_node_dir=str(tmp_path))
    folder = result["nodes"]["node-1"]["settings"]["checkpoint_dir"]
    run_folder.prepare(str(tmp_path), RUN_ID, {"spec.json": "{}"}, dirs=[folder])
    assert (tmp_path / "runs" / RUN_ID / "checkpoints").is_dir()


# --- the run's store key -------------------------------------------------------------------------

def test_every_launch_makes_its_own_store_key_for_the_nodes_and_shows_its_result_to_no_one():
    """The guards sign their store's values with it (guard_store): a key of its own per run, in
    the files every node's folder gets, never in the spec; the action's result, which holds
    it, is hidden from every display (-v, the runner's events), as no_log hides a task's."""
    first, second = launch(), launch()
    keys = [r["common_files"][run_vocab.STORE_KEY] for r in (first, second)]
    assert all(len(k) == 64 and int(k, 16) >= 0 for k in keys) and keys[0] != keys[1]
    assert first["_ansible_no_log"] is True
    assert keys[0] not in json.dumps(first["spec"]) and keys[0] not in json.dumps(first["nodes"])
    assert run_vocab.STORE_KEY in outputs.OWN  # never collected as one of the run's outputs
