"""One node's share of a launch spec while a mode's builder fills it in: the pieces every
mode shares (environment, mounts, pinning, names)."""

from __future__ import annotations

import re
from typing import Any, Mapping

from torchfleet.errors import InventoryError
from torchfleet.settings import devices, malloc_env, site_env
from torchfleet.units import CONTAINER_CHECKPOINTS, CONTAINER_DATA, CONTAINER_OUT, CONTAINER_WORKLOAD, Mount, RankSpec, Unit

# Placeholders launch_args may hold; Ansible's templating leaves single braces alone.
PLACEHOLDER = re.compile(r"\{(data_dir|out_dir|workload_dir)\}")


def threads(node: Mapping[str, Any], local_ranks: int) -> list[int]:
    """Each local rank's OMP_NUM_THREADS: launch_omp_num_threads when set, else its cpuset's
    cores, else the node's CPUs shared out."""
    explicit = int((node.get("settings") or {}).get("omp_num_threads") or 0)
    if explicit > 0:
        return [explicit] * local_ranks
    pinning = node.get("pinning") or []
    if pinning:
        return [int(p["omp_num_threads"]) for p in pinning]
    return [max(1, int(node.get("nproc") or 1) // max(local_ranks, 1))] * local_ranks


def restarts(job: Mapping[str, Any]) -> bool:
    """Whether the run may have later attempts (launch_max_restarts)."""
    return int(float((job.get("guard") or {}).get("max_restarts") or 0)) > 0


def _args(args: list[str], paths: Mapping[str, str]) -> list[str]:
    return [PLACEHOLDER.sub(lambda m: paths[m[1]], str(a)) for a in args]


class NodeContext:
    """One node's share of the spec while a mode's build fills it in."""

    def __init__(self, job: Mapping[str, Any], table: Mapping[str, Any], host: str, node: Mapping[str, Any],
                 rows: list[Mapping[str, Any]], runtime: str, shown: dict[str, str], secret_names: list[str]):
        self.job, self.table, self.host, self.node, self.rows = job, table, host, node, rows
        self.settings = node.get("settings") or {}
        self.runtime, self.shown, self.secret_names = runtime, shown, secret_names
        self.interface = node.get("interface") or ""
        if not self.interface:
            raise InventoryError("has no interface towards MASTER_ADDR", host, "GLOO_SOCKET_IFNAME")
        self.pinning = list(node.get("pinning") or [])
        self.threads = threads(node, len(rows))
        self.is_master = host == table["master_host"]
        self.run_id = job["run_id"]
        node_dir = self.settings.get("node_dir", "/var/lib/torchfleet")
        self.node_run_dir = f"{node_dir}/runs/{self.run_id}"
        self.node_workload_dir = f"{node_dir}/workloads/{job['job']}"
        container = runtime == "container"
        self.paths = {
            "data_dir": CONTAINER_DATA if container else self.settings.get("dataset_dir", ""),
            "out_dir": CONTAINER_OUT if container else self.node_run_dir,
            "workload_dir": CONTAINER_WORKLOAD if container else self.node_workload_dir,
        }
        self.tls_dir = self.settings.get("tls_mount") if container else self.settings.get("tls_node_dir")
        self.python = "python3" if container else self.settings.get("python", "python3")
        self.ranks: list[RankSpec] = []
        self.units: list[Unit] = []
        self.files: dict[str, str] = {}

    # -- pieces every mode shares --

    def labels(self, role: str, rank: int | None = None) -> dict[str, str]:
        labels = {"torchfleet.run": self.run_id, "torchfleet.job": self.job["job"], "torchfleet.role": role}
        if rank is not None:
            labels["torchfleet.rank"] = str(rank)
        return labels

    def workload_argv(self) -> list[str]:
        command = [str(c) for c in self.job.get("command") or []]
        if command:
            return command
        argv = [str(a) for a in self.job["workload_argv"]]
        return [self.python, *argv[1:]]

    def args(self) -> list[str]:
        return _args(list(self.job.get("args") or []), self.paths)

    def cpuset(self, i: int) -> str | None:
        return self.pinning[i]["cpuset"] if self.pinning else None

    def mems(self, i: int) -> str | None:
        return (self.pinning[i].get("cpuset_mems") or None) if self.pinning else None

    def env(self) -> dict[str, str]:
        """The environment of the node's ranks beyond their own numbers (the site's, the
        TLS paths as this runtime sees them, where the data and output go)."""
        env = dict(self.shown)
        if self.settings.get("gloo_tls"):
            env.update(site_env({"gloo_tls": True, "tls_dir": self.tls_dir}))
        # Unbuffered, so that a rank's log shows its progress as it happens, unless the user says otherwise.
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(GLOO_SOCKET_IFNAME=self.interface, TORCHFLEET_RUN_ID=self.run_id,
                   TORCHFLEET_DATA_DIR=self.paths["data_dir"], TORCHFLEET_OUT_DIR=self.paths["out_dir"])
        if self.settings.get("checkpoint_dir"):
            env["TORCHFLEET_CHECKPOINT_DIR"] = CONTAINER_CHECKPOINTS if self.runtime == "container" else \
                self.settings["checkpoint_dir"]
        env.update(malloc_env(self.settings.get("malloc"), env))
        if restarts(self.job):
            # The first attempt's; each later one's guard sets its own.
            env.update(TORCHFLEET_RESTART_COUNT="0", TORCHELASTIC_RESTART_COUNT="0")
        return env

    def rank_env(self, row: Mapping[str, Any], i: int) -> dict[str, str]:
        env = self.env()
        env.update(MASTER_ADDR=str(self.table["master_addr"]), MASTER_PORT=str(self.table["master_port"]),
                   WORLD_SIZE=str(self.table["world_size"]), RANK=str(row["rank"]),
                   LOCAL_RANK=str(row["local_rank"]), LOCAL_WORLD_SIZE=str(row["local_world_size"]),
                   NODE_RANK=str(row["node_rank"]), OMP_NUM_THREADS=str(self.threads[i]))
        return env

    def heartbeat(self, unit: str) -> str:
        """The file a rank may touch to show progress without printing (launch_stall_timeout)."""
        return f"{self.paths['out_dir']}/heartbeat-{unit}"

    def mounts(self) -> list[dict[str, Any]]:
        if self.runtime == "process":
            return []
        s = self.settings
        mounts = [Mount(s.get("dataset_dir", ""), CONTAINER_DATA, True),
                  Mount(self.node_workload_dir, CONTAINER_WORKLOAD, True),
                  Mount(self.node_run_dir, CONTAINER_OUT)]
        if s.get("checkpoint_dir"):
            mounts.append(Mount(s["checkpoint_dir"], CONTAINER_CHECKPOINTS))
        for volume in s.get("extra_volumes") or []:
            parts = str(volume).split(":")
            if len(parts) < 2 or not parts[0] or not parts[1]:
                raise InventoryError(f"launch_extra_volumes entry {volume!r} is not host:container[:ro]",
                                     self.host, "launch_extra_volumes")
            mounts.append(Mount(parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
        if s.get("gloo_tls"):
            mounts.append(Mount(s["tls_node_dir"], s["tls_mount"], True))
        if s.get("sgx_aesm_socket"):
            mounts.append(Mount(s["sgx_aesm_socket_path"], s["sgx_aesm_socket_path"]))
        return [m.docker() for m in mounts]

    def devices(self) -> list[str]:
        return devices(self.settings)

    def rank(self, row: Mapping[str, Any], i: int, runner: str, unit: str, argv: list[str], env: dict[str, str],
             runner_env: tuple[str, ...] = (), user: str | None = None, mems: str | None = None) -> None:
        self.ranks.append(RankSpec(
            rank=int(row["rank"]), host=self.host, node_rank=int(row["node_rank"]), local_rank=int(row["local_rank"]),
            local_world_size=int(row["local_world_size"]), address=str(row["address"]), interface=self.interface,
            runner=runner, unit=unit, argv=argv, workdir=self.paths["workload_dir"],
            env={k: v for k, v in env.items() if k not in runner_env}, secret_env=list(self.secret_names),
            runner_env=list(runner_env), cpuset=self.cpuset(i), cpuset_mems=mems, threads=self.threads[i],
            mounts=self.mounts(), devices=self.devices(), user=user))

    def unit(self, **kwargs: Any) -> Unit:
        kind = "process" if self.runtime == "process" else "container"
        defaults = dict(host=self.host, kind=kind, secret_env=list(self.secret_names), workdir=self.paths["workload_dir"],
                        mounts=self.mounts() if kind == "container" else [], devices=self.devices(),
                        oom_kill_disable=bool(self.settings.get("oom_kill_disable")) and kind == "container")
        unit = Unit(**{**defaults, **kwargs})
        self.units.append(unit)
        return unit

    def name(self, suffix: str) -> str:
        return f"{self.job.get('container_prefix', 'torchfleet')}-{self.run_id}-{suffix}"

    def master_listen(self) -> dict[str, Any] | None:
        """Where the master's rendezvous listens (MASTER_PORT): the guards of a later phase
        start their units once it answers, and the launch waits for it before it says the run
        started. None where the job starts every rank at once (rank_phase)."""
        if not self.is_master or not self.job.get("wait_master_listen", True):
            return None
        return {"host": self.table["master_addr"], "port": int(self.table["master_port"])}

    def rank_phase(self) -> int:
        """The start phase of this node's ranks (or torchrun): the master's first, and the
        others' guards start them once it listens, unless the job starts every rank at once
        (launch_wait_master_listen: false; their stores retry until it listens)."""
        return 0 if self.is_master or not self.job.get("wait_master_listen", True) else 1


# Pins each local rank to its own cpuset with its own thread count, for a mode whose
# launcher starts a node's ranks itself; $1.. is the rank's command. A later attempt's count
# (TORCHFLEET_RESTART_COUNT) overrides the launcher's own TORCHELASTIC_RESTART_COUNT.
PIN = ('[ -z "$TORCHFLEET_RESTART_COUNT" ] || export TORCHELASTIC_RESTART_COUNT="$TORCHFLEET_RESTART_COUNT"; '
       'i=$(({local} + 1)); '
       '[ -z "$TORCHFLEET_CPUSETS" ] || {{ export OMP_NUM_THREADS="$(echo "$TORCHFLEET_THREADS" | cut -d";" -f$i)"; '
       'exec taskset --cpu-list "$(echo "$TORCHFLEET_CPUSETS" | cut -d";" -f$i)" "$@"; }}; exec "$@"')


def pin_env(ctx: NodeContext) -> dict[str, str]:
    return {"TORCHFLEET_CPUSETS": ";".join(p["cpuset"] for p in ctx.pinning),
            "TORCHFLEET_THREADS": ";".join(str(t) for t in ctx.threads)} if ctx.pinning else {}
