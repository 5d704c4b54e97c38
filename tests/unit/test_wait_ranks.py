"""wait_ranks' decisions, with no nodes: each node's copy decides from its own units alone;
the guards' abort is the only channel between nodes.

The node side is replaced by the statuses rank_containers would report (and the guards'
records run_state would read); what is under test is how a copy decides.
"""

from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail

from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task

from ansible_collections.torchfleet.cluster.plugins.action.wait_ranks import ActionModule


def rank(n, code=None):
    return {"rank": n, "role": "rank", "exit_code": code, "status": "running" if code is None else "exited",
            "last_line": ""}


def waiter(host, statuses, units=(), **args):
    """A wait_ranks copy for one node whose ranks report ``statuses`` in turn (the last repeats),
    and whose guards recorded ``units`` (run_state's)."""
    task = Task()
    # The master's listen: a loopback port where nothing listens.
    task.args = {"labels": {"torchfleet.job": "unit"}, "expected": 1, "poll_interval": 0.05, "listen_host": "127.0.0.1",
                 "listen_port": 9, "node_dir": "/n", "run_id": "r", **args}
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp"))
    action = ActionModule(task, connection, PlayContext(), None, None, None)
    calls = iter(statuses)
    last = {}

    def execute_module(module_name, module_args, task_vars):
        nonlocal last
        if module_name == "torchfleet.cluster.run_state":
            return {"run": {"units": list(units)}}
        last = next(calls, last)
        return last

    action._execute_module = execute_module
    return lambda: action.run(task_vars={"inventory_hostname": host})


def test_a_failed_rank_is_named_with_its_exit_code():
    result = waiter("node-2", [{"containers": [rank(1)]}, {"containers": [rank(1, 137)]}])()
    assert result["outcome"] == "failed" and result["reason"] == "rank 1 exited with code 137"


def test_a_unit_its_guard_stopped_names_the_runs_abort_as_peer_failed():
    """The guards' abort is the channel between nodes: node-1's unit ended because node-2's
    rank failed, and node-1's copy says so, as its guard recorded it."""
    abort = {"kind": "rank_failed", "host": "node-2", "reason": "rank 1 on node-2 exited with code 1"}
    stopped = {"unit": 0, "state": "stopped", "exit_code": 143, "abort": abort}
    result = waiter("node-1", [{"containers": [rank(0, 143)]}], units=[stopped], run_id="r", node_dir="/n")()
    assert result["outcome"] == "peer-failed" and result["reason"] == "rank 1 on node-2 exited with code 1"


def test_a_unit_that_failed_on_its_own_stays_failed_though_its_guard_recorded_the_abort():
    own = {"unit": 0, "state": "exited", "exit_code": 1, "abort": {"reason": "rank 0 on node-1 exited with code 1"}}
    result = waiter("node-1", [{"containers": [rank(0, 1)]}], units=[own], run_id="r", node_dir="/n")()
    assert result["outcome"] == "failed" and result["reason"] == "rank 0 exited with code 1"


def test_a_vanished_rank_counts_as_a_failure():
    result = waiter("node-1", [{"containers": []}])()
    assert result["outcome"] == "failed" and result["reason"] == "1 rank container(s) vanished"


def test_success():
    result = waiter("node-1", [{"containers": [rank(0)]}, {"containers": [rank(0, 0)]}])()
    assert result["outcome"] == "succeeded" and result["reason"] is None


def test_a_master_that_does_not_listen_within_the_timeout_fails_the_wait():
    result = waiter("node-1", [{"containers": [rank(0)]}], timeout=1)()
    assert result["outcome"] == "failed"
    assert result["reason"] == "127.0.0.1:9 did not listen within 1s (launch_master_wait_timeout)"


def test_a_node_whose_ranks_cannot_be_read_fails_with_the_modules_message():
    result = waiter("node-1", [{"failed": True, "msg": "docker: not found"}])()
    assert result["failed"] and result["msg"] == "docker: not found"


@pytest.mark.parametrize("args, message", [
    ({"expected": "two"}, "expected"),
    ({"poll_interval": "soon"}, "poll_interval"),
    ({"abort_dir": "/tmp/x"}, "abort_dir"),
])
def test_arguments_are_validated(args, message):
    with pytest.raises(AnsibleActionFail, match=message):
        waiter("node-1", [{"containers": [rank(0, 0)]}], **args)()
