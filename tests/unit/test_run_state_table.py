"""One rule decides a run's state (torchfleet.run_vocab.run_state), whichever source a reader
has: the master's record (job.json, as a status, an attach and the node's own read see it), a
worker's folder (its units' records, no job.json), the controller's summary (the launch's
report, then `torchfleet runs`), and Slurm's state for the run's job. For every kind of
abort, each source reads the same. Each source goes through the reader that uses it."""

import json

import pytest

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_folder
from torchfleet import report, run_status
from torchfleet.modes import slurm
from torchfleet import run_vocab as vocab

Kind, State = vocab.AbortKind, vocab.RunState
# What a run that ended with each kind of abort is, to every reader.
EXPECTED = {kind: State.FAILED for kind in Kind} | {Kind.STOPPED: State.STOPPED, Kind.MOVED: State.MOVED}
# Slurm's own word for an end of each kind, where Slurm has one (its job states, `man squeue`).
SLURM = {Kind.RANK_FAILED: "FAILED", Kind.NODE_LOST: "NODE_FAIL", Kind.TIMEOUT: "TIMEOUT", Kind.STOPPED: "CANCELLED"}

UNITS = [{"name": f"r-rank{i}", "host": f"node-{i + 1}", "role": "rank", "ranks": [i]} for i in range(2)]
CONFIG = {"run_id": "r1", "job": "mnist", "units": UNITS, "store_unit": 0, "node_timeout": 10}
SPEC = {"master_addr": "10.0.0.1", "master_port": 29500, "world_size": 2, "mode": "container",
        "ranks": [{"rank": i, "host": u["host"]} for i, u in enumerate(UNITS)]}


def abort_of(kind):
    return {"kind": kind.value, "host": "node-2", "unit": 1, "reason": f"ended by {kind.value}"}


def master_folder(tmp_path, kind):
    """The master's folder as the guard hosting the store leaves it: job.json as it writes it."""
    run = tmp_path / "master" / "r1"
    run.mkdir(parents=True)
    (run / vocab.GUARD_CONFIG).write_text(json.dumps(CONFIG))
    abort = abort_of(kind)
    (run / vocab.JOB).write_text(json.dumps({"run_id": "r1", "job": "mnist", "abort": abort,
                                             "state": vocab.job_state(UNITS, {}, abort, [])}))
    return run


def worker_folder(tmp_path, kind):
    """A worker's folder: its unit's record, stopped by its guard with the run's abort."""
    run = tmp_path / "worker" / "r1"
    run.mkdir(parents=True)
    (run / vocab.GUARD_CONFIG).write_text(json.dumps(CONFIG))
    (run / vocab.guard_record(1)).write_text(json.dumps({"unit": 1, "state": "stopped", "exit_code": 143,
                                                         "abort": abort_of(kind)}))
    return run


READERS = {
    "the master's record, read on the node": lambda tmp, kind: run_folder.read_run(str(master_folder(tmp, kind)))["state"],
    "the master's record, in a status": lambda tmp, kind: run_status.from_view(
        {"nodes": {"node-1": run_folder.read_run(str(master_folder(tmp, kind)))}})["state"],
    "a worker's folder, read on the node": lambda tmp, kind: run_folder.read_run(str(worker_folder(tmp, kind)))["state"],
    "a worker's folder, in a status": lambda tmp, kind: run_status.from_view(
        {"nodes": {"node-2": run_folder.read_run(str(worker_folder(tmp, kind)))}})["state"],
    "a worker's folder, in the runs list": lambda tmp, kind: run_status.runs_from_view(
        {"nodes": {"node-2": [run_folder.read_run(str(worker_folder(tmp, kind)))]}}, {})[0]["state"],
    "the local summary, as the launch writes it": lambda tmp, kind: report.summarize(
        "r1", SPEC, [], tmp, abort=abort_of(kind))["state"],
    "the local summary, in the runs list": lambda tmp, kind: run_status.runs_from_view(
        {"nodes": {}}, {"r1": report.summarize("r1", SPEC, [], tmp, abort=abort_of(kind))})[0]["state"],
}


@pytest.mark.parametrize("kind", list(Kind), ids=str)
@pytest.mark.parametrize("source", READERS)
def test_every_source_reads_an_abort_of_each_kind_alike(source, kind, tmp_path):
    assert READERS[source](tmp_path, kind) == EXPECTED[kind]


@pytest.mark.parametrize("kind", list(SLURM), ids=str)
def test_slurms_word_for_the_same_end_reads_alike(kind):
    word = SLURM[kind]
    assert slurm.job_state(word)[0] == EXPECTED[kind]
    (job,) = slurm.parse_squeue(f"42|{word}|None|node-1|node-[1-2]|torchfleet-r1\n")
    assert job["state"] == EXPECTED[kind]


def test_the_records_outspeak_the_scheduler():
    """A run that never got going is cancelled by the launch's end: Slurm says CANCELLED,
    and the run's own record, which says why it ended, stands."""
    abort = abort_of(Kind.NOT_STARTED)
    assert vocab.run_state(job={"abort": abort}, scheduler=Kind.STOPPED) == State.FAILED
    assert vocab.run_state(scheduler=Kind.STOPPED) == State.STOPPED


@pytest.mark.parametrize("units, expected", [
    ([{"state": "running"}, {"state": "stopped", "abort": abort_of(Kind.RANK_FAILED)}], State.RUNNING),
    ([{"state": "exited", "exit_code": 0}, {"state": "exited", "exit_code": 0}], State.EXITED),
    ([], State.UNKNOWN),
])
def test_without_a_record_the_units_say_whether_it_runs(units, expected):
    assert vocab.run_state(units=units) == expected
