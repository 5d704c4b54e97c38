"""The guard's decisions that the split by concern (issue 57) moved out of its loop, as pure
functions with what they need passed in: a stop file's text, the clocks, the heartbeats."""

import pytest

from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_policy as policy

RANK = {"name": "tf-r-rank1", "host": "node-2", "role": "rank", "ranks": [1]}


@pytest.mark.parametrize("text, reason", [(None, None), ("", "stopped on request (torchfleet stop)"),
                                          ("replaced by run r2\n", "replaced by run r2")])
def test_a_stop_file_is_read_through_the_probe_it_is_given(text, reason):
    abort = policy.stop_requested(lambda: text, "node-1")
    assert (abort and abort["reason"]) == reason
    if abort:
        assert abort["kind"] == "stopped" and abort["host"] == "node-1" and abort["unit"] is None


def test_a_signal_to_the_guard_is_a_stop_naming_its_unit():
    assert policy.signalled(RANK, 15) == {"kind": "stopped", "host": "node-2", "unit": "tf-r-rank1",
                                          "reason": "rank 1 on node-2 got signal 15"}


def test_a_guard_whose_schedulers_step_ended_blames_its_own_unit_for_good():
    abort = policy.parent_gone(RANK, 4242)
    assert (abort["kind"], abort["host"], abort["unit"], abort["final"]) == ("rank_failed", "node-2", "tf-r-rank1", True)
    assert abort["reason"] == f"rank 1 on node-2: {abort['cause']}" and "pid 4242" in abort["cause"]
    assert not policy.restartable(abort) and policy.attempt_end(True, abort, True, True) == "final"


@pytest.mark.parametrize("restarts_left, kind, member, host, then", [
    (False, "rank_failed", True, False, "final"),
    (True, "stopped", True, False, "final"),        # a stop on request is never restarted
    (True, "node_lost", False, False, "final"),     # a unit outside the attempt
    (True, "rank_failed", True, True, "decide"),
    (True, "rank_failed", True, False, "await"),
])
def test_what_a_guard_does_once_its_attempt_ended(restarts_left, kind, member, host, then):
    assert policy.attempt_end(restarts_left, {"kind": kind}, member, host) == then
    assert policy.attempt_end(restarts_left, {"kind": kind, "store_lost": True}, member, host) == (
        "failover" if then in ("decide", "await") else then)


def test_only_the_unit_that_failed_ended_on_its_own_account():
    failed = {"kind": "rank_failed", "index": 2}
    assert policy.own_failure(failed, 2) and not policy.own_failure(failed, 1)
    assert not policy.own_failure({"kind": "stalled", "index": 2}, 2)


def test_a_units_row_of_an_attempt_takes_its_ends_fields_out_of_its_record():
    state = {"state": "running", "sigterm_at": 5.0, "child_exit_code": 0, "pid": 7}
    entry = policy.attempt_entry(1, [1], 143, {"kind": "node_lost", "reason": "lost node-3"}, False, state)
    assert entry == {"attempt": 1, "ranks": [1], "exit_code": 143, "state": "stopped", "why": "lost node-3",
                     "sigterm_at": 5.0, "child_exit_code": 0}
    assert state == {"state": "running", "pid": 7}
    assert policy.final_unit_state([entry]) == ("stopped", "lost node-3")
    assert policy.final_unit_state([]) == ("stopped", None)


@pytest.mark.parametrize("gap, since_end, back", [(13.0, 1.0, True), (12.9, 1.0, False), (20.0, 13.1, False)])
def test_a_host_is_back_from_standing_still_only_just_after_a_long_enough_stand(gap, since_end, back):
    # The others take a node timeout to lose its store and as long again to move on (4 s: 13 s).
    assert policy.back_from_standing_still(gap, since_end, node_timeout=4) is back


CANDIDATES = [{"node": f"node-{i}", "unit": i - 1} for i in (1, 2, 3)]
EVERY = {"node-1", "node-2", "node-3"}


def test_the_next_master_is_inferred_in_node_order_while_enough_nodes_are_left():
    assert policy.inferred_successor(CANDIDATES, 0, "node-1", 2, EVERY) == "node-2"
    assert policy.inferred_successor(CANDIDATES, 0, "node-1", 3, EVERY) is None
    # A store that moved on moves on again, round to the nodes before it.
    assert policy.inferred_successor(CANDIDATES, 2, "node-3", 1, EVERY) == "node-1"


def test_the_inferred_master_is_a_node_of_the_attempt():
    # Issue 58: node-2, left out of the attempt, hosts nothing; the others go on at node-3.
    assert policy.inferred_successor(CANDIDATES, 0, "node-1", 1, {"node-1", "node-3"}) == "node-3"
    assert policy.inferred_successor(CANDIDATES, 0, "node-1", 2, {"node-1", "node-3"}) is None


def test_a_guard_that_lost_the_store_tries_the_attempts_next_nodes_round_in_node_order():
    assert policy.failover_order(CANDIDATES, 0, "node-1", EVERY) == [1, 2]
    assert policy.failover_order(CANDIDATES, 1, "node-2", EVERY) == [2, 0]
    assert policy.failover_order(CANDIDATES, 0, "node-1", {"node-1", "node-3"}) == [2]
    assert policy.failover_order(CANDIDATES, 2, "node-3", {"node-2", "node-3"}) == [1]


def test_a_guard_looks_for_the_runs_store_where_it_knew_it_first_and_never_on_its_own_node():
    assert policy.search_order(CANDIDATES, 0, "node-3") == [0, 1]
    assert policy.search_order(CANDIDATES, 1, "node-3") == [1, 0]
    assert policy.search_order(CANDIDATES, 0, "node-1") == [1, 2]


def test_a_master_that_stood_still_while_the_run_moved_on_follows_it_with_restarts_left():
    moved = policy.moved("node-1", "node-2")
    assert policy.attempt_end(True, moved, True, True) == "follow"
    assert policy.attempt_end(True, moved, True, False) == "follow"  # its node's other guards too
    assert policy.attempt_end(False, moved, True, True) == "final"


def test_the_host_waits_for_units_whose_guards_still_beat():
    # Unit 0 exited; unit 1 beat just now (it gets the grace too); unit 2 never beat since the start.
    waiting = policy.still_ending({0, 1, 2}, {0: 0}, {1: 99.0}, started=90.0, now=100.0, poll=0.5, grace=3)
    assert waiting == [1]
    assert policy.still_ending({0, 1, 2}, {0: 0}, {}, started=99.5, now=100.0, poll=0.5, grace=3) == [1, 2]


def test_a_node_answers_once_every_unit_of_it_beats():
    nodes = [{"host": "a"}, {"host": "b"}]
    units = [{"host": "a"}, {"host": "b"}, {"host": "b", "service": True}]
    assert policy.answering_hosts(nodes, units, {0}) == ["a"]
    assert policy.answering_hosts(nodes, units, {0, 1}) == ["a", "b"]  # a service takes no part


def test_a_node_beats_again_only_once_its_counter_moved_in_two_looks():
    looks = {}
    # Issue 58: the beats queued while its link was cut arrive at once: one move, not a guard.
    assert [policy.beats_again(looks, 2, count) for count in (7, 7, 10, 10, 10)] == [False] * 5
    assert policy.beats_again(looks, 2, 11) is True
    assert policy.beats_again(looks, 1, 0) is False and looks[1] == [0, 0]


@pytest.mark.parametrize("waited, missing, lost, done", [
    (1.0, set(), set(), False),          # not before the least
    (2.0, set(), set(), True),           # every node there
    (2.0, {"c"}, {"c"}, False),          # a lost node gets the rejoin timeout
    (5.0, {"c"}, {"c"}, True),
    (5.0, {"c"}, set(), False),          # any other node, up to the most
    (12.0, {"c"}, set(), True),
])
def test_the_host_plans_the_next_attempt_once_it_has_watched_long_enough(waited, missing, lost, done):
    assert policy.answering_done(waited, least=2.0, most=12.0, missing=missing, lost=lost, rejoin_timeout=5.0) is done


@pytest.mark.parametrize("waited, missing, done", [
    (12.0, {"c"}, False),                # issue 58: the rejoin timeout, not cut to the most
    (89.0, {"c"}, False),
    (90.0, {"c"}, True),
    (12.0, {"d"}, True),                 # a node that was not lost: the most
    (12.0, {"c", "d"}, False),           # each missing node its own wait
    (90.0, {"c", "d"}, True),
])
def test_a_lost_node_gets_the_whole_rejoin_timeout_even_past_the_most(waited, missing, done):
    assert policy.answering_done(waited, least=2.0, most=12.0, missing=missing, lost={"c"}, rejoin_timeout=90.0) is done


def test_an_attempts_row_opens_and_closes_with_its_cause():
    plan = {"attempt": 2, "nodes": ["a"], "master": "a", "world_size": 1, "ranks": {"a": [0]}}
    row = policy.attempt_row(plan, "t0", 100.0)
    policy.close_row(row, {"kind": "rank_failed", "reason": "r", "final": "no restarts left"}, "failed", "t1", 112.34)
    assert row["cause"] == {"kind": "rank_failed", "reason": "r"} and row["seconds"] == 12.3 and "_t" not in row
    assert (row["started_at"], row["ended_at"], row["state"]) == ("t0", "t1", "failed")
