"""A node's run folders (module_utils.run_folder): a start makes one in one call and prunes old runs."""

import json
import os
import threading
import time

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_folder


def _run(runs_dir, run_id, state):
    run_dir = runs_dir / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "guard-0.json").write_text(json.dumps({"unit": 0, "state": state}))


def test_files_are_written_whole_and_only_when_their_content_changes(tmp_path):
    assert run_folder.write_files(str(tmp_path), {"spec.json": "{}\n", "guard.py": "pass\n"}) == ["spec.json", "guard.py"]
    assert (tmp_path / "spec.json").read_text() == "{}\n"
    assert oct((tmp_path / "guard.py").stat().st_mode & 0o777) == "0o644"
    assert run_folder.write_files(str(tmp_path), {"spec.json": "{}\n", "guard.py": "print()\n"}) == ["guard.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["guard.py", "spec.json"]  # no temporary left


def test_pruning_keeps_the_newest_finished_runs_and_every_running_one(tmp_path):
    for run_id in ("20261101-000000-a", "20261102-000000-b", "20261103-000000-c"):
        _run(tmp_path, run_id, "exited")
    _run(tmp_path, "20261100-000000-old-but-running", "running")
    runs = [run_folder.read_run(str(d)) for d in sorted(tmp_path.iterdir())]
    assert run_folder.prune(str(tmp_path), runs, 1) == ["20261101-000000-a", "20261102-000000-b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["20261100-000000-old-but-running", "20261103-000000-c"]


def test_prepare_installs_the_workload_prunes_and_writes_and_refuses_folder_names(tmp_path):
    import base64
    import io
    import tarfile

    import pytest

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("train.py")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"ok"))
    node = tmp_path / "node"
    for run_id in ("20261101-000000-a", "20261102-000000-b"):
        _run(node / "runs", run_id, "exited")
    workload = {"dest": str(node / "workloads" / "j"), "keep": str(node / "workloads" / "j.tar"),
                "data": base64.b64encode(buf.getvalue()).decode()}
    done = run_folder.prepare(str(node), "20261103-000000-c", {"spec.json": "{}"}, keep=1, workload=workload)
    assert done["changed"] and done["removed"] == ["20261101-000000-a"] and done["written"] == ["spec.json"]
    assert (node / "workloads" / "j" / "train.py").read_bytes() == b"ok"
    assert (node / "runs" / "20261103-000000-c" / "spec.json").read_text() == "{}"
    # The same call again changes nothing.
    assert run_folder.prepare(str(node), "20261103-000000-c", {"spec.json": "{}"}, keep=1)["changed"] is False
    with pytest.raises(run_folder.PrepareError, match="must be plain file names"):
        run_folder.prepare(str(node), "20261103-000000-c", {"../x": ""})


def test_a_followed_run_answers_when_its_job_ends_not_after_the_whole_wait(tmp_path):
    """The master waits on job.json itself: a controller's call returns as the run ends."""
    (tmp_path / "job.json").write_text(json.dumps({"state": "running"}))
    started = time.monotonic()
    run_folder.wait_for_end(str(tmp_path), wait=0.3, poll=0.05)
    assert 0.3 <= time.monotonic() - started < 5  # still running: the whole wait

    def end():
        time.sleep(0.3)
        (tmp_path / "job.json.tmp").write_text(json.dumps({"state": "failed"}))
        os.replace(tmp_path / "job.json.tmp", tmp_path / "job.json")

    ender = threading.Thread(target=end)
    started = time.monotonic()
    ender.start()
    run_folder.wait_for_end(str(tmp_path), wait=30, poll=0.05)
    ender.join()
    assert 0.3 <= time.monotonic() - started < 5


def test_the_module_waits_when_asked_also_for_a_run_not_started_yet(tmp_path, capsys):
    """run_state with wait: one call covers a start that has not written job.json yet, and
    answers as the run ends."""
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.torchfleet.cluster.plugins.modules import run_state

    run_dir = tmp_path / "runs" / "r1"

    def start_then_end():
        time.sleep(0.3)
        run_dir.mkdir(parents=True)
        (run_dir / "job.json").write_text(json.dumps({"state": "running"}))
        time.sleep(0.3)
        (run_dir / "job.json.tmp").write_text(json.dumps({"state": "succeeded", "units": []}))
        os.replace(run_dir / "job.json.tmp", run_dir / "job.json")

    runner = threading.Thread(target=start_then_end)
    started = time.monotonic()
    runner.start()
    with patch_module_args({"node_dir": str(tmp_path), "run_id": "r1", "wait": 30, "poll": 0.05}):
        try:
            run_state.main()
        except SystemExit:
            pass
    runner.join()
    assert 0.6 <= time.monotonic() - started < 10
    result = json.loads(capsys.readouterr().out)
    assert result["found"] and result["run"]["job_state"]["state"] == "succeeded"


def test_a_run_says_whether_it_holds_its_spec(tmp_path):
    """A start cut short can leave a run's folder without spec.json; attach, stop and
    collect take the spec from a node whose run says it has one."""
    _run(tmp_path, "20261101-000000-a", "running")
    assert run_folder.read_run(str(tmp_path / "20261101-000000-a"))["has_spec"] is False
    run_folder.write_files(str(tmp_path / "20261101-000000-a"), {"spec.json": "{}\n"})
    assert run_folder.read_run(str(tmp_path / "20261101-000000-a"), with_spec=True)["has_spec"] is True


def test_the_run_folders_own_read_answers_as_the_module_does(tmp_path):
    """run_read.py as run_state's action runs it: from the run's folder, with no collection,
    PYTHONPATH or Ansible in reach, its options on stdin. A stop asked of a running run is
    written once; an option it does not know leaves the call to the module (no answer)."""
    import shutil
    import subprocess
    import sys

    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab

    _run(tmp_path, "r1", "running")
    run = tmp_path / "r1"
    for name in run_vocab.SCRIPT_SOURCES + (run_vocab.VOCAB_SOURCE,):
        shutil.copy(os.path.join(os.path.dirname(run_folder.__file__), name), run / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}

    def ask(**args):
        done = subprocess.run([sys.executable, "-E", "-s", str(run / run_vocab.READ_SOURCE)], env=env, cwd="/",
                              input=json.dumps(dict(args, run_dir=str(run))), capture_output=True, text=True, timeout=60)
        return done.returncode, json.loads(done.stdout) if done.stdout else None

    code, answer = ask(state="stopped", reason="stopped by a test", spec=True)
    assert code == 0 and answer["changed"] and answer["found"], answer
    assert answer["run"]["stop_requested"] and answer["run"]["units"][0]["state"] == "running"
    assert (run / run_vocab.STOP).read_text() == "stopped by a test\n"
    assert ask(state="stopped", reason="again")[1]["changed"] is False
    assert ask(state="info", an_option_of_a_later_launch=1) == (3, None)
