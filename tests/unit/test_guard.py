"""The guard's decisions, without a store: what aborts a run, who is lost, the run's state.
The guard with a real TCPStore runs in the fault matrix (tests/faults) on the docker hosts."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import types
from datetime import timedelta
from pathlib import Path

import pytest

from harness.guards import guard_folder, store_key
from ansible_collections.torchfleet.cluster.plugins.module_utils import (guard, guard_child, guard_policy, guard_records,
                                                                 guard_store, run_folder, run_vocab)
from torchfleet.report import PEER_ERROR_RE

RANK = {"name": "tf-r-rank1", "host": "node-2", "role": "rank", "ranks": [1]}
AGENT = {"name": "tf-r-torchrun", "host": "node-3", "role": "torchrun", "ranks": [4, 5, 6, 7]}
SSHD = {"name": "tf-r-sshd", "host": "node-2", "role": "sshd", "ranks": [], "service": True}
MPIRUN = {"name": "tf-r-mpirun", "host": "node-1", "role": "mpirun", "ranks": [0, 1, 2]}


@pytest.mark.parametrize("returncode, code", [(0, 0), (3, 3), (-signal.SIGKILL, 137), (-signal.SIGTERM, 143)])
def test_exit_codes_read_as_a_shell_reports_them(returncode, code):
    assert guard_policy.exit_code(returncode) == code


@pytest.mark.parametrize("unit, name", [(RANK, "rank 1 on node-2"), (AGENT, "torchrun (ranks 4-7) on node-3"),
                                        (SSHD, "sshd on node-2"), (MPIRUN, "mpirun on node-1")])
def test_units_are_named_as_a_user_knows_them(unit, name):
    assert guard_policy.who(unit) == name


def test_only_a_non_zero_exit_aborts():
    assert guard_policy.abort_for_exit(RANK, 0) is None
    abort = guard_policy.abort_for_exit(RANK, 137)
    assert abort == {"kind": "rank_failed", "host": "node-2", "unit": "tf-r-rank1",
                     "reason": "rank 1 on node-2 exited with code 137"}


@pytest.mark.parametrize("idle, limit, stalls", [(5, 0, False), (5, 10, False), (10, 10, True), (30, 10, True)])
def test_a_stall_needs_a_limit_and_that_much_silence(idle, limit, stalls):
    found = guard_policy.stalled(RANK, idle, limit)
    assert (found is not None) == stalls
    if stalls:
        assert found["kind"] == "stalled" and f"launch_stall_timeout={limit}" in found["reason"]


@pytest.mark.parametrize("idle, stalls", [(10, False), (119, False), (121, True)])
def test_a_unit_still_starting_gets_the_start_allowance_before_it_counts_as_stalled(idle, stalls):
    found = guard_policy.stalled(RANK, idle, 10, progressed=False, start_timeout=120)
    assert (found is not None) == stalls
    if stalls:
        assert "no progress since its start" in found["reason"]


def test_a_unit_is_lost_when_its_heartbeat_stands_still_past_the_timeout():
    units = [MPIRUN, SSHD, RANK]
    # Unit 1 beat 3 s ago, unit 2 11 s ago; unit 0 (the host) is never judged by itself.
    assert guard_policy.lost_units(units, {1: 97.0, 2: 89.0}, {0}, now=100.0, node_timeout=10, started=0.0,
                            start_timeout=200) == [2]
    # A unit that finished is not lost, however old its last beat.
    assert guard_policy.lost_units(units, {1: 97.0, 2: 89.0}, {0, 2}, 100.0, 10, 0.0, 200) == []


def test_a_unit_that_never_beat_gets_the_start_allowance():
    units = [MPIRUN, SSHD]
    assert guard_policy.lost_units(units, {}, {0}, now=50.0, node_timeout=10, started=0.0, start_timeout=60) == []
    assert guard_policy.lost_units(units, {}, {0}, now=61.0, node_timeout=10, started=0.0, start_timeout=60) == [1]


def test_a_loss_names_every_lost_host_once():
    abort = guard_policy.abort_for_lost([MPIRUN, SSHD, RANK, AGENT], [1, 2, 3], 10)
    assert abort["kind"] == "node_lost" and abort["hosts"] == ["node-2", "node-3"]
    assert abort["reason"].startswith("lost node-2, node-3: no heartbeat for 10s (launch_node_timeout)")


def test_the_run_state_follows_the_primary_units_not_the_services():
    units = [MPIRUN, SSHD]
    assert run_vocab.job_state(units, {}, None, []) == "running"
    assert run_vocab.job_state(units, {0: 0}, None, []) == "succeeded"  # sshd is a service
    assert run_vocab.job_state(units, {0: 1}, None, []) == "failed"
    assert run_vocab.job_state(units, {}, {"kind": "stopped"}, []) == "stopped"
    assert run_vocab.job_state(units, {}, {"kind": "node_lost"}, []) == "failed"


def test_usage_errors_exit_2(capsys):
    assert guard.main(["config.json", "0", "python3"]) == 2
    assert "usage" in capsys.readouterr().err


def test_state_files_are_replaced_whole(tmp_path):
    path = tmp_path / "guard-0.json"
    guard_records.write_json(str(path), {"state": "running"})
    guard_records.write_json(str(path), {"state": "stopped"})
    assert path.read_text().count("stopped") == 1 and list(tmp_path.iterdir()) == [path]


def test_a_guard_that_ends_removes_the_nodes_secret_environment(tmp_path):
    """Also where the controller lost the node and could not clean it (mpirun mode)."""
    secret = tmp_path / "node.secret.env"
    secret.write_text("TOKEN='x'\n")
    config = {"units": [SSHD], "store_unit": 0, "node_timeout": 4, "run_id": "r", "job": "j"}
    ended = guard.Guard(config, 0, ["true"], str(tmp_path))
    ended.records.finish(143, "stopped", None, None)
    assert not secret.exists()
    assert '"state": "stopped"' in (tmp_path / "guard-0.json").read_text()


def test_a_units_end_wakes_the_loop_only_once_the_unit_can_be_reaped(tmp_path):
    """The pipe closes before the process is reaped. A wake in between found the unit still
    running, and the loop slept a whole poll before it saw the exit. Here the gap is 0.3 s
    and the poll 20 s."""
    config = {"units": [RANK], "store_unit": 0, "node_timeout": 4, "run_id": "r", "job": "j", "poll_interval": 20}
    unit = guard.Guard(config, 0, ["sh", "-c", "exec >&- 2>&-; sleep 0.3; exit 3"], str(tmp_path))
    unit.start_child()
    assert unit.wake.wait(20)
    assert unit.proc.child.poll() == 3


@pytest.mark.parametrize("current, node_timeout, after", [(1, 10, 2), (8, 10, 10), (10, 10, 10), (1, 0.5, 1)])
def test_a_store_slow_to_answer_is_given_longer_waits_up_to_the_node_timeout(current, node_timeout, after):
    assert guard_policy.next_connect_timeout(current, node_timeout) == after


def test_the_watchdogs_allowance_runs_from_the_stores_first_answer(tmp_path, monkeypatch):
    """A guard that reached the store only late in its start allowance was ended at once:
    its last contact still read as the guard's start. A stand-in for torch's TCPStore: the
    guard's bookkeeping is under test here, the real store in tests/faults."""
    class Store:
        def __init__(self, host, port, is_master, timeout: timedelta, **kwargs):
            pass

        def set_timeout(self, timeout):
            pass

        def wait(self, keys, timeout):
            threading.Event().wait()

    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setitem(sys.modules, "torch.distributed", types.SimpleNamespace(TCPStore=Store))
    config = {"units": [SSHD, RANK], "store_unit": 0, "node_timeout": 10, "run_id": "r", "job": "j",
              "store": {"host": "127.0.0.1", "port": 1, "node": "node-2"}}
    late = guard.Guard(config, 1, ["true"], str(tmp_path))
    late.link.key = b"the run's key"
    late.last_ok -= 50  # 50 s of trying
    assert late.connect(timeout=1.0)
    assert late._store_limit() == 10 and guard.time.monotonic() - late.last_ok < 10


@pytest.mark.parametrize("waited, moved, others, over", [
    (0.5, {}, [1], False),              # the peer's guard has not beaten since: it may be gone
    (0.5, {1: 1}, [1], False),
    (1.0, {1: 2}, [1], True),           # alive and beating: the failure is this unit's to report
    (1.0, {1: 2, 2: 0}, [1, 2], False),
    (11.1, {}, [1], True),              # past the node timeout: the host's check has had its turn
    (0.0, {}, [], True),                # no other unit runs
])
def test_a_failure_that_blames_a_peer_waits_until_the_peers_guards_beat_or_the_node_timeout(waited, moved, others, over):
    assert guard_policy.peer_wait_over(waited, moved, others, node_timeout=10, poll=0.5) is over


class CountingStore:
    """A stand-in for the store's counters and keys: what _peer_wait_over reads of it."""

    def __init__(self):
        self.keys = {}

    def add(self, key, amount):
        self.keys[key] = self.keys.get(key, 0) + amount
        return self.keys[key]

    def check(self, keys):
        return all(k in self.keys for k in keys)

    def read(self, key):
        return None  # no unit has exited


def test_a_rank_that_lost_a_peer_aborts_only_once_the_peers_guards_are_seen_alive(tmp_path):
    """Gloo's connection reset on rank 0 follows whatever ended rank 1: rank 0 reports the run
    only once rank 1's guard beats (else rank 1's guard, or the host's check, names the cause);
    a failure with no such line reports at once."""
    config = {"units": [dict(RANK, name="tf-r-rank0", host="node-1", ranks=[0]), RANK], "store_unit": 0,
              "node_timeout": 10, "run_id": "r", "job": "j", "poll_interval": 0.5, "peer_error": PEER_ERROR_RE.pattern}
    unit = guard.Guard(config, 0, ["true"], str(tmp_path))
    unit.link.store = CountingStore()
    unit.proc.recent.append("RuntimeError: [pair.cc:598] Connection reset by peer [172.29.0.3]:41514\n")
    assert not unit._peer_wait_over()
    unit.store.add("hb/1", 1)
    assert not unit._peer_wait_over()
    unit.store.add("hb/1", 1)
    assert unit._peer_wait_over()
    plain = guard.Guard(config, 0, ["true"], str(tmp_path))
    plain.link.store = CountingStore()
    plain.proc.recent.append("ValueError: bad batch\n")
    assert plain._peer_wait_over()


@pytest.mark.parametrize("argv, target", [
    (["{python}", "{script}", "--epoch", "1"], ("script", "{script}", ["--epoch", "1"])),
    (["{python}", "{script}"], ("script", "{script}", [])),
    (["{python}", "-m", "torch.distributed.run", "--nnodes", "2"], ("module", "torch.distributed.run", ["--nnodes", "2"])),
    (["{python}", "-u", "{script}"], None),           # options change how the interpreter starts
    (["{python}", "-m", "-x"], None),
    (["{python}", "{missing}"], None),                # the interpreter's own error, as it words it
    (["sh", "{script}"], None),                       # another program
    (["/usr/bin/env", "{python}", "{script}"], None),
])
def test_only_this_interpreter_running_a_script_or_module_is_forked(tmp_path, argv, target):
    script = tmp_path / "train.py"
    script.write_text("")
    names = {"python": sys.executable, "script": str(script), "missing": str(tmp_path / "none.py")}
    expected = (target[0], target[1].format(**names), target[2]) if target else None
    assert guard_policy.preload_target([a.format(**names) for a in argv], sys.executable) == expected


def test_another_python_is_started_as_it_is(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    assert guard_policy.preload_target([sys.executable, str(script)], str(tmp_path / "bin" / "python3")) is None


def _start(unit: guard.Guard) -> None:
    """start_child; in the forked child, which raises ChildExit for guard.main to end the
    interpreter normally, end it here instead of unwinding into pytest."""
    try:
        unit.start_child()
    except guard_child.ChildExit as done:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(done.code)


def _forked_unit(tmp_path, monkeypatch, code: str, *args: str) -> guard.Guard:
    """A unit forked from its guard. torch is not on the controller (the fork's point is to
    share the guard's import of it), so the import is taken as done: what is under test is that
    the child runs and ends as ``python3 SCRIPT ARGS`` would."""
    monkeypatch.setattr(guard_child, "import_torch", lambda: True)
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "helper.py").write_text("VALUE = 'sibling'\n")
    script = tmp_path / "work" / "train.py"
    script.write_text(code)
    unit = dict(RANK, log=str(tmp_path / "rank.log"))
    config = {"units": [unit], "store_unit": 0, "node_timeout": 4, "run_id": "r", "job": "j", "poll_interval": 20}
    forked = guard.Guard(config, 0, [sys.executable, str(script), *args], str(tmp_path))
    _start(forked)
    assert isinstance(forked.proc.child, guard_child.Forked)
    assert forked.wake.wait(20)
    return forked


def test_a_forked_unit_runs_as_the_script_would(tmp_path, monkeypatch):
    code = """
import os, sys, helper
print(__name__, sys.argv, helper.VALUE, os.getpgid(0) == os.getpid(), sys.stdin.read() == "", flush=True)
print("to stderr", file=sys.stderr, flush=True)
sys.exit(3)
"""
    unit = _forked_unit(tmp_path, monkeypatch, code, "--epoch", "1")
    assert unit.proc.child.poll() == 3
    log = (tmp_path / "rank.log").read_text()
    script = str(tmp_path / "work" / "train.py")
    assert f"__main__ {[script, '--epoch', '1']} sibling True True\n" in log
    assert "to stderr\n" in log


def test_a_forked_module_runs_as_python_m_would(tmp_path, monkeypatch):
    """torchrun's agent is ``python3 -m torch.distributed.run``: the working folder is first on
    the import path, and argv[0] is the module's file."""
    (tmp_path / "tfagent.py").write_text("import sys\nprint(__name__, sys.argv, flush=True)\nsys.exit(4)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(guard_child, "import_torch", lambda: True)
    config = {"units": [dict(AGENT, log=str(tmp_path / "agent.log"))], "store_unit": 0, "node_timeout": 4,
              "run_id": "r", "job": "j", "poll_interval": 20}
    agent = guard.Guard(config, 0, [sys.executable, "-m", "tfagent", "--nnodes", "2"], str(tmp_path))
    _start(agent)
    assert isinstance(agent.proc.child, guard_child.Forked)
    assert agent.wake.wait(20)
    assert agent.proc.child.poll() == 4
    assert (tmp_path / "agent.log").read_text() == f"__main__ {[str(tmp_path / 'tfagent.py'), '--nnodes', '2']}\n"


def test_a_forked_unit_that_raises_exits_1_with_its_traceback(tmp_path, monkeypatch):
    unit = _forked_unit(tmp_path, monkeypatch, "raise ValueError('bad shape')\n")
    assert unit.proc.child.poll() == 1
    log = (tmp_path / "rank.log").read_text()
    assert "Traceback" in log and "ValueError: bad shape" in log


def test_a_forked_unit_interrupted_ends_as_python_does_on_ctrl_c(tmp_path, monkeypatch):
    unit = _forked_unit(tmp_path, monkeypatch, "raise KeyboardInterrupt\n")
    assert unit.proc.child.poll() == -signal.SIGINT
    assert "KeyboardInterrupt" in (tmp_path / "rank.log").read_text()


def test_a_forked_unit_is_stopped_by_its_process_group(tmp_path, monkeypatch):
    monkeypatch.setattr(guard_child, "import_torch", lambda: True)
    script = tmp_path / "train.py"
    script.write_text("import time\nprint('training', flush=True)\ntime.sleep(60)\n")
    config = {"units": [RANK], "store_unit": 0, "node_timeout": 4, "run_id": "r", "job": "j", "stop_grace": 5}
    unit = guard.Guard(config, 0, [sys.executable, str(script)], str(tmp_path))
    _start(unit)
    deadline = guard.time.monotonic() + 20
    while not unit.proc.has_progressed and guard.time.monotonic() < deadline:
        guard.time.sleep(0.05)
    assert unit.proc.has_progressed
    assert unit.stop_child() == 128 + signal.SIGTERM


def test_an_aborts_wake_for_an_attempt_that_ended_stops_nothing_of_the_next(tmp_path):
    """The abort's wait wakes for attempt 1; its thread, starved, acts only after the guard has
    begun attempt 2 and started that attempt's unit. It must not stop that unit: under load
    it once did, and the next attempt failed with its own guard's SIGTERM (143)."""
    config = {"units": [RANK], "store_unit": 0, "node_timeout": 4, "run_id": "r", "job": "j", "stop_grace": 1}
    unit = guard.Guard(config, 0, ["sleep", "60"], str(tmp_path))
    unit.start_child()
    unit.attempt = 2  # as begin_attempt sets it, before the attempt's unit starts
    assert unit._stop_on_abort(1, 0) is False
    assert unit.proc.poll() is None and "sigterm_at" not in unit.state
    assert unit._stop_on_abort(2, 0) is True
    assert guard_child.await_exit(unit.proc.child, 10) == -signal.SIGTERM


# A stand-in for torch: an in-memory TCPStore for a guard that hosts the store of a 1-unit run.
FAKE_TORCH = """
class TCPStore:
    def __init__(self, *args, **kwargs):
        self.data = {}
    def set_timeout(self, timeout):
        pass
    def add(self, key, n):
        self.data[key] = str(int(self.data.get(key, 0)) + n).encode()
        return int(self.data[key])
    def check(self, keys):
        return all(k in self.data for k in keys)
    def get(self, key):
        return self.data[key]
    def set(self, key, value):
        self.data[key] = value.encode() if isinstance(value, str) else value
    def compare_set(self, key, expected, value):
        if self.data.get(key, b"") == (expected.encode() if isinstance(expected, str) else expected):
            self.set(key, value)
        return self.data[key]
    def wait(self, keys, timeout):
        import time
        time.sleep(3600)
"""


def test_a_forked_script_ends_as_its_own_interpreter_would(tmp_path):
    """The real guard, run as a script: its forked rank's exit functions run at its end, and
    the guard reports the rank's exit code as its own."""
    fake = tmp_path / "fake" / "torch" / "distributed"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text(FAKE_TORCH)
    script = tmp_path / "train.py"
    # The script imports no torch: it has the guard's only if it was forked from the guard.
    # Its exit function pickles a class of its own, which needs it to be __main__ still.
    script.write_text("import atexit, pickle, sys\nclass Point:\n    pass\n"
                      "atexit.register(lambda: print('at exit', len(pickle.dumps(Point())) > 0, flush=True))\n"
                      "print('training', 'torch.distributed' in sys.modules, flush=True)\nsys.exit(3)\n")
    config = {"units": [dict(RANK, log=str(tmp_path / "rank.log"))], "store_unit": 0, "node_timeout": 4,
              "run_id": "r", "job": "j", "poll_interval": 0.2, "stop_grace": 1,
              "store": {"host": "127.0.0.1", "port": 0, "node": "node-2"}}
    (tmp_path / "guard.json").write_text(json.dumps(config))
    store_key(tmp_path)
    done = subprocess.run([sys.executable, guard.__file__, str(tmp_path / "guard.json"), "0", "--", sys.executable,
                           str(script)], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path / "fake")))
    assert done.returncode == 3, done.stderr
    assert (tmp_path / "rank.log").read_text().startswith("training True\nat exit True\n")
    record = json.loads((tmp_path / "guard-0.json").read_text())
    assert record["state"] == "exited" and record["exit_code"] == 3 and record["pid"] != os.getpid()


def test_the_guard_runs_from_a_run_folder_that_holds_only_what_the_launch_copies_there(tmp_path):
    """On a node the guard is a script in the run's folder, beside only run_vocab.GUARD_SOURCES
    (launch_spec copies them there): it imports its siblings from its own folder, with no
    collection and no PYTHONPATH, and supervises its unit through torch's real TCPStore."""
    pytest.importorskip("torch.distributed")
    run, port = guard_folder(tmp_path)
    config = {"units": [dict(RANK, log=str(run / "rank.log"))], "store_unit": 0, "node_timeout": 4,
              "run_id": "r", "job": "j", "poll_interval": 0.2, "stop_grace": 1,
              "store": {"host": "127.0.0.1", "port": port, "node": "node-2"}}
    (run / "guard.json").write_text(json.dumps(config))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    done = subprocess.run([sys.executable, str(run / run_vocab.GUARD_SOURCE), str(run / "guard.json"), "0", "--",
                           "sh", "-c", "echo training; exit 3"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    job = json.loads((run / "job.json").read_text())
    assert job["state"] == "failed" and job["abort"]["kind"] == "rank_failed"
    assert (run / "rank.log").read_text() == "training\n"
    # What the guard imported, Python cached beside it: its siblings, from its own folder.
    cached = sorted(p.name.split(".")[0] for p in (run / "__pycache__").iterdir())
    assert cached == sorted(name.removesuffix(".py") for name in run_vocab.GUARD_SOURCES
                     if name != run_vocab.GUARD_SOURCE)


def test_a_guard_that_ends_at_once_keeps_its_units_last_lines(tmp_path):
    """The guard ends without tearing its interpreter down (exit_now), but not before what its
    unit wrote last, a traceback say, has reached the log. Here the guard's own output is not
    read for a while, so its copy of the unit's lines lags behind when the unit is gone."""
    fake = tmp_path / "fake" / "torch" / "distributed"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    (fake / "__init__.py").write_text(FAKE_TORCH)
    script = tmp_path / "train.py"
    # About 90 KB: more than the guard's output pipe holds, less than both pipes together.
    script.write_text("for i in range(9000):\n    print('line', i)\nraise SystemExit('the last words')\n")
    config = {"units": [dict(RANK, log=str(tmp_path / "rank.log"))], "store_unit": 0, "node_timeout": 4,
              "run_id": "r", "job": "j", "poll_interval": 0.05, "stop_grace": 1,
              "store": {"host": "127.0.0.1", "port": 0, "node": "node-2"}}
    (tmp_path / "guard.json").write_text(json.dumps(config))
    store_key(tmp_path)
    proc = subprocess.Popen([sys.executable, guard.__file__, str(tmp_path / "guard.json"), "0", "--", sys.executable,
                             str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=str(tmp_path / "fake")))
    time.sleep(0.5)
    out = proc.stdout.read().decode()
    assert proc.wait(60) == 1
    log = (tmp_path / "rank.log").read_text().splitlines()
    assert len(log) == 9001 and log[-1] == "the last words"
    assert "the last words" in out
    assert json.loads((tmp_path / "guard-0.json").read_text())["exit_code"] == 1


def _guard_frozen(tmp_path, script: str, wait_until: str | None = None) -> subprocess.Popen:
    """A real guard of rank 1, its store a stand-in whose ``add`` blocks once the unit runs,
    as an op on a frozen master does (the node timeout is 60 s); its ``wait`` for the abort
    returns once the file ``wait_until`` exists, if given, with the file's bytes as the abort's
    value."""
    fake = tmp_path / "fake" / "torch" / "distributed"
    fake.mkdir(parents=True)
    (fake.parent / "__init__.py").write_text("")
    frozen = tmp_path / "frozen"
    source = FAKE_TORCH.replace(
        "    def add(self, key, n):\n",
        f"    def add(self, key, n):\n        import os, time\n"
        f"        while os.path.exists({str(frozen)!r}):\n            time.sleep(0.05)\n")
    if wait_until:
        source = source.replace("        import time\n        time.sleep(3600)\n",
                                f"        import os, time\n        while not os.path.exists({wait_until!r}):\n"
                                f"            time.sleep(0.05)\n"
                                f"        self.data[keys[0]] = open({wait_until!r}, 'rb').read()\n")
    (fake / "__init__.py").write_text(source)
    (tmp_path / "train.py").write_text(script)
    config = {"units": [dict(MPIRUN, log=str(tmp_path / "mpirun.log")), dict(RANK, log=str(tmp_path / "rank.log"))],
              "store_unit": 0, "node_timeout": 60, "run_id": "r", "job": "j", "poll_interval": 0.2, "stop_grace": 1,
              "store": {"host": "127.0.0.1", "port": 0, "node": "node-1"}}
    (tmp_path / "guard.json").write_text(json.dumps(config))
    store_key(tmp_path)
    proc = subprocess.Popen([sys.executable, guard.__file__, str(tmp_path / "guard.json"), "1", "--", sys.executable,
                             str(tmp_path / "train.py")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, PYTHONPATH=str(tmp_path / "fake")))
    log = tmp_path / "rank.log"
    try:
        deadline = time.monotonic() + 30
        while not (log.exists() and "training" in log.read_text()):
            assert time.monotonic() < deadline, "the unit never started"
            time.sleep(0.1)
        frozen.touch()
        time.sleep(1)
    except BaseException:
        proc.kill()
        raise
    return proc


def test_a_stop_reaches_a_guard_whose_store_froze(tmp_path):
    """A frozen master holds the guard's loop in a store op until the node timeout; a stop
    on the guard's own node still stops its unit, with the stop's reason."""
    proc = _guard_frozen(tmp_path, "import time\nprint('training', flush=True)\ntime.sleep(3600)\n")
    try:
        (tmp_path / "stop").write_text("stopped by a test")
        assert proc.wait(30) == 143
    finally:
        proc.kill()
    record = json.loads((tmp_path / "guard-1.json").read_text())
    assert record["state"] == "stopped" and record["stopped_because"] == "stopped by a test"


@pytest.mark.parametrize("pidfd", [True, False])
@pytest.mark.parametrize("forked", [False, True])
def test_the_wait_for_a_unit_returns_its_exit_or_times_out(tmp_path, monkeypatch, forked, pidfd):
    """await_exit, on a Popen and on a forked unit, with a pidfd and without (an older
    Python or kernel): a timeout while the unit runs, its exit code once it ends, and the
    same code again once it is reaped."""
    monkeypatch.setattr(guard_child, "import_torch", lambda: forked)
    if not pidfd:
        monkeypatch.delattr(guard_child.os, "pidfd_open", raising=False)
    script = tmp_path / "train.py"
    script.write_text("import sys, time\ntime.sleep(1)\nsys.exit(5)\n")
    config = {"units": [RANK], "store_unit": 0, "node_timeout": 4, "run_id": "r", "job": "j", "poll_interval": 20}
    unit = guard.Guard(config, 0, [sys.executable, str(script)], str(tmp_path))
    _start(unit)
    assert isinstance(unit.proc.child, guard_child.Forked) == forked
    with pytest.raises(subprocess.TimeoutExpired):
        guard_child.await_exit(unit.proc.child, 0.05)
    assert guard_child.await_exit(unit.proc.child, 30) == 5
    assert guard_child.await_exit(unit.proc.child, 0) == 5


def test_a_posted_abort_stops_the_unit_while_the_guards_loop_is_held(tmp_path):
    """The abort's wake sends the unit SIGTERM itself. The loop is held in a store op here
    and no stop file is written, so only that wake can stop the unit within the test's 30 s;
    the rank's own SIGTERM handler records what it got. An abort without the run's MAC,
    posted first, stops nothing, and the guard's log says it rejected it."""
    posted, got = tmp_path / "posted", tmp_path / "got"
    proc = _guard_frozen(tmp_path, f"import signal, sys, time\n"
                                   f"def on_term(signum, frame):\n    open({str(got)!r}, 'w').write(str(signum))\n"
                                   f"    sys.exit(0)\n"
                                   f"signal.signal(signal.SIGTERM, on_term)\nprint('training', flush=True)\n"
                                   f"time.sleep(3600)\n", wait_until=str(posted))
    abort = json.dumps({"kind": "stopped", "host": "node-1", "unit": None, "reason": "forged"})
    try:
        posted.write_text(abort)
        deadline = time.monotonic() + 30
        while "rejected abort/1" not in (tmp_path / "rank.log").read_text():
            assert time.monotonic() < deadline, "the forged abort was not rejected"
            time.sleep(0.1)
        time.sleep(1)
        assert not got.exists() and proc.poll() is None
        key = (tmp_path / run_vocab.STORE_KEY).read_bytes()
        posted.write_bytes(guard_store.SignedStore(None, key, None).sign(run_vocab.abort_key(1), abort))
        deadline = time.monotonic() + 30
        while not got.exists():
            assert time.monotonic() < deadline, "the unit was not stopped"
            time.sleep(0.1)
        assert got.read_text() == str(int(signal.SIGTERM))
        assert proc.poll() is None  # the loop, still held, is what records the stop
    finally:
        proc.kill()
        proc.wait()


def test_a_record_left_running_by_a_killed_guard_reads_as_gone(tmp_path):
    """``docker rm -f`` of a rank's container kills its guard before it can write how the unit
    ended: its record still says running. A reader of the run's folder tells that record from
    a live one by the guard's lock, which the kernel lets go of however the guard ends."""
    proc = _guard_frozen(tmp_path, "import time\nprint('training', flush=True)\ntime.sleep(3600)\n")
    try:
        unit = run_folder.read_run(str(tmp_path))["units"][0]
        assert unit["state"] == "running" and "recorded_state" not in unit
        proc.kill()
        proc.wait(30)
    finally:
        proc.kill()
    assert json.loads((tmp_path / "guard-1.json").read_text())["state"] == "running"
    info = run_folder.read_run(str(tmp_path))
    assert info["units"][0]["state"] == "gone" and info["units"][0]["recorded_state"] == "running"
    # A worker's folder whose every unit ended: the master's record says how the run ended.
    assert info["state"] == "exited"


def _phased_guards(tmp_path, master_script: str, worker_script: str, wrap_worker: bool = False,
                   held_by_shell: bool = False, **settings) -> tuple[Path, list[subprocess.Popen]]:
    """Two real guards with torch's TCPStore: unit 0, the master's rank, hosts the store and
    listens on a port of its own; unit 1 starts after it (the spec's ``after``), wrapped in a
    shell where ``wrap_worker`` (a unit its guard does not fork, as mpirun). Where
    ``held_by_shell``, unit 1's guard runs under a shell that waits for it, as a Slurm step's
    shell does (procs[0] is then that shell)."""
    run, port = guard_folder(tmp_path)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        listen_port = free.getsockname()[1]
    master = dict(RANK, name="tf-r-rank0", host="node-1", ranks=[0], log=str(run / "rank0.log"),
                  listen={"host": "127.0.0.1", "port": listen_port}, after=[])
    worker = dict(RANK, log=str(run / "rank1.log"), listen=None, after=[0])
    config = {"units": [master, worker], "store_unit": 0, "node_timeout": 10, "run_id": "r", "job": "j",
              "poll_interval": 0.2, "stop_grace": 1, "store": {"host": "127.0.0.1", "port": port, "node": "node-1"},
              **settings}
    (run / "guard.json").write_text(json.dumps(config))
    scripts = []
    for i, source in enumerate((master_script, worker_script)):
        scripts.append(tmp_path / f"unit{i}.py")
        scripts[-1].write_text(source.replace("PORT", str(listen_port)).replace("DIR", str(tmp_path)))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    wrapper = {1: ["sh", "-c", 'exec "$0" "$@"']} if wrap_worker else {}
    holder = {1: ["sh", "-c", '"$0" "$@"; echo "guard ended: $?"']} if held_by_shell else {}
    procs = [subprocess.Popen([*holder.get(i, []), sys.executable, str(run / run_vocab.GUARD_SOURCE),
                               str(run / "guard.json"), str(i), "--", *wrapper.get(i, []), sys.executable,
                               str(scripts[i])], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env, cwd=tmp_path) for i in (1, 0)]
    return run, procs


def _exits(procs: list[subprocess.Popen]) -> list[int]:
    """Each guard's exit code; none is left running, whatever happens."""
    try:
        return [p.wait(120) for p in procs]
    finally:
        for p in procs:
            p.kill()


MASTER_LISTENS_LATE = """import socket, time
time.sleep(1.5)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", PORT)); s.listen()
open("DIR/listening", "w").write(repr(time.time()))
time.sleep(2)
"""
WORKER = """import time
open("DIR/worker_started", "w").write(repr(time.time()))
"""


def test_a_unit_of_a_later_phase_starts_only_once_the_master_listens(tmp_path):
    """Both guards start at once; the worker's guard starts its unit only once the master's
    guard has seen the master's port answer, and records what it waits for meanwhile."""
    pytest.importorskip("torch.distributed")
    run, procs = _phased_guards(tmp_path, MASTER_LISTENS_LATE, WORKER)
    try:
        deadline = time.monotonic() + 60
        while not (run / "guard-1.json").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        waiting = json.loads((run / "guard-1.json").read_text())
        # procs[0] guards unit 1: its unit is forked already, held until the master listens.
        held = Path(f"/proc/{procs[0].pid}/task/{procs[0].pid}/children").read_text().split()
        assert [p.wait(120) for p in procs] == [0, 0]
    finally:
        for p in procs:
            p.kill()
    if not (tmp_path / "listening").exists():
        pytest.fail("the master's unit never listened")
    assert waiting["state"] == "starting" and waiting["waiting_for"] == ["tf-r-rank0"]
    assert "pid" not in waiting
    assert float((tmp_path / "worker_started").read_text()) >= float((tmp_path / "listening").read_text())
    assert json.loads((run / "job.json").read_text())["state"] == "succeeded"
    record = json.loads((run / "guard-1.json").read_text())
    assert record["state"] == "exited" and "waiting_for" not in record and "not_started" not in record
    # The unit that ran is the process forked before the guard's store threads started.
    assert held == [str(record["pid"])]


def test_a_unit_of_a_later_phase_that_is_not_forked_starts_from_the_fork_server(tmp_path):
    """A unit that its guard does not fork (a command of its own, as mpirun) cannot be forked
    before the guard's threads and held: it starts once the master listens, from the fork
    server, which has none of the guard's threads."""
    pytest.importorskip("torch.distributed")
    worker = WORKER + ("import os\nopen('DIR/worker_parent', 'w').write(str(os.getppid()) + ' '"
                       " + str(len(os.listdir(f'/proc/{os.getppid()}/task'))))\n")
    run, procs = _phased_guards(tmp_path, MASTER_LISTENS_LATE, worker, wrap_worker=True)
    assert _exits(procs) == [0, 0]
    assert float((tmp_path / "worker_started").read_text()) >= float((tmp_path / "listening").read_text())
    parent, threads = (int(x) for x in (tmp_path / "worker_parent").read_text().split())
    assert parent != procs[0].pid and threads == 1
    assert json.loads((run / "guard-1.json").read_text())["state"] == "exited"


def test_a_unit_waiting_for_a_master_that_failed_never_starts(tmp_path):
    """The master's rank fails before it listens: the worker's guard ends its wait with the
    run's abort, its unit never ran, and its record says so (the report: not started)."""
    pytest.importorskip("torch.distributed")
    run, procs = _phased_guards(tmp_path, "import time\ntime.sleep(1)\nraise SystemExit(3)\n", WORKER)
    assert _exits(procs) == [143, 3]
    assert not (tmp_path / "worker_started").exists()
    record = json.loads((run / "guard-1.json").read_text())
    assert record["state"] == "stopped" and record["not_started"] is True
    assert record["abort"]["kind"] == "rank_failed" and "rank 0 on node-1 exited with code 3" in record["stopped_because"]


def test_a_master_that_does_not_listen_in_time_ends_the_run_naming_it(tmp_path):
    """The master's rank runs but never opens its port: its guard ends the run once
    listen_timeout (launch_master_wait_timeout) has passed since the rank started, with or
    without a controller following, and the worker's unit never runs."""
    pytest.importorskip("torch.distributed")
    run, procs = _phased_guards(tmp_path, "import time\ntime.sleep(60)\n", WORKER, listen_timeout=2)
    started = time.monotonic()
    exits = _exits(procs)
    assert time.monotonic() - started < 30, "the guards outlived the master's allowance by far"
    assert not (tmp_path / "worker_started").exists()
    master = json.loads((run / "guard-0.json").read_text())
    assert master["abort"]["kind"] == "timeout"
    assert "rank 0 on node-1 did not listen on 127.0.0.1:" in master["abort"]["reason"]
    assert "within 2s (launch_master_wait_timeout)" in master["abort"]["reason"]
    # Its rank ran, and was stopped (SIGTERM's code), not left running.
    assert master["pid"] and (master["state"], master["exit_code"]) == ("stopped", 143)
    worker = json.loads((run / "guard-1.json").read_text())
    assert worker["not_started"] is True and worker["abort"]["kind"] == "timeout"
    assert exits[0] == 143
    assert json.loads((run / "job.json").read_text())["state"] == "failed"


def test_a_unit_of_a_later_phase_starts_once_the_master_finished_without_listening(tmp_path):
    """A script with no rendezvous: the master's rank ends with code 0 and never listens.
    The later phase starts then, as the launch's own wait did before the guards kept it."""
    pytest.importorskip("torch.distributed")
    run, procs = _phased_guards(tmp_path, "print('rank 0 alone')\n", WORKER)
    assert _exits(procs) == [0, 0]
    assert (tmp_path / "worker_started").exists()
    assert json.loads((run / "job.json").read_text())["state"] == "succeeded"


def test_a_unit_whose_schedulers_step_ended_fails_the_run_naming_it(tmp_path):
    """A Slurm step's shell killed (the step cancelled, its slurmstepd gone) leaves its guard
    and unit running outside the step. With parent_holds_unit, the guard counts its parent's
    end as its unit's failure: the run ends at once, blaming that unit; both guards end and no
    unit is left. (That such an abort is never restarted: test_guard_policy.)"""
    pytest.importorskip("torch.distributed")
    master = "import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', PORT)); s.listen()\ntime.sleep(120)\n"
    worker = "import os, time\nopen('DIR/worker_pid', 'w').write(str(os.getpid()))\ntime.sleep(120)\n"
    run, procs = _phased_guards(tmp_path, master, worker, held_by_shell=True, parent_holds_unit=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "worker_pid").exists():
            assert time.monotonic() < deadline, "the worker's unit never started"
            time.sleep(0.05)
        held = Path(f"/proc/{procs[0].pid}/task/{procs[0].pid}/children").read_text().split()
        assert len(held) == 1, "the shell holds the worker's guard"
        guard_pid = int(held[0])
        procs[0].kill()
        started = time.monotonic()
        assert procs[1].wait(60) == 143
        ended_in = time.monotonic() - started
    finally:
        for p in procs:
            p.kill()
    unit_pid = int((tmp_path / "worker_pid").read_text())
    for pid in (guard_pid, unit_pid):
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert ended_in < 10, "the master's guard waited for a node timeout instead"
    job = json.loads((run / "job.json").read_text())
    assert job["state"] == "failed"
    assert (job["abort"]["kind"], job["abort"]["unit"]) == ("rank_failed", "tf-r-rank1")
    assert "its scheduler's step ended" in job["abort"]["reason"]
    worker_record = json.loads((run / "guard-1.json").read_text())
    # Its own failure (the master's guard says "stopped"): its unit ended by its guard's SIGTERM.
    assert (worker_record["state"], worker_record["exit_code"]) == ("exited", 143)
    assert json.loads((run / "guard-0.json").read_text())["state"] == "stopped"


def test_a_guard_without_parent_holds_unit_outlives_its_parent(tmp_path):
    """The process mode's guard is started by a module that exits at once: its parent's end
    means nothing there, and the run finishes."""
    pytest.importorskip("torch.distributed")
    master = "import socket, time\ns = socket.socket(); s.bind(('127.0.0.1', PORT)); s.listen()\ntime.sleep(3)\n"
    worker = "import time\nopen('DIR/worker_started', 'w').write('1')\ntime.sleep(3)\n"
    run, procs = _phased_guards(tmp_path, master, worker, held_by_shell=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "worker_started").exists():
            assert time.monotonic() < deadline, "the worker's unit never started"
            time.sleep(0.05)
        procs[0].kill()
        assert procs[1].wait(60) == 0
        deadline = time.monotonic() + 60
        while json.loads((run / "guard-1.json").read_text()).get("state") not in ("exited", "failed", "stopped"):
            assert time.monotonic() < deadline, "the worker's guard never ended"
            time.sleep(0.1)
    finally:
        for p in procs:
            p.kill()
    assert json.loads((run / "job.json").read_text())["state"] == "succeeded"


def test_the_interface_towards_an_address_is_the_one_that_holds_the_nodes_own_address_there():
    # A link back under a new name (issue 58) leaves GLOO_SOCKET_IFNAME naming none: the guard
    # then names the interface that leads to the attempt's MASTER_ADDR, here loopback's.
    assert guard_child.interface_towards("127.0.0.1") == "lo"
    assert guard_child.interface_gone("lo") is False
    assert guard_child.interface_gone("tf-none0") is True
