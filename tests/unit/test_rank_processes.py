"""The bare-process supervisor's files and exit codes, on this machine, with no nodes.

Without systemd (as here) every rank is a shell in its own session that records the
rank's exit code; these tests start real processes and read what the module reports.
"""

import hashlib
import os
import signal
import sys
import time

import pytest

from ansible_collections.torchfleet.cluster.plugins.modules import rank_processes as rp
from ansible_collections.torchfleet.cluster.plugins.module_utils import rank_files as rf

pytestmark = pytest.mark.skipif(rf.systemd(), reason="this machine runs systemd: ranks become units")


def _start(run_dir, rank, code, job="unit", **extra):
    entry = {"rank": rank, "name": f"rank-{rank}", "job": job,
             "argv": [sys.executable, "-c", code], "env": {"RANK": str(rank)}, **extra}
    rp.start(None, str(run_dir), entry)
    return run_dir / f"rank-{rank}"


def _until(run_dir, pred, timeout=10, **kw):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = rp.find(None, str(run_dir), **kw)
        if pred(found):
            return found
        time.sleep(0.05)
    raise AssertionError(f"not reached: {found}")


def test_a_rank_that_succeeds_leaves_pid_meta_log_and_exit_code(tmp_path):
    base = _start(tmp_path, 0, "import os; print('hello from', os.environ['RANK'])")
    (entry,) = _until(tmp_path, lambda f: f and not f[0]["running"])
    pid = int((tmp_path / "rank-0.pid").read_text())
    assert pid > 1 and entry["pid"] == pid
    assert (tmp_path / "rank-0.meta").read_text().split() == ["0", "rank", "unit"]
    assert entry["exit_code"] == 0 and entry["status"] == "exited" and not entry["vanished"]
    assert "hello from 0" in (tmp_path / "rank-0.log").read_text()
    assert base.with_suffix(".exit").read_text().strip() == "0"


def test_a_failing_rank_reports_its_own_exit_code(tmp_path):
    _start(tmp_path, 1, "import sys; sys.exit(3)")
    (entry,) = _until(tmp_path, lambda f: f and not f[0]["running"])
    assert entry["exit_code"] == 3 and entry["status"] == "exited"


def test_a_rank_killed_by_a_signal_reports_128_plus_the_signal(tmp_path):
    _start(tmp_path, 2, "import time; print('up', flush=True); time.sleep(60)")
    log = tmp_path / "rank-2.log"
    # The shell creates the log a moment after the meta file appears.
    _until(tmp_path, lambda f: f and log.exists() and "up" in log.read_text())
    shell = int((tmp_path / "rank-2.pid").read_text())
    child = int(open(f"/proc/{shell}/task/{shell}/children").read().split()[0])
    os.kill(child, signal.SIGTERM)
    (entry,) = _until(tmp_path, lambda f: f and not f[0]["running"])
    assert entry["exit_code"] == 128 + signal.SIGTERM


def test_a_rank_whose_supervisor_died_is_vanished_not_successful(tmp_path):
    _start(tmp_path, 0, "import time; time.sleep(60)")
    pid = int((tmp_path / "rank-0.pid").read_text())
    os.killpg(pid, signal.SIGKILL)
    (entry,) = _until(tmp_path, lambda f: f and not f[0]["running"])
    assert entry["vanished"] and entry["exit_code"] is None and entry["status"] == "vanished"
    assert not entry["stopped_by_torchfleet"]


def test_stop_kills_the_whole_group_and_marks_it_stopped_by_torchfleet(tmp_path):
    # The rank starts a grandchild: stopping the rank must not leave it behind.
    _start(tmp_path, 0, "import subprocess, time; p = subprocess.Popen(['sleep', '60']);"
                        " open('child.pid', 'w').write(str(p.pid)); time.sleep(60)", cwd=str(tmp_path))
    _until(tmp_path, lambda f: (tmp_path / "child.pid").exists() and (tmp_path / "child.pid").read_text())
    grandchild = int((tmp_path / "child.pid").read_text())
    (entry,) = rp.find(None, str(tmp_path))
    rf.stop(None, entry)
    (entry,) = _until(tmp_path, lambda f: not f[0]["running"])
    assert entry["stopped_by_torchfleet"] and (tmp_path / "rank-0.stopped").exists()
    deadline = time.monotonic() + 5
    while rf.alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not rf.alive(grandchild)


def test_find_with_recurse_and_job_selects_only_that_jobs_ranks(tmp_path):
    (tmp_path / "run-a").mkdir()
    (tmp_path / "run-b").mkdir()
    _start(tmp_path / "run-a", 0, "pass", job="alpha")
    _start(tmp_path / "run-b", 0, "pass", job="beta")
    found = _until(tmp_path, lambda f: len(f) == 2 and not any(e["running"] for e in f), recurse=True)
    assert {os.path.basename(os.path.dirname(e["base"])) for e in found} == {"run-a", "run-b"}
    (beta,) = rp.find(None, str(tmp_path), recurse=True, job="beta")
    assert "run-b" in beta["base"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin to one of them")
def test_a_cpuset_pins_the_rank(tmp_path):
    cpu = max(os.sched_getaffinity(0))
    _start(tmp_path, 0, "import os; print(sorted(os.sched_getaffinity(0)))", cpuset=str(cpu))
    _until(tmp_path, lambda f: f and not f[0]["running"])
    assert (tmp_path / "rank-0.log").read_text().strip() == f"[{cpu}]"


def test_the_secret_env_reaches_the_rank_through_a_private_file_that_then_goes(tmp_path, monkeypatch):
    secret = "tfleak-unit 'quoted' $HOME\nsecond line"
    # The rank compares a digest, so its own command line holds no secret either.
    code = ("import hashlib, os, time; ok = hashlib.sha256(os.environ['API_TOKEN'].encode()).hexdigest() == %r;"
            " print('token ok' if ok else 'token WRONG', flush=True); time.sleep(60)"
            % hashlib.sha256(secret.encode()).hexdigest())
    entry = {"rank": 0, "name": "rank-0", "job": "unit", "argv": [sys.executable, "-c", code], "env": {"RANK": "0"}}
    seen = {}
    real_popen = rp.subprocess.Popen

    def popen(cmd, **kwargs):
        # What the supervising shell is started with: its command line and the file beside it.
        seen["cmd"] = cmd
        seen["mode"] = oct(os.stat(kwargs["env"]["TF_SECRETS"]).st_mode & 0o777)
        return real_popen(cmd, **kwargs)

    monkeypatch.setattr(rp.subprocess, "Popen", popen)
    rp.start(None, str(tmp_path), entry, {"API_TOKEN": secret})
    log = tmp_path / "rank-0.log"
    _until(tmp_path, lambda f: log.exists() and "token" in log.read_text())
    shell = int((tmp_path / "rank-0.pid").read_text())
    rank = int(open(f"/proc/{shell}/task/{shell}/children").read().split()[0])
    try:
        assert log.read_text().strip() == "token ok"
        assert seen["mode"] == "0o600"
        assert not (tmp_path / "rank-0.secret").exists()
        for pid in (shell, rank):
            assert b"tfleak-unit" not in open(f"/proc/{pid}/cmdline", "rb").read()
        assert all("tfleak-unit" not in str(part) for part in seen["cmd"])
    finally:
        os.killpg(shell, signal.SIGKILL)
