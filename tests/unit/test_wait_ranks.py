"""wait_ranks' abort protocol, with no nodes: every node's copy shares one abort folder.

The node side is replaced by the statuses rank_containers would report; what is under
test is how the copies decide, and what they leave for each other in the folder.
"""

import json
import threading
import time
from types import SimpleNamespace

from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task

from ansible_collections.torchfleet.cluster.plugins.action.wait_ranks import ActionModule


def rank(n, code=None):
    return {"rank": n, "role": "rank", "exit_code": code, "status": "running" if code is None else "exited",
            "last_line": ""}


def waiter(host, abort_dir, statuses, **args):
    """A wait_ranks copy for one node whose ranks report ``statuses`` in turn (the last repeats)."""
    task = Task()
    task.args = {"labels": {"torchfleet.job": "unit"}, "expected": 1, "abort_dir": str(abort_dir),
                 "poll_interval": 0.05, **args}
    connection = SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp"))
    action = ActionModule(task, connection, PlayContext(), None, None, None)
    calls = iter(statuses)
    last = {}

    def execute_module(module_name, module_args, task_vars):
        nonlocal last
        last = next(calls, last)
        return last

    action._execute_module = execute_module
    return lambda: action.run(task_vars={"inventory_hostname": host})


def test_a_failed_rank_writes_the_abort_file_naming_its_host_and_rank(tmp_path):
    result = waiter("node-2", tmp_path, [{"containers": [rank(1)]}, {"containers": [rank(1, 137)]}])()
    assert result["outcome"] == "failed" and result["reason"] == "rank 1 exited with code 137"
    assert json.loads((tmp_path / "abort-node-2.json").read_text()) == {
        "host": "node-2", "reason": "rank 1 exited with code 137"}


def test_every_other_node_returns_peer_failed_with_the_reason(tmp_path):
    healthy = [waiter(f"node-{i}", tmp_path, [{"containers": [rank(i - 1)]}]) for i in (1, 3)]
    results = {}
    threads = [threading.Thread(target=lambda i=i, w=w: results.__setitem__(i, w())) for i, w in enumerate(healthy)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert not results, "healthy nodes must keep waiting while nothing failed"
    waiter("node-2", tmp_path, [{"containers": [rank(1, 1)]}])()
    for t in threads:
        t.join(5)
    assert [r["outcome"] for r in results.values()] == ["peer-failed", "peer-failed"]
    assert {r["reason"] for r in results.values()} == {"rank 1 exited with code 1 on node-2"}


def test_a_vanished_rank_counts_as_a_failure(tmp_path):
    result = waiter("node-1", tmp_path, [{"containers": []}])()
    assert result["outcome"] == "failed" and result["reason"] == "1 rank container(s) vanished"
    assert (tmp_path / "abort-node-1.json").exists()


def test_success_writes_no_abort_file(tmp_path):
    result = waiter("node-1", tmp_path, [{"containers": [rank(0)]}, {"containers": [rank(0, 0)]}])()
    assert result["outcome"] == "succeeded" and result["reason"] is None
    assert list(tmp_path.iterdir()) == []


def test_the_timeout_aborts_every_node(tmp_path):
    result = waiter("node-1", tmp_path, [{"containers": [rank(0)]}], timeout=1)()
    assert result["outcome"] == "failed" and result["reason"] == "no result after 1s (launch_timeout)"
    peer = waiter("node-2", tmp_path, [{"containers": [rank(1)]}])()
    assert peer["outcome"] == "peer-failed"


def test_a_node_whose_ranks_cannot_be_read_aborts_the_others(tmp_path):
    result = waiter("node-1", tmp_path, [{"failed": True, "msg": "docker: not found"}])()
    assert result["failed"] and result["msg"] == "docker: not found"
    peer = waiter("node-2", tmp_path, [{"containers": [rank(1)]}])()
    assert peer["outcome"] == "peer-failed"
    assert peer["reason"] == "could not read its ranks: docker: not found on node-1"


def test_a_peer_ignores_an_abort_file_still_being_written(tmp_path):
    (tmp_path / "abort-node-9.json.tmp").write_text("")
    result = waiter("node-1", tmp_path, [{"containers": [rank(0)]}, {"containers": [rank(0, 0)]}])()
    assert result["outcome"] == "succeeded"


def test_the_abort_file_appears_whole_and_leaves_no_temp_file(tmp_path):
    waiter("node-2", tmp_path, [{"containers": [rank(1, 3)]}])()
    assert [p.name for p in tmp_path.iterdir()] == ["abort-node-2.json"]
