"""What torchfleet's calls return: a playbook's result and its failures, the plan of a
launch, a run's report (runs/RUN/summary.json, read back) and a run's status on the nodes.
Plain data, with no Ansible in it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from torchfleet.errors import TorchfleetError
from torchfleet.units import RankSpec
from torchfleet import run_vocab as vocab


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
    """One rank of the launch spec (torchfleet.units.RankSpec), and whether its node can run it yet."""

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
    # With restarts (launch_max_restarts): every attempt (start, end, cause, nodes, world
    # size, resumed_from), the last one's number and how many the run had; [], 1, 1 without.
    attempts: list[dict[str, Any]] = field(default_factory=list)
    attempt: int = 1
    max_attempts: int = 1

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
            attempts=data.get("attempts") or [],
            attempt=data.get("attempt") or 1,
            max_attempts=data.get("max_attempts") or 1,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunStatus:
    """A run as the cluster holds it: its state, why it was stopped and each node's units.
    ``source`` says where it was read: ``record``, the master's record of a running run (one
    node); ``nodes``, every node's own records, with the latest log lines (``note`` says why,
    for a status)."""

    run_id: str
    state: str
    job: str | None
    abort: dict[str, Any] | None
    nodes: dict[str, Any]
    unreachable: list[str]
    source: str = "nodes"
    note: str | None = None
    # With restarts (launch_max_restarts): the attempt that runs (or ran last) of how many,
    # whether the next one is being started, and every attempt so far; 1, 1, False, [] without.
    attempt: int = 1
    max_attempts: int = 1
    restarting: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
