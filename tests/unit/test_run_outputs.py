"""A node's end of a run in one module run (run_outputs, which collect_run calls): the stop
asked, the units ended, the secret file gone, and everything packed into one archive that
the controller puts in place. Real processes on this machine, no nodes."""

import base64
import io
import json
import os
import signal
import sys
import tarfile

import pytest
from ansible.module_utils.testing import patch_module_args
from test_rank_processes import _start, _until

from ansible_collections.torchfleet.cluster.plugins.module_utils import rank_files as rf
from ansible_collections.torchfleet.cluster.plugins.modules import run_outputs
from torchfleet import outputs, report
from torchfleet import run_vocab as vocab

pytestmark = pytest.mark.skipif(rf.systemd(), reason="this machine runs systemd: ranks become units")


def _run(capsys, **args):
    with patch_module_args(args):
        with pytest.raises(SystemExit):
            run_outputs.main()
    return json.loads(capsys.readouterr().out)


def _members(result):
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(result["archive_b64"])), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isreg()}


def test_a_rank_left_running_is_stopped_after_its_wait_and_everything_comes_back_in_one_result(tmp_path, capsys):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    # One rank ignores SIGTERM, as a rank stuck in a collective may; one has ended.
    _start(run, 0, "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True);"
                   " time.sleep(60)")
    _start(run, 1, "print('done')")
    _until(run, lambda found: len(found) == 2 and found[1]["exit_code"] == 0 and os.path.exists(found[0]["log"])
           and "up" in open(found[0]["log"]).read())
    (run / vocab.SECRET_ENV).write_text("TOKEN=x\n")
    (run / "metrics.json").write_text("{}")
    result = _run(capsys, run_dir=str(run), wanted=["rank-0.log", "rank-1.log", "job.json"], own=["rank-*"],
                  max_bytes=1 << 20, units={"kind": "process", "run_id": "r1", "wait_s": 0.5, "grace_s": 0.5},
                  remove=[str(run / vocab.SECRET_ENV)])
    assert result["changed"] and not result.get("failed")
    assert [(c["rank"], c["exit_code"], c["stopped_by_torchfleet"]) for c in result["containers"]] == \
        [(0, 128 + signal.SIGKILL, True), (1, 0, False)]
    assert not (run / vocab.SECRET_ENV).exists()
    assert result["found"] == ["rank-0.log", "rank-1.log"] and result["archive"] is None
    members = _members(result)
    assert members["run/rank-0.log"] == b"up\n" and members["run/rank-1.log"] == b"done\n"
    assert members["out/metrics.json"] == b"{}" and not any(name.startswith("out/rank-") for name in members)
    # Nothing of the archive stays on the node.
    assert os.listdir(run.parent) == ["r1"]


def test_a_stop_is_asked_of_a_running_run_only_and_an_archive_over_the_limit_stays_for_a_fetch(tmp_path, capsys):
    run = tmp_path / "runs" / "r2"
    run.mkdir(parents=True)
    (run / vocab.JOB).write_text(json.dumps({"state": "running"}))
    (run / "big.bin").write_bytes(os.urandom(64 << 10))
    result = _run(capsys, run_dir=str(run), own=["job.json", "stop"], max_bytes=1 << 20, inline_max=1024,
                  stop_reason="stopped by the launch: x")
    assert (run / vocab.STOP).read_text() == "stopped by the launch: x\n" and result["changed"]
    assert result["archive_b64"] is None and os.path.dirname(result["archive"]) == str(run.parent)
    placed = outputs.unpack(result["archive"], tmp_path, {}, tmp_path / "out" / "node-1")
    assert placed == ([], ["big.bin"]) and (tmp_path / "out" / "node-1" / "big.bin").read_bytes() == \
        (run / "big.bin").read_bytes()
    # A second ask changes nothing: the stop file is there.
    os.unlink(result["archive"])
    assert not _run(capsys, run_dir=str(run), stop_reason="again")["changed"]
    assert (run / vocab.STOP).read_text() == "stopped by the launch: x\n"


def test_a_node_without_the_run_answers_empty(tmp_path, capsys):
    result = _run(capsys, run_dir=str(tmp_path / "runs" / "none"), wanted=["rank-0.log"],
                  units={"kind": "process", "run_id": "none", "wait_s": 0, "grace_s": 0}, stop_reason="x")
    assert not result["changed"] and result["found"] == [] and result["containers"] == []


def test_the_end_comes_from_the_runs_spec():
    spec = {"run_id": "r1", "image": None, "guard": {"stop_wait": 42.0, "stop_grace": 7}, "secret_env_file": True}
    assert report.run_end(spec) == {"units": {"kind": "process", "run_id": "r1", "wait_s": 42.0, "grace_s": 7},
                                    "remove": [vocab.SECRET_ENV]}
    spec.update(image="torchfleet/train:1", secret_env_file=False)
    assert report.run_end(spec)["units"]["kind"] == "container" and report.run_end(spec)["remove"] == []


def _script(run, args):
    """run_end.py as collect_run runs it: from the run's folder, which holds it and its modules
    as a launch copies them (run_vocab.SCRIPT_SOURCES), with no collection, PYTHONPATH or
    Ansible in reach, its options on stdin."""
    import shutil
    import subprocess

    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_end

    for name in vocab.SCRIPT_SOURCES + (vocab.VOCAB_SOURCE,):
        shutil.copy(os.path.join(os.path.dirname(run_end.__file__), name), run / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, "-E", "-s", str(run / vocab.END_SOURCE)], input=json.dumps(args),
                          capture_output=True, text=True, env=env, cwd="/", timeout=60)


def test_the_run_folders_own_script_ends_and_packs_as_the_module_does(tmp_path):
    run = tmp_path / "runs" / "r3"
    run.mkdir(parents=True)
    for rank in (0, 1):
        _start(run, rank, "import time; print('training', flush=True); time.sleep(300)")
    _until(run, lambda found: len(found) == 2 and all(os.path.exists(e["log"]) and "training" in open(e["log"]).read()
                                                      for e in found), timeout=60)
    (run / vocab.SECRET_ENV).write_text("TOKEN=x\n")
    (run / "metrics.csv").write_text("1,2\n")
    done = _script(run, {"run_dir": str(run), "wanted": ["rank-0.log", "checksum-rank-0.txt"],
                         "own": ["rank-*", "*.py", "__pycache__", vocab.SECRET_ENV, "*.lock"], "max_bytes": 1 << 20,
                         "units": {"kind": "process", "run_id": "r3", "wait_s": 0, "grace_s": 1},
                         "remove": [str(run / vocab.SECRET_ENV)], "stop_reason": "stopped by a test"})
    result = json.loads(done.stdout)
    assert done.returncode == 0 and not result.get("failed"), (done.stdout, done.stderr)
    assert [(c["rank"], c["running"], c["stopped_by_torchfleet"]) for c in result["containers"]] == \
        [(0, False, True), (1, False, True)]
    assert not (run / vocab.SECRET_ENV).exists()
    assert result["found"] == ["rank-0.log"] and result["taken"] == [1, 4]
    assert _members(result) == {"run/rank-0.log": b"training\n", "out/metrics.csv": b"1,2\n"}
    # Its modules came from the run's folder: Python cached them beside it.
    cached = {p.name.split(".")[0] for p in (run / "__pycache__").iterdir()}
    assert {"rank_files", "out_folder", "run_folder", "run_vocab"} <= cached


def test_a_run_folders_script_that_does_not_know_an_option_leaves_the_call_to_the_module(tmp_path):
    run = tmp_path / "runs" / "r4"
    run.mkdir(parents=True)
    done = _script(run, {"run_dir": str(run), "an_option_of_a_later_launch": True})
    assert done.returncode == 3 and done.stdout == ""
    done = _script(run, {"run_dir": str(run), "units": {"kind": "vm"}})
    assert json.loads(done.stdout) == {"failed": True, "msg": "units.kind must be process or container, not 'vm'"}
