"""A node that comes back leaves nothing behind (issue 58): a worker frozen whole while the run
runs, without restarts, is lost and the run fails; thawed once the launch has ended (and could
not collect it), its guard stops its rank, and the node removes the exited rank container by
itself, its log kept in the run's folder, with no controller and no `down`."""

import time

from .conftest import NODE_TIMEOUT, NODES, RUNS, finish

# The run's stop_wait (node timeout + stop grace 3 + 5) after the guard ends, and a margin for
# two busy cores.
REMOVED_WITHIN = NODE_TIMEOUT + 3 + 5 + 60


def test_a_worker_that_comes_back_removes_its_exited_rank_container(recovery):
    r = recovery
    if any(r.ranks(node, running_only=True) for node in NODES):
        r.cli("down")
    launch = r.launch("thawed", 0, ["--epoch", "8", "--checkpoint-every", "0"])
    r.wait_trained("thawed", launch)
    inner = r.freeze("node-3")
    try:
        code, out = finish(launch)
    finally:
        r.thaw("node-3", inner)
    assert code == 5 and out["error"]["host"] == "node-3", out

    mine = "docker ps -aq --filter label=torchfleet.run=thawed"
    deadline = time.monotonic() + REMOVED_WITHIN
    while r.node("node-3", mine).split():
        assert time.monotonic() < deadline, r.node("node-3", "docker ps -a --filter label=torchfleet.run=thawed")
        time.sleep(1)
    record = r.node_json("node-3", "thawed", "guard-2.json")
    assert record["stood_still"] is True and record["state"] == "stopped", record
    # What the container wrote is in the run's folder, as a collect would have kept it.
    log = r.node("node-3", f"cat {RUNS}/thawed/rank-2.log")
    assert "Train Epoch" in log and "stopped rank 2 on node-3" in log
    r.assert_nothing_left()
