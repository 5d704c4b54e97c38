"""launch_input checks the launch role's argument spec itself (the playbooks skip Ansible's
own check, a task per node): every error in one message, the first variable named."""

from pathlib import Path

import pytest
import yaml

from ansible_collections.torchfleet.cluster.plugins.action.launch_input import _check_types
from torchfleet.errors import InventoryError

SPEC = Path(__file__).resolve().parents[2] / "roles" / "launch" / "meta" / "argument_specs.yml"
OPTIONS = yaml.safe_load(SPEC.read_text())["argument_specs"]["main"]["options"]
# What the role's defaults give every host.
REQUIRED = {"launch_dataset_dir": "/data", "launch_image": "train:1", "launch_runs_dir": "runs", "launch_workload": "w.py"}


def test_values_of_the_right_types_pass():
    _check_types(OPTIONS, {**REQUIRED, "launch_mode": "process", "launch_node_timeout": "12", "launch_detach": "yes"}, "node-1")


def test_a_bad_choice_and_a_bad_type_are_both_reported_and_the_first_named():
    with pytest.raises(InventoryError) as info:
        _check_types(OPTIONS, {**REQUIRED, "launch_mode": "teleport", "launch_master_port": "many"}, "node-2")
    error = info.value
    assert str(error).startswith("host node-2: ")
    assert "launch_mode must be one of" in str(error) and "launch_master_port" in str(error)
    assert error.variable in ("launch_mode", "launch_master_port")
    assert str(error).index(error.variable) == min(str(error).index(v) for v in ("launch_mode", "launch_master_port"))


def test_a_name_inside_a_longer_name_is_not_taken_for_it():
    with pytest.raises(InventoryError) as info:
        _check_types(OPTIONS, {**REQUIRED, "launch_stall_timeout": "soon"}, "node-1")
    assert info.value.variable == "launch_stall_timeout"


def test_a_missing_required_value_is_named():
    with pytest.raises(InventoryError) as info:
        _check_types(OPTIONS, {k: v for k, v in REQUIRED.items() if k != "launch_image"}, "node-1")
    assert info.value.variable == "launch_image" and "missing required arguments: launch_image" in str(info.value)
