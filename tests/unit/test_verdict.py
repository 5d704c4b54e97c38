"""Issue 59, item 3: one verdict, one colour. A node that stopped answering is a warning, not a
red failure, and a run that succeeded ends on a green line whatever a lost node left behind."""

import io

from rich.console import Console

from torchfleet import cli, progress, report
from torchfleet.events import Failure
from torchfleet.results import HostResult, PlaybookResult, RankResult, RunResult

RED = ("\x1b[31m", "\x1b[91m", "\x1b[1;31m")
UNREACHABLE = {"event": "runner_on_unreachable",
               "event_data": {"host": "node-1", "task": "Follow the run on its master",
                              "res": {"msg": "Failed to connect to the host via ssh: Connection timed out",
                                      "unreachable": True}}}


def recording(monkeypatch, module, name):
    """``module.name``, a console, recorded with its styles (a log's, not a terminal's: no live bar)."""
    console = Console(file=io.StringIO(), force_terminal=False, color_system="standard", width=200, record=True)
    monkeypatch.setattr(module, name, console)
    return console


def lost_master_playbook(failed=0):
    """A launch's playbook whose master stopped answering (and, with ``failed``, a task failed too)."""
    hosts = {"node-1": HostResult("node-1", ok=9, unreachable=1), "node-2": HostResult("node-2", ok=12, failed=failed),
             "node-3": HostResult("node-3", ok=12)}
    failures = [Failure(host="node-1", task="Follow the run on its master", message="timed out", unreachable=True)]
    return PlaybookResult(playbook="playbooks/launch.yml", status="failed", rc=4, duration_s=61.0, hosts=hosts,
                          failures=failures)


def lost_master_run(tmp_path):
    """The report of a run that lost its master in attempt 1 and succeeded in attempt 2 on the others."""
    rows = [{"attempt": 1, "state": "failed", "nodes": ["node-1", "node-2", "node-3"], "world_size": 3,
             "started_at": "t0", "ended_at": "t1",
             "cause": {"kind": "node_lost", "host": "node-1", "reason": "node-1 stopped beating"}},
            {"attempt": 2, "state": "succeeded", "nodes": ["node-2", "node-3"], "world_size": 2,
             "started_at": "t2", "ended_at": "t3", "cause": None}]
    ranks = [RankResult(0, "node-1", None, "left out", None, None, 0, None),
             RankResult(1, "node-2", 0, "ok", 30.0, 0.3, 60, None),
             RankResult(2, "node-3", 0, "ok", 30.0, 0.3, 60, None)]
    return RunResult(run_id="r1", run_dir=str(tmp_path), ok=True, master="10.0.0.2:29500", world_size=3, ranks=ranks,
                     checksums_equal=True, model=None, loss_plot=None, summary_path=str(tmp_path / "summary.json"),
                     unreachable=["node-1"], note=report.unreachable_note("r1", ["node-1"]), attempts=rows,
                     attempt=2, max_attempts=3)


def test_a_node_that_stopped_answering_is_a_yellow_warning_as_it_happens_and_at_the_end(monkeypatch):
    console = recording(monkeypatch, progress, "console")
    hook = progress.RichProgress("launch r1")
    hook({"event": "playbook_on_play_start", "event_data": {"play": "Launch"}})
    hook(UNREACHABLE)
    hook.close(lost_master_playbook())
    text = console.export_text(styles=True, clear=False)
    assert not any(code in text for code in RED), text
    plain = console.export_text()
    assert "✗" not in plain and "failed" not in plain
    assert "! node-1 did not answer: Follow the run on its master: Failed to connect" in plain
    assert "launch r1: 3 host(s), 0 changed, 1 not answering (61s)" in plain


def test_a_failed_task_is_still_red(monkeypatch):
    console = recording(monkeypatch, progress, "console")
    hook = progress.RichProgress("launch r1")
    hook.close(lost_master_playbook(failed=1))
    assert any(code in console.export_text(styles=True) for code in RED)
    failed = dict(UNREACHABLE["event_data"], res={"msg": "boom"})
    assert progress.failure_line("runner_on_failed", failed).startswith("[red]✗ node-1[/]")


def test_a_run_that_succeeded_without_its_lost_master_ends_green_with_the_collect_command(monkeypatch, tmp_path):
    console = recording(monkeypatch, cli, "out")
    cli._print_run(lost_master_run(tmp_path))
    text = console.export_text(styles=True, clear=False)
    assert not any(code in text for code in RED), text
    lines = console.export_text().rstrip().splitlines()
    assert lines[-1] == "✓ run r1 succeeded in attempt 2 of 3 (attempt 1: node-1 stopped beating); checksums equal " \
                        "on every rank"
    warning = next(line for line in lines if line.startswith("warning:"))
    assert "could not reach node-1" in warning and "`torchfleet collect r1`" in warning


def test_a_stopped_run_ends_yellow_and_a_failed_one_leaves_its_verdict_to_the_error(monkeypatch, tmp_path):
    run = lost_master_run(tmp_path)
    run.ok, run.abort = False, {"kind": "stopped", "reason": "stopped on request (torchfleet stop)"}
    assert cli.run_verdict(run) == "[yellow]■[/] run r1 stopped: stopped on request (torchfleet stop)"
    run.abort = {"kind": "rank_failed", "reason": "rank 1 exited with code 3"}
    assert cli.run_verdict(run) is None
