"""The Python API's handles: a Cluster (an inventory driven through torchfleet's playbooks),
a Job (what to run) and a Run (a run on the cluster, whichever controller started it). Each
call runs one playbook through the runner (torchfleet.runner), reads its events
(torchfleet.events) and returns the results (torchfleet.results) or raises the error that
names the host and the variable."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from torchfleet import run_status, runner
from torchfleet.errors import (HostUnreachable, Interrupted, InventoryError, JobFailed, JobRunning, TaskFailed,
                               TorchfleetError)
from torchfleet.events import Collector, EventHook, input_error, lost_only
from torchfleet.inputs import check_run_id, new_run_id
from torchfleet.results import HostResult, Plan, PlaybookResult, RunResult, RunStatus
from torchfleet import run_vocab as vocab


@dataclass
class Job:
    """What to run. Unset fields keep the inventory's values (launch_* variables)."""

    args: Sequence[str] | None = None
    workload: str | Path | None = None
    # A script in the workload folder, or "-m package.module" (launch_entrypoint).
    entrypoint: str | None = None
    name: str | None = None
    env: Mapping[str, str] | None = None
    # Reaches the ranks, never the plan, the report or a command line (launch_secret_env).
    secret_env: Mapping[str, str] | None = None
    master_port: int | None = None
    timeout: int | None = None
    run_id: str | None = None
    # Stop a still-running run of the same job first (launch_replace) instead of refusing.
    replace: bool = False
    extra_vars: Mapping[str, Any] = field(default_factory=dict)

    def to_vars(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.args is not None:
            out["launch_args"] = [str(a) for a in self.args]
        if self.workload is not None:
            out["launch_workload"] = str(Path(self.workload).resolve())
        if self.entrypoint is not None:
            out["launch_entrypoint"] = self.entrypoint
        if self.name is not None:
            out["launch_job"] = self.name
        if self.env is not None:
            out["launch_extra_env"] = {str(k): str(v) for k, v in self.env.items()}
        if self.secret_env is not None:
            out["launch_secret_env"] = {str(k): str(v) for k, v in self.secret_env.items()}
        if self.master_port is not None:
            out["launch_master_port"] = int(self.master_port)
        if self.timeout is not None:
            out["launch_timeout"] = int(self.timeout)
        if self.run_id is not None:
            out["launch_run_id"] = check_run_id(self.run_id)
        if self.replace:
            out["launch_replace"] = True
        out.update(self.extra_vars)
        return out


class Run:
    """A run on the cluster, whichever controller started it."""

    def __init__(self, cluster: "Cluster", run_id: str):
        self.cluster, self.run_id = cluster, check_run_id(run_id)

    def __repr__(self) -> str:
        return f"Run({self.run_id!r})"

    def status(self, log_lines: int = 1) -> RunStatus:
        """The run's state and each node's units: from the master's record of a running run
        (one node), else from every node's own records (``source``; ``note`` says why)."""
        view = self.cluster._control("logs" if log_lines > 1 else "status", self.run_id, launch_log_lines=log_lines)
        return RunStatus(run_id=self.run_id, **run_status.from_view(view))

    def logs(self, lines: int = 20) -> dict[str, dict[str, list[str]]]:
        """The last ``lines`` of every log of the run, by host and file."""
        return {h: r.get("logs") or {} for h, r in self.status(lines).nodes.items()}

    def attach(self) -> RunResult:
        """Follow the run until it ends, then collect it. Ctrl-C only detaches: the run goes
        on, and Interrupted says so."""
        out = self.cluster._control("attach", self.run_id, interruptible=True)
        if "interrupted" in out:
            raise Interrupted(f"detached from run {self.run_id}, which goes on; `torchfleet attach {self.run_id}` "
                              "follows it again", signum=out["interrupted"], run_id=self.run_id, detached=True)
        return self.cluster._finish(out["result"], self.run_id)

    def stop(self, reason: str | None = None) -> RunResult:
        """Stop every rank on every node, then collect the run."""
        variables = {"launch_stop_reason": reason} if reason else {}
        out = self.cluster._control("stop", self.run_id, **variables)
        try:
            return self.cluster._finish(out["result"], self.run_id)
        except JobFailed as exc:
            # Stopped as asked: the report, not an error.
            if exc.run is not None and (exc.run.abort or {}).get("kind") == vocab.AbortKind.STOPPED:
                return exc.run
            raise

    def collect(self) -> RunResult:
        """Bring the run's logs, checksums and model into runs/<run_id>/, and each node's out
        folder into runs/<run_id>/out/<host>/ (a finished run's units are removed first; a
        running one is left running)."""
        out = self.cluster._control("collect", self.run_id)
        return self.cluster._finish(out["result"], self.run_id)


class Cluster:
    """An Ansible inventory of training nodes, driven through torchfleet's playbooks."""

    def __init__(
        self,
        inventory: str | Path | Sequence[str | Path] | None = None,
        *,
        extra_vars: Mapping[str, Any] | None = None,
        project_dir: str | Path | None = None,
        runs_dir: str | Path | None = None,
        progress: bool | EventHook = True,
        env: Mapping[str, str] | None = None,
        on_warning: Callable[[dict[str, Any]], None] | None = None,
        verbose: bool = False,
    ):
        """``on_warning`` gets each lookalike warning (torchfleet.lookalike) as soon as the
        inventory check makes it, before any check that can fail; ``warnings`` keeps them.
        ``verbose`` shows every failed task as Ansible names it, input errors included."""
        # A checkout runs its own playbooks and settings; an installed torchfleet, the
        # collection's. The user's runs and state go to the checkout, or the current folder.
        self.project_dir = Path(project_dir).resolve() if project_dir else runner.find_project()
        self.workdir = self.project_dir or Path.cwd().resolve()
        if inventory is None:
            inventory = self.workdir / "inventory" / "local"
        sources = [inventory] if isinstance(inventory, (str, Path)) else list(inventory)
        self.inventory = [Path(s).resolve() for s in sources]
        for source in self.inventory:
            if not source.exists():
                raise InventoryError(f"inventory {source} does not exist", variable="inventory")
        self.extra_vars = dict(extra_vars or {})
        runs_dir = runs_dir or os.environ.get("TORCHFLEET_RUNS_DIR") or self.workdir / "runs"
        self.runs_dir = Path(runs_dir).resolve()
        # Controller-side state: keys, certificates, image archives (the roles' torchfleet_state_dir).
        self.state_dir = Path(os.environ.get("TORCHFLEET_STATE_DIR") or self.workdir / ".torchfleet").resolve()
        self.env = dict(env or {})
        self.on_warning = on_warning
        self.warnings: list[dict[str, Any]] = []
        if progress is True:
            from torchfleet.progress import RichProgress

            self._hook_factory: Callable[[str], EventHook | None] = lambda title: RichProgress(title, verbose)
        elif callable(progress):
            self._hook_factory = lambda title: progress
        else:
            self._hook_factory = lambda title: None

    # -- public API --

    def plan(self, job: Job | None = None) -> Plan:
        """The rank table and each rank's environment. Changes nothing on any node."""
        result, collected = self._run(runner.playbook("plan"), "plan", job.to_vars() if job else {})
        self._raise_for(result, "plan")
        view = collected.debug_vars.get("launch_plan_view")
        if not view:
            raise TorchfleetError("the plan playbook returned no plan")
        return Plan.from_view(view, result.warnings)

    def provision(self, **extra_vars: Any) -> PlaybookResult:
        """Run site.yml: container runtime, image, dataset (and TLS when asked)."""
        result, _ = self._run(runner.playbook("site"), "provision", extra_vars)
        self._raise_for(result, "provision")
        return result

    def launch(self, job: Job | None = None) -> RunResult:
        """Run one job attached: submit, follow, collect. Returns its report or raises
        JobFailed carrying it. SIGTERM or Ctrl-C stops every rank on every node, collects
        the logs and raises Interrupted."""
        job = job or Job()
        run_id = check_run_id(job.run_id or self.extra_vars.get("launch_run_id") or new_run_id())
        variables = dict(job.to_vars(), launch_run_id=run_id)
        result, _ = self._run(runner.playbook("launch"), f"launch {run_id}", variables, interruptible=True)
        if result.interrupted:
            self._stop_interrupted(run_id, result.interrupted)
        return self._finish(result, run_id)

    def submit(self, job: Job | None = None) -> "Run":
        """Start a job and return once every rank has started, master first. The guards
        supervise it on the cluster; the returned handle (or ``Cluster.run(id)`` from any
        controller) looks at it, follows it, stops it and collects it."""
        job = job or Job()
        run_id = check_run_id(job.run_id or self.extra_vars.get("launch_run_id") or new_run_id())
        variables = dict(job.to_vars(), launch_run_id=run_id, launch_detach=True)
        result, _ = self._run(runner.playbook("launch"), f"submit {run_id}", variables, interruptible=True)
        if result.interrupted:
            self._stop_interrupted(run_id, result.interrupted)
        if not result.ok:
            self._finish(result, run_id)
        return Run(self, run_id)

    def run(self, run_id: str) -> "Run":
        """A handle on a run that is (or was) on the cluster."""
        return Run(self, run_id)

    def cluster_runs(self) -> list[dict[str, Any]]:
        """Every run the nodes hold and every run in runs/, newest last: run_id, job, state,
        where it was found (nodes, local), the nodes that did not answer, and its attempt of
        how many (1 of 1 without restarts)."""
        view = self._control("runs", None)
        summaries = {run_id: json.loads((self.runs_dir / run_id / vocab.SUMMARY).read_text()) for run_id in self.runs()}
        return run_status.runs_from_view(view, summaries)

    def _control(self, action: str, run_id: str | None, interruptible: bool = False,
                 **variables: Any) -> dict[str, Any]:
        result, collected = self._run(runner.playbook(action), f"{action} {run_id or ''}".strip(),
                                      dict(variables, **({"launch_run_id": run_id} if run_id else {})), interruptible)
        if result.interrupted:
            return {"interrupted": result.interrupted}
        if action in ("attach", "stop", "collect"):
            return {"result": result}
        view = collected.debug_vars.get("launch_run_view")
        if view is None:
            self._raise_for(result, action)
            raise TorchfleetError(f"{action} returned nothing")
        self._raise_for(result if not result.failures or not all(f.unreachable for f in result.failures)
                        else dataclasses.replace(result, status="successful"), action)
        return view

    def _stop_interrupted(self, run_id: str, signum: int) -> None:
        """After Ctrl-C or SIGTERM on an attached launch: stop the run everywhere, keep its
        logs, and say so."""
        name = signal.Signals(signum).name
        try:
            self._control("stop", run_id, launch_stop_reason=f"the controller's launch was interrupted ({name})")
        finally:
            raise Interrupted(f"run {run_id} was interrupted ({name}); every rank was stopped and the logs are in "
                              f"{self.runs_dir / run_id}", signum=signum, run_id=run_id)

    def _finish(self, result: PlaybookResult, run_id: str) -> RunResult:
        """The report of a run whose playbook ended, or the error that ended it."""
        run_dir = self.runs_dir / run_id
        run = RunResult.load(run_dir) if (run_dir / vocab.SUMMARY).is_file() else None
        refused = next((f for f in result.failures if f.kind == "running"), None)
        if refused is not None:
            raise JobRunning(refused.message, refused.host, refused.task)
        others = [f for f in result.failures if not f.action.endswith("job_report")]
        if run is not None and others and all(r.outcome == vocab.RankOutcome.NOT_STARTED for r in run.ranks):
            # Nothing ran: the task that kept the ranks from starting is the error, not the job.
            self._raise_for(dataclasses.replace(result, failures=others), "launch")
        if run is not None and not run.ok:
            culprit = next((f for f in result.failures if f.action.endswith("job_report")), None)
            failure = culprit or (result.failures[0] if result.failures else None)
            raise JobFailed(
                failure.message if failure else f"run {run_id} failed",
                run,
                host=(run.abort or {}).get("host") if run.abort and run.abort.get("kind") != vocab.AbortKind.RANK_FAILED
                else next((r.host for r in run.ranks if r.rank == run.failed_rank), failure and failure.host),
                task=failure.task if failure else None,
                playbook=result.playbook,
                failures=result.failures,
            )
        if run is not None and lost_only(result.failures, run.unreachable):
            # The cluster's verdict stands; the report names the nodes the controller lost.
            return run
        self._raise_for(result, "launch")
        if run is None:
            raise TorchfleetError(f"run {run_id} finished without a summary in {run_dir}")
        return run

    def report(self, run_id: str | None = None) -> RunResult:
        """The report of a past run (the latest when no id is given)."""
        return RunResult.load(self._run_dir(run_id))

    def logs(self, run_id: str | None = None, rank: int | None = None) -> dict[int, str]:
        """Each rank's log of a run (the latest when no id is given), by rank."""
        run = self.report(run_id)
        logs = {r.rank: r.log() for r in run.ranks if rank is None or r.rank == rank}
        if rank is not None and not logs:
            raise TorchfleetError(f"run {run.run_id} has no rank {rank} (world size {run.world_size})")
        return logs

    def runs(self) -> list[str]:
        """Run ids with a report, oldest first."""
        if not self.runs_dir.is_dir():
            return []
        return sorted(p.name for p in self.runs_dir.iterdir() if (p / vocab.SUMMARY).is_file())

    def down(self) -> PlaybookResult:
        """Stop and remove every rank torchfleet started on the nodes."""
        result, _ = self._run(runner.playbook("down"), "down", {})
        self._raise_for(result, "down")
        return result

    # -- plumbing --

    def _run_dir(self, run_id: str | None) -> Path:
        if run_id:
            return self.runs_dir / check_run_id(run_id)
        runs = self.runs()
        if not runs:
            raise TorchfleetError(f"no runs in {self.runs_dir} yet")
        return self.runs_dir / runs[-1]

    def _warn(self, warning: dict[str, Any]) -> None:
        """Keep a lookalike warning and pass it on, once per command: each playbook it runs
        (a launch, then its stop) checks the inventory again."""
        if warning not in self.warnings:
            self.warnings.append(warning)
            if self.on_warning:
                self.on_warning(warning)

    def _run(self, playbook: str, title: str, variables: Mapping[str, Any],
             interruptible: bool = False, hook: EventHook | None = None) -> tuple[PlaybookResult, Collector]:
        """Run ``playbook``, one of the collection's (runner.playbook) or a file in the working
        folder. SIGTERM or Ctrl-C cancels it; with ``interruptible`` the signal is then the
        caller's to handle (``result.interrupted``), else it goes on at once."""
        import ansible_runner

        # ``hook``, where given, sees the events in place of the progress display.
        collector = Collector(hook or self._hook_factory(title), self._warn)
        env = {
            # The venv's ansible-playbook, whatever PATH the caller has.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "ANSIBLE_CONFIG": str(runner.ansible_config(self.project_dir)),
            "TORCHFLEET_RUNS_DIR": str(self.runs_dir),
            "TORCHFLEET_STATE_DIR": str(self.state_dir),
            # ansible-runner empties a task result over 700 KB in its event, where the API
            # reads what a playbook shows (a plan, a run's status, its logs), which grows
            # with the cluster: at 48 nodes a status did not come back.
            "MAX_EVENT_RES": str(1 << 30),
            **{k: v for k, v in os.environ.items() if k.startswith("TORCHFLEET_")},
            **self.env,
        }
        started = time.monotonic()
        with runner.cancel_on_signals(reraise=not interruptible) as cancel, runner.private_folder() as private:
            cancel.folder = private
            # Variables (a registry password, secret env) reach ansible-playbook as -e @file, a
            # 0600 file in a 0700 folder: never on its command line or in artifacts/*/command.
            runner.write_private(private / "env" / "extravars", json.dumps({**self.extra_vars, **variables}))
            # How often ansible-runner checks for a cancel (SIGTERM, Ctrl-C) while output is quiet.
            runner.write_private(private / "env" / "settings", json.dumps({"pexpect_timeout": 1}))
            ran = ansible_runner.run(
                private_data_dir=str(private),
                project_dir=str(self.workdir),
                # ansible-playbook through torchfleet.playbook_child: it ends with this process.
                binary=runner.PLAYBOOK_CHILD,
                cmdline=shlex.quote(playbook if playbook.startswith(runner.COLLECTION + ".") else
                                    str(self.workdir / playbook)),
                inventory=[str(p) for p in self.inventory],
                envvars=env,
                event_handler=collector,
                status_handler=runner.command_without_env,
                cancel_callback=cancel,
                quiet=True,
                suppress_env_files=True,
            )
            status, rc = ran.status, ran.rc
        hosts = {}
        for key, attr in (("ok", "ok"), ("changed", "changed"), ("failures", "failed"),
                          ("dark", "unreachable"), ("skipped", "skipped")):
            for host, count in collector.stats.get(key, {}).items():
                if collector.nodes is None or host in collector.nodes:
                    setattr(hosts.setdefault(host, HostResult(host)), attr, count)
        result = PlaybookResult(playbook=playbook, status=status, rc=rc, duration_s=round(time.monotonic() - started, 1),
                                hosts=dict(sorted(hosts.items())), failures=collector.failures,
                                interrupted=cancel.received[0] if cancel.received else None,
                                warnings=collector.warnings)
        if collector.hook is not None and hasattr(collector.hook, "close"):
            collector.hook.close(result)
        return result, collector

    @staticmethod
    def _raise_for(result: PlaybookResult, what: str) -> None:
        if result.ok:
            return
        if not result.failures:
            raise TaskFailed(f"{what} ended with status {result.status} (rc={result.rc}) and no failed task",
                             playbook=result.playbook)
        first = result.failures[0]
        if first.unreachable:
            raise HostUnreachable(first.message, first.host, first.task, result.playbook, result.failures)
        if first.kind == "input":
            raise input_error([f for f in result.failures if f.kind == "input"])
        raise TaskFailed(first.message, first.host, first.task, result.playbook, result.failures)
