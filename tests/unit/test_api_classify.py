"""The API tells bad input from a failed node by what the failure says, never by where it came from."""

import pytest

from torchfleet.api import Cluster, PlaybookResult
from torchfleet.events import Collector
from torchfleet.errors import InventoryError, TaskFailed


def failed(res, task_path, action="torchfleet.cluster.launch_spec", host="node-1"):
    return {"event": "runner_on_failed",
            "event_data": {"host": host, "task": "Some task", "task_action": action, "task_path": task_path,
                           "res": res}}


TYPED = {"msg": "host node-2: cpu_pinning_cpusets[0]='20-24' names CPUs 20-24 the node does not have",
         "torchfleet_error": {"kind": "input", "host": "node-2", "variable": "cpu_pinning_cpusets"}}
UNTYPED = {"msg": "host node-1: launch_image torchfleet/absent:0 is not on this node; run site.yml first"}
ARGSPEC = {"msg": "Validation of arguments failed:\nvalue of launch_mode must be one of: container, mpirun, torchrun, "
                   "process, got: teleport", "argument_errors": ["value of launch_mode must be one of: ..."]}


@pytest.mark.parametrize("path", ["/p/roles/cpu_pinning/tasks/main.yml:12", "/p/roles/launch/tasks/renamed.yml:3",
                                  "/elsewhere/anything.yml:1"])
def test_a_typed_input_failure_is_input_wherever_its_task_lives(path):
    collector = Collector(None)
    collector(failed(TYPED, path))
    failure = collector.failures[0]
    assert (failure.kind, failure.host, failure.variable) == ("input", "node-2", "cpu_pinning_cpusets")
    with pytest.raises(InventoryError) as info:
        Cluster._raise_for(PlaybookResult("p", "failed", 2, 1.0, failures=collector.failures), "plan")
    assert info.value.variable == "cpu_pinning_cpusets" and info.value.host == "node-2"


@pytest.mark.parametrize("path", ["/p/roles/launch/tasks/validate.yml:3", "/p/roles/launch/tasks/preflight.yml:9",
                                  "/p/roles/cpu_pinning/tasks/main.yml:12", "/p/roles/launch/tasks/plan.yml:1"])
def test_an_untyped_failure_is_a_nodes_even_in_a_file_once_called_validate(path):
    collector = Collector(None)
    collector(failed(UNTYPED, path, action="ansible.builtin.assert"))
    assert collector.failures[0].kind == "node"
    with pytest.raises(TaskFailed) as info:
        Cluster._raise_for(PlaybookResult("p", "failed", 2, 1.0, failures=collector.failures), "launch")
    assert not isinstance(info.value, InventoryError) and info.value.host == "node-1"


def test_an_argument_spec_failure_is_input_and_names_the_variable():
    collector = Collector(None)
    collector(failed(ARGSPEC, "/p/roles/launch/tasks/x.yml:1", action="ansible.builtin.validate_argument_spec"))
    assert collector.failures[0].kind == "input" and collector.failures[0].variable == "launch_mode"


def test_a_loop_is_reported_by_its_failed_item():
    ok = {"changed": False, "item": {"name": "launch_poll_interval"}}
    bad = dict(TYPED, failed=True, item={"name": "cpu_pinning_cpusets"})
    collector = Collector(None)
    collector(failed({"msg": "One or more items failed", "results": [ok, bad]}, "/p/x.yml:1",
                     action="torchfleet.cluster.check_input"))
    failure = collector.failures[0]
    assert (failure.kind, failure.variable, failure.message) == ("input", "cpu_pinning_cpusets", TYPED["msg"])
    collector(failed({"msg": "One or more items failed", "results": [ok, dict(UNTYPED, failed=True)]}, "/p/y.yml:1",
                     action="ansible.builtin.assert"))
    assert (collector.failures[1].kind, collector.failures[1].message) == ("node", UNTYPED["msg"])
