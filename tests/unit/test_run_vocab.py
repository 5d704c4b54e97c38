"""The run's vocabulary (module_utils/run_vocab.py) is the one place that spells a run's files,
store keys, states and abort kinds; what the report makes of a node the controller lost; the
grace a stopped unit gets, as its guard records it; and the settings a run carries."""

import ast
import re
import signal
import sys
import time
from pathlib import Path

import pytest
from harness import ROOT

from ansible_collections.torchfleet.cluster.plugins.module_utils import guard, guard_records, run_folder, run_vocab
from torchfleet import api, cli, report, spec
from torchfleet import run_vocab as package_vocab

# Every spelling of a run's file names and store keys, as a string constant of code would hold it.
SPELLINGS = [(name, re.compile(pattern)) for name, pattern in (
    ("spec.json", r"spec\.json"), ("guard.json", r"guard\.json"), ("job.json", r"job\.json"),
    ("summary.json", r"summary\.json"), ("guard-N.json", r"\bguard-"), ("node.secret.env", r"node\.secret\.env"),
    ("run_vocab.py", r"run_vocab\.py"), ("hb/N", r"^hb/"), ("exit/N", r"^exit/"))]
SOURCES = [p for folder in ("torchfleet", "plugins", "bench")
           for p in sorted((ROOT / folder).rglob("*.py"))]
# A module's documentation blocks name the files for the reader, not for the code.
DOC_BLOCKS = {"DOCUMENTATION", "EXAMPLES", "RETURN"}


def _code_strings(path: Path):
    """Every string constant of a Python file's code: neither docstrings nor doc blocks."""
    tree = ast.parse(path.read_text())
    skip = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(node, (ast.Module, ast.ClassDef,
                                                                                  ast.FunctionDef)):
            skip.add(id(body[0].value))
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) in DOC_BLOCKS for t in node.targets):
            skip.add(id(node.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value


def test_only_the_vocabulary_spells_a_runs_file_names_and_store_keys():
    found = [f"{path.relative_to(ROOT)}:{line}: {name}" for path in SOURCES if path.name != "run_vocab.py"
             for line, text in _code_strings(path) for name, spelling in SPELLINGS if spelling.search(text)]
    assert found == []


# The per-rank and per-unit names: rank logs, checksums, a bare-process unit's files.
UNIT_SPELLINGS = [(name, re.compile(pattern)) for name, pattern in (
    ("rank-N.log", r"^rank-"), ("checksum-rank-N.txt", r"checksum-rank"),
    ("NAME.meta, .pid, .exit, .unit, .stopped, .secret", r"^\*?\.(meta|pid|exit|unit|stopped|secret)$"))]


def test_only_the_vocabulary_spells_rank_logs_checksums_and_a_process_units_files():
    found = {(str(path.relative_to(ROOT)), name, line) for path in SOURCES if path.name != "run_vocab.py"
             for line, text in _code_strings(path) for name, spelling in UNIT_SPELLINGS if spelling.search(text)}
    assert sorted(f"{p}:{line}: {name}" for p, name, line in found) == []


def test_the_per_rank_and_per_unit_names_are_the_ones_the_nodes_and_the_report_use():
    assert [run_vocab.rank_log(3), run_vocab.checksum_file(3)] == ["rank-3.log", "checksum-rank-3.txt"]
    assert [run_vocab.unit_log("rank", 0), run_vocab.unit_log("torchrun", 0), run_vocab.unit_log("sshd")] == \
        ["rank-0.log", "torchrun.log", "sshd.log"]
    assert sorted(run_vocab.process_file("/run/r/rank-1", kind) for kind in run_vocab.ProcessFile) == [
        f"/run/r/rank-1.{s}" for s in ("exit", "log", "meta", "pid", "secret", "stopped", "unit")]


def test_every_store_op_names_its_key_through_the_vocabulary():
    """The guards' store ops (check, get, set, add, wait, compare_set) take no key spelled out."""
    ops = {"check", "get", "set", "add", "wait", "compare_set"}
    found = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ops \
                    and "store" in ast.unparse(node.func.value) and node.args:
                key = node.args[0].elts[0] if isinstance(node.args[0], ast.List) and node.args[0].elts else node.args[0]
                if isinstance(key, (ast.Constant, ast.JoinedStr)):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == []


def test_the_launch_roles_tasks_spell_no_run_file_and_keep_no_abort_folder_of_their_own():
    found = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "roles").rglob("*.yml"))
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if not line.lstrip().startswith("#") and (any(s.search(line) for _, s in SPELLINGS) or "/.abort" in line)]
    assert found == []


def test_the_package_and_the_collection_share_one_vocabulary():
    # One file: the collection carries the package's (a link in the checkout, a copy once built).
    assert Path(run_vocab.__file__).resolve() == Path(package_vocab.__file__).resolve()
    assert package_vocab.JOB == run_vocab.JOB and package_vocab.exit_key(3) == run_vocab.exit_key(3)
    assert not hasattr(guard, "ABORT_KINDS") and guard_records.SECRET_FILES == (run_vocab.SECRET_ENV,)


def test_words_are_their_values_in_json_comparisons_keys_and_text():
    import json

    kind = run_vocab.AbortKind.NOT_STARTED
    assert kind == "not_started" and f"{kind}" == "not_started" and json.dumps({"kind": kind}) == '{"kind": "not_started"}'
    assert {"not_started": 3}[kind] == 3 and {kind: 3}["not_started"] == 3
    assert "exited" in run_vocab.UNIT_FINAL


@pytest.mark.parametrize("info, state", [
    ({"job_state": {"state": "succeeded"}, "units": [{"state": "running"}]}, "succeeded"),
    ({"job_state": None, "units": []}, "unknown"),
    ({"job_state": None, "units": [{"state": "exited"}, {"state": "starting"}]}, "running"),
    ({"job_state": None, "units": [{"state": "stopped", "abort": {"kind": "node_lost"}}]}, "failed"),
    ({"job_state": None, "units": [{"state": "exited"}, {"state": "stopped"}]}, "exited"),
])
def test_a_run_folder_is_summarized_from_the_masters_record_else_its_units(info, state):
    assert run_vocab.summarize(info) == state


def test_a_run_folder_read_on_a_node_says_its_state_in_the_vocabularys_words(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    (run / run_vocab.guard_record(0)).write_text('{"unit": 0, "state": "stopped", "abort": {"kind": "stalled"}}')
    (run / run_vocab.STOP).write_text("asked\n")
    info = run_folder.read_run(str(run))
    assert info["state"] == run_vocab.RunState.FAILED and info["stop_requested"] and not info["has_spec"]


def test_a_store_that_never_came_up_exits_3_as_a_start_that_failed():
    assert cli.EXIT_BY_ABORT[run_vocab.AbortKind.NOT_STARTED] == cli.EXIT_TASK_FAILED == 3
    assert cli.EXIT_BY_ABORT["node_lost"] == cli.EXIT_NODE_LOST
    summary = {"run_id": "r", "failed_rank": None, "ranks": [], "abort": {
        "kind": "not_started", "host": "node-1", "reason": "the guard hosting the supervision store on node-1 "
                                                           "never wrote job.json within 130s"}}
    assert report.failure_message(summary) == f"run r never got going: {summary['abort']['reason']}"


# --- a node the controller lost: the cluster's verdict ----------------------------------------------

SPEC = {"run_id": "r", "master_addr": "10.0.0.1", "master_port": 29500, "world_size": 3, "master_host": "node-1",
        "mode": "container", "ranks": [{"rank": r, "host": h} for r, h in ((0, "node-1"), (1, "node-2"), (2, "node-3"))],
        "guard": {"units": [{"name": f"c-rank{r}", "host": h, "role": "rank", "ranks": [r]}
                            for r, h in ((0, "node-1"), (1, "node-2"), (2, "node-3"))]}}


def final(rank, code, stopped=False):
    return {"rank": rank, "name": f"c-rank{rank}", "exit_code": code, "stopped_by_torchfleet": stopped,
            "started_at": "2026-11-27T10:00:00Z", "finished_at": "2026-11-27T10:01:00Z"}


def job(codes, abort=None):
    return {"state": "failed" if abort else "succeeded", "abort": abort,
            "units": [{"name": f"c-rank{r}", "exit_code": c} for r, c in enumerate(codes)]}


def test_a_rank_on_a_lost_node_ends_as_the_cluster_recorded_it():
    finals = report.cluster_finals(SPEC, [final(0, 0), final(1, 0)], job([0, 0, 0]), ["node-3"])
    assert [(f["rank"], f["exit_code"], f["stopped_by_torchfleet"]) for f in finals] == [
        (0, 0, False), (1, 0, False), (2, 0, False)]
    assert finals[2]["recorded_by"] == "cluster"


def test_a_rank_the_guards_stopped_on_a_lost_node_counts_as_stopped_with_the_runs_reason():
    abort = {"kind": "rank_failed", "unit": "c-rank1", "reason": "rank 1 on node-2 exited with code 1"}
    finals = report.cluster_finals(SPEC, [final(0, 143, True), final(1, 1)], job([143, 1, 143], abort), ["node-3"])
    assert finals[2]["stopped_by_torchfleet"] and finals[2]["stopped_because"] == abort["reason"]
    assert report.choose_culprit(report.summarize("r", SPEC, finals, "/nonexistent", abort=abort)["ranks"])["rank"] == 1


@pytest.mark.parametrize("lost, record", [([], job([0, 0, 0])), (["node-3"], None), (["node-3"], job([0, 0, None]))])
def test_without_a_lost_node_or_the_clusters_record_of_it_the_rank_has_no_end(lost, record):
    finals = report.cluster_finals(SPEC, [final(0, 0), final(1, 0)], record, lost)
    assert [f["rank"] for f in finals] == [0, 1]


def test_the_report_of_a_run_that_succeeded_names_the_lost_node_and_how_to_fetch_its_logs(tmp_path):
    for rank in (0, 1):
        (tmp_path / f"rank-{rank}.log").write_text("step at 1\n")
    finals = report.cluster_finals(SPEC, [final(0, 0), final(1, 0)], job([0, 0, 0]), ["node-3"])
    summary = report.summarize("r", SPEC, finals, tmp_path, lost=["node-3"])
    assert summary["ok"] and summary["unreachable"] == ["node-3"] and summary["logs_missing"] == ["node-3"]
    assert "could not reach node-3" in summary["note"] and "`torchfleet collect r`" in summary["note"]


def test_logs_kept_from_names_only_the_nodes_whose_logs_arrived(tmp_path):
    """node-2's log never came (its collect failed); node-3, lost, left an empty one."""
    (tmp_path / "rank-0.log").write_text("step at 1\n")
    (tmp_path / "rank-2.log").write_text("")
    abort = {"kind": "node_lost", "host": "node-3", "unit": "c-rank2", "reason": "lost node-3"}
    finals = [final(0, 143, True), final(1, 143, True)]
    summary = report.summarize("r", SPEC, finals, tmp_path, abort=abort, lost=["node-3"])
    message = report.failure_message(summary)
    assert "logs kept from node-1;" in message
    assert "the logs of node-2 did not arrive: `torchfleet collect r` fetches them" in message
    assert "could not reach node-3" in message


def test_a_playbook_whose_only_failures_are_the_lost_nodes_keeps_the_runs_verdict():
    lost = api.Failure(host="node-3", task="Remove the run's rank containers", message="timed out", unreachable=True)
    other = api.Failure(host="node-2", task="Remove the run's rank containers", message="docker failed")
    assert api.lost_only([lost], ["node-3"])
    assert not api.lost_only([lost, other], ["node-3"]) and not api.lost_only([lost], []) and not api.lost_only([], [])


# --- a run carries its settings ---------------------------------------------------------------------


def test_the_waits_of_a_stop_follow_from_the_runs_own_settings():
    from harness.inputs import role_guard

    settings = spec.guard_settings({"guard": dict(role_guard(), stop_grace=60, node_timeout=4)}, 29500)
    assert settings["stop_wait"] == 4 + 60 + spec.STOP_MARGIN_S
    assert settings["start_timeout"] == role_guard()["master_wait_timeout"] + 4


def test_a_setting_the_run_lacks_is_named_not_defaulted():
    from harness.inputs import role_guard
    from torchfleet.errors import InventoryError

    given = role_guard()
    del given["stop_grace"]
    with pytest.raises(InventoryError) as err:
        spec.guard_settings({"guard": given}, 29500)
    assert err.value.variable == "launch_stop_grace"


def test_the_launch_role_reads_every_wait_of_a_run_from_its_spec():
    """A run's end (end.yml, which takes its waits from the spec: report.run_end), a follow (follow.yml) and a
    replace read the run's own waits; none adds them up."""
    tasks = ROOT / "roles" / "launch" / "tasks"
    for name in ("end.yml", "follow.yml", "replace.yml"):
        text = (tasks / name).read_text()
        assert "launch_stop_grace" not in text and "launch_node_timeout" not in text, name
        assert "launch__spec.guard." in text, name


def test_a_unit_that_ignores_sigterm_gets_the_grace_before_sigkill_and_the_record_says_so(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                      "print('training', flush=True)\ntime.sleep(60)\n")
    config = {"units": [{"name": "r-rank0", "host": "node-1", "role": "rank", "ranks": [0]}], "store_unit": 0,
              "node_timeout": 4, "run_id": "r", "job": "j", "stop_grace": 1.5}
    unit = guard.Guard(config, 0, [sys.executable, str(script)], str(tmp_path))
    unit.start_child()
    deadline = time.monotonic() + 20
    while not unit.proc.has_progressed and time.monotonic() < deadline:
        time.sleep(0.05)
    assert unit.stop_child() == 128 + signal.SIGKILL
    assert 1.5 <= unit.state["sigkill_at"] - unit.state["sigterm_at"] < 5


def test_attach_to_a_run_whose_store_never_came_up_exits_3(tmp_path, monkeypatch):
    """attach_run on a master whose job.json never appears, its report, and the CLI's exit."""
    from types import SimpleNamespace

    from ansible.playbook.play_context import PlayContext
    from ansible.playbook.task import Task

    from ansible_collections.torchfleet.cluster.plugins.action.attach_run import ActionModule
    from torchfleet.errors import JobFailed

    task = Task()
    task.args = {"node_dir": "/var/lib/torchfleet", "run_id": "r", "poll_interval": 0.05, "start_timeout": 0.2}
    action = ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp")), PlayContext(), None, None, None)
    action._execute_module = lambda module_name, module_args, task_vars: {"run": {"run_id": "r", "job_state": None}}
    attached = action.run(task_vars={"inventory_hostname": "node-1"})
    assert attached["abort"]["kind"] == run_vocab.AbortKind.NOT_STARTED and attached["abort"]["host"] == "node-1"

    report.write_summary(report.summarize("r", SPEC, [], tmp_path, master_listened=True, abort=attached["abort"]),
                         tmp_path)
    run = api.RunResult.load(tmp_path)

    class Handle:
        def attach(self):
            raise JobFailed(report.failure_message(report.summarize("r", SPEC, [], tmp_path, abort=run.abort)), run,
                            host=run.abort["host"])

    monkeypatch.setattr(cli, "_cluster", lambda args: SimpleNamespace(run=lambda run_id: Handle()))
    assert cli.main(["attach", "r", "--json"]) == 3
