"""torchfleet from Python: plan, provision, launch, read logs and stop, on ansible-runner.

    from torchfleet import Cluster, Job
    cluster = Cluster("inventory/mycluster")
    print(cluster.plan().table())
    cluster.provision()
    run = cluster.launch(Job(args=["--epoch", "3", "--no-cuda", "--save-model"]))
    print(run.ok, [r.last_loss for r in run.ranks])
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
import dataclasses
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from torchfleet.errors import (HostUnreachable, Interrupted, InventoryError, JobFailed, JobRunning, TaskFailed,
                               TorchfleetError)
from torchfleet.spec import RankSpec, check_run_id, new_run_id
from torchfleet.vocab import run_vocab as vocab

# Argument specs report bad input in their own shape; every other input check of
# torchfleet's returns ``torchfleet_error`` with its kind, host and variable.
_ARGUMENT_SPEC_ACTIONS = {"validate_argument_spec", "ansible.builtin.validate_argument_spec"}
_VARIABLE = re.compile(
    r"\b((?:torchfleet|launch|image|dataset|cpu_pinning|tls_pki|container_runtime|local_cluster|"
    r"kubelet_cpu_manager|ssh_mesh|python_env)_[a-z0-9_]+|gloo_tls|sgx_devices|GLOO_TCP_IFACE)\b"
)
_HOST_PREFIX = re.compile(r"^host (\S+?):")
# "host h: " or "hosts h, g: ", as check_input and InventoryError begin a sentence.
_HOSTS_PREFIX = re.compile(r"^(host|hosts) ([^\s:,]+(?:, [^\s:,]+)*): ")


def find_project(start: str | Path | None = None) -> Path:
    """The folder holding site.yml and the roles: $TORCHFLEET_PROJECT, the current folder
    or one above it, or the clone this package was installed from."""
    if os.environ.get("TORCHFLEET_PROJECT"):
        return Path(os.environ["TORCHFLEET_PROJECT"]).resolve()
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents, Path(__file__).resolve().parents[1]):
        if (folder / "site.yml").is_file() and (folder / "roles" / "launch").is_dir():
            return folder
    raise TorchfleetError("cannot find torchfleet's playbooks (site.yml, roles/); run from a clone "
                          "of torchfleet or set TORCHFLEET_PROJECT")


# --- results -----------------------------------------------------------------------------


@dataclass
class Failure:
    host: str | None
    task: str
    message: str
    unreachable: bool = False
    action: str = ""
    variable: str | None = None
    # input: the inventory or the variables are wrong, and nothing was changed; node: a
    # node failed a command or is not in the state the launch needs; running: the job
    # still runs; a run's end as its guards saw it: rank_failed, node_lost, stalled,
    # timeout, stopped.
    kind: str = "node"


@dataclass
class HostResult:
    host: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    unreachable: int = 0
    skipped: int = 0


@dataclass
class PlaybookResult:
    playbook: str
    status: str
    rc: int
    duration_s: float
    hosts: dict[str, HostResult] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    # The signal (SIGINT, SIGTERM) that cancelled the playbook, if one did.
    interrupted: int | None = None
    # Inventory variables that look like torchfleet's and are ignored (torchfleet.lookalike).
    warnings: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status == "successful"

    @property
    def changed(self) -> int:
        return sum(h.changed for h in self.hosts.values())

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), ok=self.ok, changed=self.changed)


@dataclass
class RankPlan(RankSpec):
    """One rank of the launch spec (torchfleet.spec.RankSpec), and whether its node can run it yet."""

    runtime_ready: bool = False

    @property
    def omp_num_threads(self) -> int:
        return self.threads


@dataclass
class Plan:
    """The launch spec a launch with the same input runs, as ``torchfleet plan --json``
    shows it (``spec``), plus whether each node can run its ranks yet (``ready``)."""

    spec: dict[str, Any]
    ranks: list[RankPlan]
    warnings: list[dict[str, Any]]
    ready: dict[str, bool]

    @classmethod
    def from_view(cls, view: Mapping[str, Any], warnings: Sequence[Mapping[str, Any]] = ()) -> "Plan":
        spec = {k: v for k, v in view.items() if k != "ready"}
        ready = {str(h): bool(v) for h, v in (view.get("ready") or {}).items()}
        ranks = [RankPlan(**{k: r.get(k) for k in RankPlan.__dataclass_fields__ if k != "runtime_ready"},
                          runtime_ready=ready.get(r["host"], False)) for r in spec["ranks"]]
        return cls(spec=spec, ranks=ranks, warnings=[dict(w) for w in warnings], ready=ready)

    def __getattr__(self, name: str) -> Any:
        # run_id, mode, transport, image, master_host, master_addr, master_port, world_size,
        # num_nodes, units, watch, files, phases: the spec's own fields.
        spec = self.__dict__.get("spec") or {}
        if name in spec:
            return spec[name]
        raise AttributeError(name)

    @property
    def launch_mode(self) -> str:
        return self.spec["mode"]

    @property
    def master(self) -> str:
        return f"{self.spec['master_addr']}:{self.spec['master_port']}"

    def to_dict(self) -> dict[str, Any]:
        return dict(self.spec, ready=self.ready, warnings=self.warnings)


@dataclass
class RankResult:
    rank: int
    host: str
    exit_code: int | None
    outcome: str
    duration_s: float | None
    last_loss: float | None
    steps: int
    log_path: str | None
    cpuset: str | None = None
    cpuset_mems: str | None = None
    # Why the guards stopped this rank, as its guard recorded it.
    stopped_because: str | None = None

    def log(self) -> str:
        return Path(self.log_path).read_text(errors="replace") if self.log_path else ""


@dataclass
class RunResult:
    run_id: str
    run_dir: str
    ok: bool
    master: str
    world_size: int
    ranks: list[RankResult]
    checksums_equal: bool
    model: str | None
    loss_plot: str | None
    summary_path: str
    failed_rank: int | None = None
    # Why the guards stopped the run: kind (rank_failed, node_lost, stalled, timeout,
    # stopped), host and reason; None for a run that ended by itself.
    abort: dict[str, Any] | None = None
    # What came back of each node's out folder into runs/RUN/out/HOST (torchfleet.outputs.record),
    # by host; its message says what launch_collect_out_max_mb left on the node.
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The nodes the controller could not reach at the end: the run's verdict is the cluster's
    # (its guards' records), and their logs are still on them; ``note`` says so, or is None.
    unreachable: list[str] = field(default_factory=list)
    note: str | None = None

    @classmethod
    def load(cls, run_dir: str | Path) -> "RunResult":
        run_dir = Path(run_dir)
        path = run_dir / vocab.SUMMARY
        if not path.is_file():
            raise TorchfleetError(f"{run_dir} has no {vocab.SUMMARY}: the run did not get as far as a report")
        data = json.loads(path.read_text())
        plot = run_dir / "loss.png"
        return cls(
            run_id=data["run_id"],
            run_dir=str(run_dir),
            ok=data["ok"],
            master=data["master"],
            world_size=data["world_size"],
            ranks=[
                RankResult(rank=r["rank"], host=r["host"], exit_code=r["exit_code"], outcome=r["outcome"],
                           duration_s=r["duration_s"], last_loss=r["last_loss"], steps=r.get("steps", 0),
                           log_path=r["log"], cpuset=r.get("cpuset"), cpuset_mems=r.get("cpuset_mems"),
                           stopped_because=r.get("stopped_because"))
                for r in data["ranks"]
            ],
            checksums_equal=data["checksums_equal"],
            model=data["model"],
            loss_plot=str(plot) if plot.is_file() else None,
            summary_path=str(path),
            failed_rank=(data.get("failed_rank") or {}).get("rank"),
            abort=data.get("abort"),
            outputs=data.get("outputs") or {},
            unreachable=data.get("unreachable") or [],
            note=data.get("note"),
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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


@dataclass
class RunStatus:
    """A run as the nodes hold it: its state (the master's job.json where it answers),
    why it was stopped, each node's units and the latest log lines."""

    run_id: str
    state: str
    job: str | None
    abort: dict[str, Any] | None
    nodes: dict[str, Any]
    unreachable: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Run:
    """A run on the cluster, whichever controller started it."""

    def __init__(self, cluster: "Cluster", run_id: str):
        self.cluster, self.run_id = cluster, check_run_id(run_id)

    def __repr__(self) -> str:
        return f"Run({self.run_id!r})"

    def status(self, log_lines: int = 1) -> RunStatus:
        view = self.cluster._control("logs" if log_lines > 1 else "status", self.run_id, launch_log_lines=log_lines)
        nodes = {h: r for h, r in (view.get("nodes") or {}).items() if r}
        master = next((r for r in nodes.values() if r.get("job_state")), None)
        states = [r.get("state") for r in nodes.values()]
        if master:
            state, abort = master["job_state"]["state"], master["job_state"].get("abort")
        else:
            state = vocab.RunState.RUNNING.value if vocab.RunState.RUNNING in states else (
                states[0] if states else vocab.RunState.UNKNOWN.value)
            abort = next((u.get("abort") for r in nodes.values() for u in r.get("units", []) if u.get("abort")), None)
        return RunStatus(run_id=self.run_id, state=state, job=next((r.get("job") for r in nodes.values()), None),
                         abort=abort, nodes=nodes, unreachable=view.get("unreachable") or [])

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


# --- running playbooks ----------------------------------------------------------------------


EventHook = Callable[[Mapping[str, Any]], None]


class _Collector:
    """Keeps what the results need from ansible-runner's event stream."""

    def __init__(self, hook: EventHook | None, on_warning: Callable[[dict[str, Any]], None] | None = None):
        self.hook = hook
        self.on_warning = on_warning
        self.failures: list[Failure] = []
        self.stats: dict[str, dict[str, int]] = {}
        self.debug_vars: dict[str, Any] = {}
        # The inventory check's lookalike warnings (torchfleet.lookalike), failed or not, and
        # the nodes it found: the play on localhost that ran it is none of them.
        self.warnings: list[dict[str, Any]] = []
        self.nodes: list[str] | None = None

    def __call__(self, event: Mapping[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind in ("runner_on_ok", "runner_on_failed") and isinstance(data.get("res"), dict):
            for warning in data["res"].get("torchfleet_warnings") or []:
                self.warnings.append(warning)
                if self.on_warning:
                    self.on_warning(warning)
            if "torchfleet_hosts" in data["res"]:
                self.nodes = list(data["res"]["torchfleet_hosts"])
        if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            res = data.get("res") or {}
            # A loop fails as "One or more items failed": the failed item says what and why.
            item = next((r for r in res.get("results") or [] if isinstance(r, dict) and r.get("failed")), None)
            res = item if item is not None else res
            message = str(res.get("msg") or res.get("stderr") or res.get("reason") or "failed").strip()
            if data.get("task_action") in _ARGUMENT_SPEC_ACTIONS and res.get("argument_errors"):
                # Ansible's "Validation of arguments failed:" heading, without the heading.
                message = "; ".join(str(e) for e in res["argument_errors"])
            host = res.get("host") if isinstance(res.get("host"), str) else None
            match = _HOST_PREFIX.match(message)
            typed = res.get("torchfleet_error") if isinstance(res.get("torchfleet_error"), dict) else {}
            variable = typed.get("variable") or (res.get("variable") if isinstance(res.get("variable"), str) else None)
            action = data.get("task_action", "")
            is_input = typed.get("kind") == "input" or (action in _ARGUMENT_SPEC_ACTIONS and "argument_errors" in res)
            if not variable and is_input:
                found = _VARIABLE.search(message)
                variable = found.group(1) if found else None
            # The inventory check runs on the controller's localhost, which is no node: an error of
            # its about no one host (the group, the run id) names none.
            about_none = typed.get("kind") == "input" and not typed.get("host") and not match \
                and data.get("host") == "localhost"
            self.failures.append(Failure(
                host=None if about_none else typed.get("host") or host or (match.group(1) if match
                                                                           else data.get("host", "?")),
                task=data.get("task", ""),
                message=message,
                unreachable=kind == "runner_on_unreachable",
                action=action,
                variable=variable,
                kind="input" if is_input else typed.get("kind") or "node",
            ))
            # The display tells input (said once, by the error) from a node's failure.
            event = dict(event, torchfleet_failure=asdict(self.failures[-1]))
        elif kind == "runner_on_ok":
            res = data.get("res") or {}
            if data.get("task_action") in ("debug", "ansible.builtin.debug"):
                for key, value in res.items():
                    if not key.startswith("_") and key not in ("changed", "failed", "msg"):
                        self.debug_vars[key] = value
        elif kind == "playbook_on_stats":
            self.stats = {k: data.get(k) or {} for k in ("ok", "changed", "failures", "dark", "skipped")}
        if self.hook:
            self.hook(event)
        return False  # runner need not keep the event on disk


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
        self.project_dir = Path(project_dir).resolve() if project_dir else find_project()
        if inventory is None:
            inventory = self.project_dir / "inventory" / "local"
        sources = [inventory] if isinstance(inventory, (str, Path)) else list(inventory)
        self.inventory = [Path(s).resolve() for s in sources]
        for source in self.inventory:
            if not source.exists():
                raise InventoryError(f"inventory {source} does not exist", variable="inventory")
        self.extra_vars = dict(extra_vars or {})
        runs_dir = runs_dir or os.environ.get("TORCHFLEET_RUNS_DIR") or self.project_dir / "runs"
        self.runs_dir = Path(runs_dir).resolve()
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
        result, collected = self._run("playbooks/plan.yml", "plan", job.to_vars() if job else {})
        self._raise_for(result, "plan")
        view = collected.debug_vars.get("launch_plan_view")
        if not view:
            raise TorchfleetError("the plan playbook returned no plan")
        return Plan.from_view(view, result.warnings)

    def provision(self, **extra_vars: Any) -> PlaybookResult:
        """Run site.yml: container runtime, image, dataset (and TLS when asked)."""
        result, _ = self._run("site.yml", "provision", extra_vars)
        self._raise_for(result, "provision")
        return result

    def launch(self, job: Job | None = None) -> RunResult:
        """Run one job attached: submit, follow, collect. Returns its report or raises
        JobFailed carrying it. SIGTERM or Ctrl-C stops every rank on every node, collects
        the logs and raises Interrupted."""
        job = job or Job()
        run_id = check_run_id(job.run_id or self.extra_vars.get("launch_run_id") or new_run_id())
        variables = dict(job.to_vars(), launch_run_id=run_id)
        result, _ = self._run("playbooks/launch.yml", f"launch {run_id}", variables, interruptible=True)
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
        result, _ = self._run("playbooks/launch.yml", f"submit {run_id}", variables, interruptible=True)
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
        where it was found (nodes, local) and the nodes that did not answer."""
        view = self._control("runs", None)
        found: dict[str, dict[str, Any]] = {}
        for host, node in sorted((view.get("nodes") or {}).items()):
            for r in node or []:
                entry = found.setdefault(r["run_id"], {"run_id": r["run_id"], "job": r.get("job"), "state": None,
                                                        "nodes": [], "local": False})
                entry["nodes"].append(host)
                # The master's job.json speaks for the run; other nodes only for their units.
                if r.get("job_state") or entry["state"] in (None, vocab.RunState.EXITED, vocab.RunState.UNKNOWN):
                    entry["state"] = r["state"]
        for run_id in self.runs():
            entry = found.setdefault(run_id, {"run_id": run_id, "job": None, "state": None, "nodes": [], "local": True})
            entry["local"] = True
            if entry["state"] is None:
                summary = json.loads((self.runs_dir / run_id / vocab.SUMMARY).read_text())
                entry["state"] = (vocab.RunState.SUCCEEDED if summary.get("ok") else vocab.RunState.FAILED).value
        for entry in found.values():
            entry["unreachable"] = view.get("unreachable") or []
        return [found[k] for k in sorted(found)]

    def _control(self, action: str, run_id: str | None, interruptible: bool = False,
                 **variables: Any) -> dict[str, Any]:
        result, collected = self._run("playbooks/run.yml", f"{action} {run_id or ''}".strip(),
                                      dict(variables, launch_run_action=action,
                                           **({"launch_run_id": run_id} if run_id else {})), interruptible)
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
        if run is not None and others and all(r.outcome == "not started" for r in run.ranks):
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
        result, _ = self._run("playbooks/down.yml", "down", {})
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
             interruptible: bool = False) -> tuple[PlaybookResult, _Collector]:
        """Run a playbook. SIGTERM or Ctrl-C cancels it; with ``interruptible`` the signal is
        then the caller's to handle (``result.interrupted``), else it goes on at once."""
        import ansible_runner

        collector = _Collector(self._hook_factory(title), self._warn)
        env = {
            # The venv's ansible-playbook, whatever PATH the caller has.
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            "ANSIBLE_CONFIG": str(self.project_dir / "ansible.cfg"),
            "TORCHFLEET_RUNS_DIR": str(self.runs_dir),
            # ansible-runner empties a task result over 700 KB in its event, where the API
            # reads what a playbook shows (a plan, a run's status, its logs), which grows
            # with the cluster: at 48 nodes a status did not come back.
            "MAX_EVENT_RES": str(1 << 30),
            **{k: v for k, v in os.environ.items() if k.startswith("TORCHFLEET_")},
            **self.env,
        }
        started = time.monotonic()
        with _cancel_on_signals(reraise=not interruptible) as cancel, _private_folder() as private:
            cancel.folder = private
            # Variables (a registry password, secret env) reach ansible-playbook as -e @file, a
            # 0600 file in a 0700 folder: never on its command line or in artifacts/*/command.
            _write_private(private / "env" / "extravars", json.dumps({**self.extra_vars, **variables}))
            # How often ansible-runner checks for a cancel (SIGTERM, Ctrl-C) while output is quiet.
            _write_private(private / "env" / "settings", json.dumps({"pexpect_timeout": 1}))
            runner = ansible_runner.run(
                private_data_dir=str(private),
                project_dir=str(self.project_dir),
                # ansible-playbook through torchfleet.playbook_child: it ends with this process.
                binary=_PLAYBOOK_CHILD,
                cmdline=shlex.quote(str(self.project_dir / playbook)),
                inventory=[str(p) for p in self.inventory],
                envvars=env,
                event_handler=collector,
                status_handler=_command_without_env,
                cancel_callback=cancel,
                quiet=True,
                suppress_env_files=True,
            )
            status, rc = runner.status, runner.rc
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


def input_error(failures: Sequence[Failure]) -> InventoryError:
    """One error for the input failures of every node: each sentence once, after the hosts
    it is about (a bad group variable fails on every node, each naming itself)."""
    hosts_of: dict[str, list[str]] = {}
    for f in failures:
        named = _HOSTS_PREFIX.match(f.message)
        hosts = named.group(2).split(", ") if named else [f.host] if f.host else []
        sentence = f.message[named.end():] if named else f.message
        hosts_of.setdefault(sentence, [])
        hosts_of[sentence] += [h for h in hosts if h not in hosts_of[sentence]]
    # In the nodes' order (node-2 before node-10), not the order their failures came in.
    hosts_of = {s: sorted(h, key=lambda name: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)])
                for s, h in hosts_of.items()}
    message = "; ".join(f"host{'s' if len(h) > 1 else ''} {', '.join(h)}: {s}" if h else s
                        for s, h in hosts_of.items())
    hosts = list(dict.fromkeys(h for named in hosts_of.values() for h in named))
    first_named = next(iter(hosts_of.values()))
    return InventoryError(message, first_named[0] if first_named else None, failures[0].variable, failures[0].task,
                          hosts=hosts)


def lost_only(failures: Iterable[Failure], lost: Iterable[str]) -> bool:
    """Whether every failure of a run's playbook is a node the report already names as lost
    (it stopped answering the controller), so that the run's own verdict stands."""
    failures, lost = list(failures), set(lost)
    return bool(failures) and all(f.unreachable and f.host in lost for f in failures)


# --- the runner's private folder ----------------------------------------------------------

_PRIVATE_PREFIX = "torchfleet-runner-"
_PLAYBOOK_CHILD = str(Path(sys.executable).parent / "torchfleet-ansible-playbook")
# Seconds ansible-playbook gets to stop its workers before it is killed.
GRACE_S = 10.0


def _runner_root() -> Path:
    """Where the runner's private folders go: $TORCHFLEET_RUNNER_DIR, else the temp folder."""
    return Path(os.environ.get("TORCHFLEET_RUNNER_DIR") or tempfile.gettempdir())


def _process_start(pid: int) -> str:
    """A process's start time (clock ticks since boot), so that a reused pid is not taken
    for the process that made a folder; "0" where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(name: str) -> bool:
    """Whether the process named in a private folder's name (prefix, pid, start) still runs."""
    pid_text, _, rest = name[len(_PRIVATE_PREFIX):].partition("-")
    start = rest.partition("-")[0]
    try:
        pid = int(pid_text)
        os.kill(pid, 0)
    except ValueError:
        return True  # not named by us: leave it
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return start in ("0", _process_start(pid))


def remove_stale_private_folders(root: str | Path | None = None) -> list[Path]:
    """Remove the runner folders of torchfleet processes that are gone (killed, say), and
    only those: a concurrent run, attach or logs -f keeps its own. Returns what it removed."""
    root = Path(root) if root else _runner_root()
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(_PRIVATE_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.stat(follow_symlinks=False).st_uid != os.getuid() or _owner_alive(entry.name):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


@contextmanager
def _private_folder() -> Iterator[Path]:
    """A 0700 folder named after this process, removed however the block is left."""
    root = _runner_root()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    remove_stale_private_folders(root)
    pid = os.getpid()
    folder = Path(tempfile.mkdtemp(prefix=f"{_PRIVATE_PREFIX}{pid}-{_process_start(pid)}-", dir=root))
    try:
        yield folder
    finally:
        # An exception out of ansible-runner (a caller's hook, say) leaves ansible-playbook
        # running, and writing into the folder.
        _stop_processes(folder)
        shutil.rmtree(folder, ignore_errors=True)


def _write_private(path: Path, text: str) -> None:
    """Write a file that only its owner can read, created with that mode."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def _command_without_env(status: Mapping[str, Any], runner_config: Any) -> None:
    """ansible-runner writes the environment (proxies with passwords, say) beside the command
    in artifacts/<id>/command; keep only the names, before ansible-playbook starts."""
    if status.get("status") != "running":
        return
    path = Path(runner_config.artifact_dir) / "command"
    data = json.loads(path.read_text())
    data["env"] = sorted(data.get("env") or {})
    path.write_text(json.dumps(data))


class _Cancel:
    """ansible-runner's cancel_callback. After SIGTERM or Ctrl-C it asks ansible-playbook
    to stop with SIGTERM, which stops its workers too (a kill of its process group, all
    ansible-runner does, misses them: each runs in a session of its own), and lets
    ansible-runner kill what is left after a grace period."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.folder: Path | None = None
        self._asked_at: float | None = None

    def handler(self, signum: int, frame: Any) -> None:
        self.received.append(signum)

    def __call__(self) -> bool:
        if not self.received:
            return False
        if self._asked_at is None:
            self._asked_at = time.monotonic()
            _signal_all(_processes_naming(self.folder), signal.SIGTERM)
        return time.monotonic() - self._asked_at > GRACE_S


def _signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def _stop_processes(folder: Path) -> None:
    """Stop the processes that still use ``folder``: SIGTERM, then SIGKILL."""
    _signal_all(_processes_naming(folder), signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while _processes_naming(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_all(_processes_naming(folder), signal.SIGKILL)


def _processes_naming(folder: Path | None) -> list[int]:
    """Processes whose command line names ``folder``: this run's ansible-playbook and its
    workers (forks of it, in sessions of their own)."""
    found = []
    if folder is None:
        return found
    # Not Path.glob: it stats each match, and a process that ends in between raises
    # ProcessLookupError, which it does not catch (seen on a busy machine).
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                text = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in text:
            found.append(int(name))
    return found


@contextmanager
def _cancel_on_signals(reraise: bool = True) -> Iterator[_Cancel]:
    """SIGTERM or Ctrl-C cancels the run in hand; once the caller has cleaned up, the
    signal goes on to whatever handled it before (KeyboardInterrupt, or the end), unless
    the caller handles it itself."""
    cancel = _Cancel()
    if threading.current_thread() is not threading.main_thread():
        yield cancel  # only the main thread may set signal handlers
        return
    # A signal this process ignores, or whose handler is not Python's, stays as it is.
    previous = {signum: signal.signal(signum, cancel.handler) for signum in (signal.SIGTERM, signal.SIGINT)
                if signal.getsignal(signum) not in (None, signal.SIG_IGN)}
    try:
        yield cancel
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if cancel.received and reraise:
        signal.raise_signal(cancel.received[0])


# --- the local docker-host cluster ----------------------------------------------------------


def local_up(nodes: int = 3, *, name: str = "torchfleet", subnet: str | None = None,
             inventory_dir: str | Path | None = None, project_dir: str | Path | None = None,
             progress: bool | EventHook = True, **cluster_kwargs: Any) -> tuple[Cluster, PlaybookResult]:
    """Create (or keep) N docker hosts on this machine; returns a Cluster on them."""
    env = cluster_kwargs.pop("env", None)
    variables: dict[str, Any] = {"local_cluster_nodes": int(nodes)}
    if subnet:
        variables["local_cluster_subnet"] = subnet
    project, inventory, result = _local_cluster_playbook(f"local up ({nodes} nodes)", variables, name, inventory_dir,
                                                         project_dir, progress, env)
    return Cluster(inventory, project_dir=project, progress=progress, env=env, **cluster_kwargs), result


def local_down(*, name: str = "torchfleet", inventory_dir: str | Path | None = None,
               project_dir: str | Path | None = None, progress: bool | EventHook = True,
               env: Mapping[str, str] | None = None) -> PlaybookResult:
    """Remove the local docker hosts and their network."""
    return _local_cluster_playbook("local down", {"local_cluster_state": "absent"}, name, inventory_dir,
                                   project_dir, progress, env)[2]


def _local_cluster_playbook(title: str, variables: Mapping[str, Any], name: str, inventory_dir: str | Path | None,
                            project_dir: str | Path | None, progress: bool | EventHook,
                            env: Mapping[str, str] | None) -> tuple[Path, Path, PlaybookResult]:
    """Run playbooks/local_cluster.yml on this machine for the cluster ``name``."""
    project = Path(project_dir).resolve() if project_dir else find_project()
    inventory = _local_inventory(project, inventory_dir)
    controller = Cluster(project / "inventory" / "local", project_dir=project, progress=progress, env=env,
                         extra_vars={"local_cluster_name": name, "local_cluster_inventory": str(inventory / "hosts.yml"),
                                     **variables})
    result, _ = controller._run("playbooks/local_cluster.yml", title, {})
    controller._raise_for(result, title)
    return project, inventory, result


def _local_inventory(project: Path, inventory_dir: str | Path | None) -> Path:
    """The local cluster's inventory folder; another than the default shares its group_vars."""
    if inventory_dir is None:
        return project / "inventory" / "local"
    folder = Path(inventory_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "group_vars"
    if not link.exists():
        link.symlink_to(project / "inventory" / "local" / "group_vars")
    return folder


__all__: Iterable[str] = [
    "Cluster", "Job", "Plan", "RankPlan", "RunResult", "RankResult", "PlaybookResult", "HostResult",
    "Failure", "find_project", "local_up", "local_down", "remove_stale_private_folders",
]
