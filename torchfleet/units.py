"""What a launch spec is made of: the units torchfleet starts on the nodes, the ranks they
run, and the spec itself. Data only; torchfleet.spec builds it, the modes fill it in."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Inside a container the run's folders sit at fixed paths.
CONTAINER_DATA, CONTAINER_WORKLOAD, CONTAINER_OUT = "/data", "/workload", "/out"
CONTAINER_CHECKPOINTS = "/checkpoints"


@dataclass
class Mount:
    source: str
    target: str
    read_only: bool = False

    def docker(self) -> dict[str, Any]:
        return {"type": "bind", "source": self.source, "target": self.target, "read_only": self.read_only}



@dataclass
class Unit:
    """One thing torchfleet starts on a node: a rank, a torchrun agent, an sshd or mpirun."""

    name: str
    host: str
    kind: str  # container | process
    role: str  # rank | torchrun | sshd | mpirun
    # Phase 0 starts first; a unit of a later phase waits, in its guard, until every earlier
    # unit's listen port answers (spec.start_after).
    phase: int
    argv: list[str]
    env: dict[str, str]
    secret_env: list[str]
    ranks: list[int]
    workdir: str
    cpuset: str | None = None
    cpuset_mems: str | None = None
    mounts: list[dict[str, Any]] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    user: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    listen: dict[str, Any] | None = None
    oom_kill_disable: bool = False
    # What is started: argv under its guard (module_utils/guard.py).
    command: list[str] = field(default_factory=list)
    # What a later attempt (launch_max_restarts) changes: ``env`` maps a variable and ``argv``
    # an option (its next argument) to the attempt's value of that name (guard_policy.unit_attempt):
    # rank, node_rank, world_size, num_nodes, master_addr or master_port.
    attempt: dict[str, dict[str, str]] = field(default_factory=dict)



@dataclass
class RankSpec:
    """What one rank runs and sees."""

    rank: int
    host: str
    node_rank: int
    local_rank: int
    local_world_size: int
    address: str
    interface: str
    runner: str  # container | process | torchrun | mpirun
    unit: str
    argv: list[str]
    workdir: str
    env: dict[str, str]
    secret_env: list[str]
    # Variables the runner sets at run time, whose value no plan can know.
    runner_env: list[str]
    cpuset: str | None
    cpuset_mems: str | None
    threads: int
    mounts: list[dict[str, Any]]
    devices: list[str]
    user: str | None



@dataclass
class LaunchSpec:
    run_id: str
    job: str
    mode: str
    transport: str
    image: str | None
    master_host: str
    master_addr: str
    master_port: int
    world_size: int
    num_nodes: int
    ranks: list[RankSpec]
    units: list[Unit]
    # What every unit's guard reads (guard.json): the store, the units, the timeouts.
    guard: dict[str, Any]
    # Per node: files the start writes into the run's folder before any unit starts.
    files: dict[str, dict[str, str]]
    # Per node where its ranks are not root: the uid:gid that owns its run folder (LaunchMode.run_owner).
    run_owner: dict[str, str] = field(default_factory=dict)
    # Whether the ranks source their secrets from the run folder's secret env file.
    secret_env_file: bool = False
    # What the launch role starts (LaunchMode.unit_kind): container, process, or scheduler
    # (one job that a scheduler runs as the units), which a stop of the run also asks.
    unit_kind: str = "container"

    @property
    def phases(self) -> list[int]:
        return sorted({u.phase for u in self.units})

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), phases=self.phases)
