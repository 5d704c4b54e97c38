"""launch_input and run_state check the launch role's argument spec themselves (the playbooks
skip Ansible's own check, a task per node): every error in one message, the first variable named."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from ansible_collections.torchfleet.cluster.plugins.plugin_utils.core import check_role_arguments, check_role_types
from harness.inputs import LAUNCH_RENDERED, launch_values
from torchfleet.errors import InventoryError

SPEC = Path(__file__).resolve().parents[2] / "roles" / "launch" / "meta" / "argument_specs.yml"
OPTIONS = yaml.safe_load(SPEC.read_text())["argument_specs"]["main"]["options"]
# What the role's defaults give every host, for the options the spec requires.
REQUIRED = {k: LAUNCH_RENDERED[k] for k, o in OPTIONS.items() if o.get("required")}


def test_the_roles_defaults_pass_the_roles_own_spec():
    check_role_types(OPTIONS, launch_values(), "node-1")


def test_values_of_the_right_types_pass():
    check_role_types(OPTIONS, {**REQUIRED, "launch_mode": "process", "launch_node_timeout": "12", "launch_detach": "yes"}, "node-1")


def test_a_bad_choice_and_a_bad_type_are_both_reported_and_the_first_named():
    with pytest.raises(InventoryError) as info:
        check_role_types(OPTIONS, {**REQUIRED, "launch_mode": "teleport", "launch_master_port": "many"}, "node-2")
    error = info.value
    assert str(error).startswith("host node-2: ")
    assert "launch_mode must be one of" in str(error) and "launch_master_port" in str(error)
    assert error.variable in ("launch_mode", "launch_master_port")
    assert str(error).index(error.variable) == min(str(error).index(v) for v in ("launch_mode", "launch_master_port"))


def test_a_name_inside_a_longer_name_is_not_taken_for_it():
    with pytest.raises(InventoryError) as info:
        check_role_types(OPTIONS, {**REQUIRED, "launch_stall_timeout": "soon"}, "node-1")
    assert info.value.variable == "launch_stall_timeout"


def test_a_missing_required_value_is_named():
    with pytest.raises(InventoryError) as info:
        check_role_types(OPTIONS, {k: v for k, v in REQUIRED.items() if k != "launch_image"}, "node-1")
    assert info.value.variable == "launch_image" and "missing required arguments: launch_image" in str(info.value)


def test_run_state_fails_a_hosts_bad_variable_before_anything_runs_on_the_node():
    # The run verbs and down.yml: run_state's role option, in place of Ansible's task per node.
    action = SimpleNamespace(_templar=SimpleNamespace(template=lambda values: values))
    role = str(SPEC.parents[1])
    assert check_role_arguments(action, {**REQUIRED, "inventory_hostname": "node-1", "launch_keep_runs": "4"}, role) is None
    failed = check_role_arguments(action, {**REQUIRED, "inventory_hostname": "node-3", "launch_keep_runs": "many"}, role)
    assert failed["failed"] and failed["msg"].startswith("host node-3: the launch role's arguments: ")
    assert failed["torchfleet_error"] == {"kind": "input", "host": "node-3", "variable": "launch_keep_runs"}
