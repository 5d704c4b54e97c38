"""run_reap, the node's remover of the exited rank containers whose guard's node stood still
and came back: it waits on the guards' own locks, and picks the units by their records."""

import json
import subprocess
import sys
import time

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_reap, run_vocab

HOLD = "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\nfcntl.flock(fd, fcntl.LOCK_EX)\n" \
       "print('held', flush=True)\ntime.sleep(float(sys.argv[2]))\n"


def test_it_waits_until_every_guard_has_let_go_of_its_lock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path / run_vocab.guard_lock(0)), "1.5"],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    started = time.monotonic()
    run_reap.await_guards(str(tmp_path), [0], start_timeout=30)
    assert time.monotonic() - started >= 1.0 and holder.wait(10) == 0


def test_a_guard_that_never_made_its_lock_is_waited_for_the_starts_allowance_only(tmp_path):
    started = time.monotonic()
    run_reap.await_guards(str(tmp_path), [3], start_timeout=1.0)
    assert 1.0 <= time.monotonic() - started < 10


def test_only_the_units_whose_node_came_back_are_its_to_remove(tmp_path):
    for index, record in enumerate([{"state": "left_out", "stood_still": True}, {"state": "stopped"},
                                    {"state": "stopped", "stood_still": True}]):
        (tmp_path / run_vocab.guard_record(index)).write_text(json.dumps(record))
    assert run_reap.came_back(str(tmp_path), [0, 1, 2, 5]) == [0, 2]


def test_a_run_whose_nodes_all_answered_is_left_to_the_controller(tmp_path):
    """No guard stood still: nothing is asked of docker (there is none here)."""
    units = [{"name": "tf-r-rank0"}, {"name": "tf-r-rank1"}]
    (tmp_path / run_vocab.GUARD_CONFIG).write_text(json.dumps({"run_id": "r", "units": units, "start_timeout": 1,
                                                                "stop_wait": 30}))
    for index in (0, 1):
        (tmp_path / run_vocab.guard_lock(index)).touch()
        (tmp_path / run_vocab.guard_record(index)).write_text('{"state": "exited"}')
    started = time.monotonic()
    assert run_reap.reap(str(tmp_path), ["tf-r-rank0", "tf-r-rank1"], docker="no-such-docker") == []
    assert time.monotonic() - started < 10
