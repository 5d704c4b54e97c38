"""A node's run folders: the start writes a run's files in one call and prunes old runs."""

import json

from ansible_collections.torchfleet.cluster.plugins.modules import run_state


def _run(runs_dir, run_id, state):
    run_dir = runs_dir / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "guard-0.json").write_text(json.dumps({"unit": 0, "state": state}))


def test_files_are_written_whole_and_only_when_their_content_changes(tmp_path):
    assert run_state.write_files(str(tmp_path), {"spec.json": "{}\n", "guard.py": "pass\n"}) == ["spec.json", "guard.py"]
    assert (tmp_path / "spec.json").read_text() == "{}\n"
    assert oct((tmp_path / "guard.py").stat().st_mode & 0o777) == "0o644"
    assert run_state.write_files(str(tmp_path), {"spec.json": "{}\n", "guard.py": "print()\n"}) == ["guard.py"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["guard.py", "spec.json"]  # no temporary left


def test_pruning_keeps_the_newest_finished_runs_and_every_running_one(tmp_path):
    for run_id in ("20261101-000000-a", "20261102-000000-b", "20261103-000000-c"):
        _run(tmp_path, run_id, "exited")
    _run(tmp_path, "20261100-000000-old-but-running", "running")
    runs = [run_state.read_run(str(d)) for d in sorted(tmp_path.iterdir())]
    assert run_state.prune(str(tmp_path), runs, 1) == ["20261101-000000-a", "20261102-000000-b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["20261100-000000-old-but-running", "20261103-000000-c"]
