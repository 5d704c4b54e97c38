"""check_input: a failure carries its host and variable as data, for one node or for all."""

from types import SimpleNamespace

from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task

from ansible_collections.torchfleet.cluster.plugins.action.check_input import ActionModule


def check(args, host="node-1"):
    task = Task()
    task.args = args
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir=None))
    return ActionModule(task, connection, PlayContext(), None, None, None).run(task_vars={"inventory_hostname": host})


def test_a_passing_check_changes_nothing():
    assert check({"checks": [{"that": True, "msg": "x", "variable": "v"}]}) == {"changed": False}


def test_a_failure_names_the_tasks_own_host_without_a_host_of_its_own():
    result = check({"that": False, "msg": "launch_timeout=-1 must be at least 0", "variable": "launch_timeout"}, "node-2")
    assert result["failed"] and result["msg"] == "host node-2: launch_timeout=-1 must be at least 0"
    assert result["torchfleet_error"] == {"kind": "input", "host": "node-2", "variable": "launch_timeout"}


def test_checks_of_every_node_name_each_failing_host_and_the_first_gives_the_error():
    result = check({"checks": [
        {"that": True, "msg": "fine", "variable": "launch_python", "kind": "node", "host": "node-1"},
        {"that": False, "msg": "/dev/fuse does not exist on the node (launch_extra_devices)",
         "variable": "launch_extra_devices", "kind": "node", "host": "node-3"},
        {"that": False, "msg": "job t is still running as run r1 on node-4", "variable": "launch_job",
         "kind": "running", "host": "node-4"}], "consequence": "so nothing started"})
    assert result["msg"] == ("host node-3: /dev/fuse does not exist on the node (launch_extra_devices); "
                             "host node-4: job t is still running as run r1 on node-4; so nothing started")
    assert result["torchfleet_error"] == {"kind": "node", "host": "node-3", "variable": "launch_extra_devices"}


def test_a_failure_shared_by_several_nodes_names_them_once():
    running = {"that": False, "msg": "job t is still running as run r1", "variable": "launch_job", "kind": "running"}
    result = check({"checks": [{**running, "host": f"node-{i}"} for i in (1, 2, 3)]
                    + [{"that": False, "msg": "/dev/fuse does not exist", "variable": "launch_extra_devices",
                        "kind": "node", "host": "node-2"}]})
    assert result["msg"] == ("hosts node-1, node-2, node-3: job t is still running as run r1; "
                             "host node-2: /dev/fuse does not exist")
    assert result["torchfleet_error"] == {"kind": "running", "host": "node-1", "variable": "launch_job"}
