"""The launch spec: every rank of a job as it will run, computed once, in one place.

One builder per launch mode turns the inventory's settings and the facts read from the
nodes into a :class:`LaunchSpec`. The plan shows it, the start tasks only apply its
``units`` (what torchfleet starts on a node), and the report records it. Everything here is
pure: no node, no Ansible.

Secret values never enter a spec. A secret variable appears under its name in ``env`` with
the value a report may show (``<secret>``, or a URL with ``***`` for its credentials), and
in ``secret_env``; the start task adds the real values from the node's private facts.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from torchfleet import netif, redact
from torchfleet.errors import InventoryError
from torchfleet.ranks import RANK_ENV_NAMES
from torchfleet.report import PEER_ERROR_RE
from torchfleet.vocab import run_vocab

MODES = ("container", "process", "torchrun", "mpirun")
# Inside a container the run's folders sit at fixed paths.
CONTAINER_DATA, CONTAINER_WORKLOAD, CONTAINER_OUT = "/data", "/workload", "/out"
# What the launch sets for every rank besides the rank variables; the user may not set them.
RESERVED_ENV = RANK_ENV_NAMES + ("TORCHFLEET_DATA_DIR", "TORCHFLEET_OUT_DIR", "TORCHFLEET_RUN_ID",
                                 "TORCHFLEET_CPUSETS", "TORCHFLEET_THREADS", "TORCHFLEET_HEARTBEAT")
# The run's settings for its guards (job["guard"]), each from its variable: their defaults
# live in roles/launch/defaults/main.yml only, which also says what each means.
GUARD_VARIABLES = {"port": "launch_guard_port", "node_timeout": "launch_node_timeout",
                   "stall_timeout": "launch_stall_timeout", "timeout": "launch_timeout",
                   "poll_interval": "launch_guard_poll_interval", "stop_grace": "launch_stop_grace",
                   "master_wait_timeout": "launch_master_wait_timeout"}
# What a stop allows the guards beyond a node timeout and a grace before it kills what is left.
STOP_MARGIN_S = 5.0
# Placeholders launch_args may hold; Ansible's templating leaves single braces alone.
PLACEHOLDER = re.compile(r"\{(data_dir|out_dir|workload_dir)\}")
# torchrun picks MASTER_PORT for its ranks itself (its store's port), so a plan cannot know it.
TORCHRUN_DECIDES = ("MASTER_PORT",)
# The allocators launch_malloc preloads: the library's soname, which the dynamic loader
# finds in the image or on the node (preflight asks it: ldconfig -p), and the settings it
# gets. jemalloc's are torch.backends.xeon.run_cpu's own.
ALLOCATORS: dict[str, dict[str, Any]] = {
    "tcmalloc": {"library": "libtcmalloc.so.4", "package": "libgoogle-perftools4", "env": {}},
    "jemalloc": {"library": "libjemalloc.so.2", "package": "libjemalloc2",
                 "env": {"MALLOC_CONF": "oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                                        "dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"}},
}


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
    # Phase 0 starts first; every later phase waits until the earlier one's listen ports answer.
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

    @property
    def phases(self) -> list[int]:
        return sorted({u.phase for u in self.units})

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), phases=self.phases)


# --- settings ---------------------------------------------------------------------------------


def site_env(settings: Mapping[str, Any]) -> dict[str, str]:
    """The open environment every rank gets beyond the rank variables: proxies, SGX, Gloo
    TLS's file paths (``tls_dir``: where the ranks see the node's TLS files) and
    launch_extra_env. Secrets are split off later (redact.split_env)."""
    env: dict[str, Any] = dict(settings.get("proxy_env") or {})
    if settings.get("sgx_enabled"):
        env.update(SGX_ENABLED="true", SGX_LOG_LEVEL=settings.get("sgx_log_level", "error"))
    if settings.get("gloo_tls") and settings.get("tls_dir"):
        tls = settings["tls_dir"]
        env.update(GLOO_DEVICE_TRANSPORT="TCP_TLS", GLOO_DEVICE_TRANSPORT_TCP_TLS_PKEY=f"{tls}/node.key",
                   GLOO_DEVICE_TRANSPORT_TCP_TLS_CERT=f"{tls}/node.crt",
                   GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_FILE=f"{tls}/ca.crt")
    env.update(settings.get("extra_env") or {})
    return {str(k): str(v) for k, v in env.items()}


def malloc_library(malloc: Any) -> str | None:
    """The library launch_malloc preloads, or None for glibc's own allocator."""
    allocator = ALLOCATORS.get(str(malloc or "default"))
    return allocator["library"] if allocator else None


def malloc_env(malloc: Any, env: Mapping[str, str]) -> dict[str, str]:
    """What a rank's environment gains for launch_malloc: LD_PRELOAD with the allocator first
    (a preload the site already sets stays after it) and the allocator's settings, unless the
    site sets them itself."""
    library = malloc_library(malloc)
    if not library:
        return {}
    preload = [p for p in str(env.get("LD_PRELOAD") or "").replace(" ", ":").split(":") if p and p != library]
    extra = {k: v for k, v in ALLOCATORS[str(malloc)]["env"].items() if k not in env}
    return {"LD_PRELOAD": ":".join([library, *preload]), **extra}


def malloc_check(malloc: Any, found: Mapping[str, Any] | None, where: str) -> list[dict[str, Any]]:
    """check_input's entry for launch_malloc's library (``found``: soname to its path, None
    where the dynamic loader has none; ``where``: the image or the python_env it was asked
    in). None for ``found`` means the runtime itself is missing, which its own check reports."""
    library = malloc_library(malloc)
    if not library or found is None:
        return []
    error = found.get("error") if isinstance(found, Mapping) else None
    package = ALLOCATORS[str(malloc)]["package"]
    return [{"that": bool(found.get(library)), "kind": "node", "variable": "launch_malloc",
             "msg": f"launch_malloc={malloc} but {where} has no {library} (ldconfig -p"
                    f"{': ' + str(error) if error else ''}); install {package} there, or set launch_malloc: default"}]


def check_env(host: str, env: Mapping[str, Any], secret_names: list[str]) -> None:
    """Refuse what would change a rank's identity, in every mode."""
    if "GLOO_TCP_IFACE" in env:
        raise InventoryError("launch_extra_env sets GLOO_TCP_IFACE, which nothing reads; torchfleet sets "
                             "GLOO_SOCKET_IFNAME from the route to MASTER_ADDR (set torchfleet_cluster_address "
                             "or torchfleet_cluster_network to steer it)", host, "launch_extra_env")
    for name in env:
        if name in RESERVED_ENV:
            # A value with credentials in a URL is kept secret too, but the user set it in the open.
            variable = "launch_secret_env" if env[name] == redact.HIDDEN else "launch_extra_env"
            raise InventoryError(f"{variable} may not set {name}, which the launch sets for every rank",
                                 host, variable)


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


def _args(args: list[str], paths: Mapping[str, str]) -> list[str]:
    return [PLACEHOLDER.sub(lambda m: paths[m[1]], str(a)) for a in args]


# What a mode cannot do, by option: (setting, how to tell it is used, why).
_UNSUPPORTED: dict[str, list[tuple[str, Callable[[Mapping[str, Any]], bool], str]]] = {
    "process": [
        ("launch_extra_volumes", lambda s: bool(s.get("extra_volumes")),
         "bare processes have no mounts; the paths are already on the node"),
        ("launch_oom_kill_disable", lambda s: bool(s.get("oom_kill_disable")),
         "it is a docker run option"),
    ],
}


def _refuse_unsupported(host: str, mode: str, runtime: str, settings: Mapping[str, Any]) -> None:
    key = "process" if runtime == "process" else mode
    for variable, used, why in _UNSUPPORTED.get(key, []):
        if used(settings):
            where = f"launch_mode={mode}" + (" with launch_torchrun_runtime=process" if mode == "torchrun" else "")
            raise InventoryError(f"{variable} cannot apply under {where} ({why}); remove it or use a container "
                                 "launch", host, variable)


# --- the builder ------------------------------------------------------------------------------


def build(job: Mapping[str, Any], table: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> LaunchSpec:
    """The spec of one launch.

    ``job``: run_id, job, mode, transport, image, torchrun_runtime, container_prefix, command
    (an explicit command, else ``workload_argv``: the entry point) and args.
    ``table``: ranks.rank_table's result. ``nodes``: per host, its facts (address,
    interface, nproc, pinning, mpi_network) and ``settings`` (that host's launch_* values,
    the open env ``env_public`` and what may be shown of every variable ``env_shown``).
    """
    mode = job["mode"]
    if mode not in MODES:
        raise InventoryError(f"launch_mode={mode!r} is not one of {', '.join(MODES)}", None, "launch_mode")
    runtime = mode_runtime(mode, job.get("torchrun_runtime", "container"))
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for row in table["ranks"]:
        by_host.setdefault(row["host"], []).append(row)
    ranks: list[RankSpec] = []
    units: list[Unit] = []
    files: dict[str, dict[str, str]] = {}
    for host, rows in by_host.items():
        node = nodes[host]
        settings = node.get("settings") or {}
        _refuse_unsupported(host, mode, runtime, settings)
        shown = {str(k): str(v) for k, v in (node.get("env_shown") or {}).items()}
        public = {str(k): str(v) for k, v in (node.get("env_public") or {}).items()}
        secret_names = sorted(set(shown) - set(public))
        check_env(host, shown, secret_names)
        if mode == "mpirun" and settings.get("ssh_launcher") not in (None, "", table["master_host"]):
            raise InventoryError(f"ssh_mesh_launcher={settings['ssh_launcher']} but node rank 0 is "
                                 f"{table['master_host']}; mpirun runs on the master node, so make them the same "
                                 "host", host, "ssh_mesh_launcher")
        ctx = _NodeContext(job, table, host, node, rows, runtime, shown, secret_names)
        _BUILDERS[mode](ctx)
        ranks += ctx.ranks
        units += ctx.units
        if ctx.files:
            files[host] = ctx.files
    guard = _guard(job, table, units, nodes)
    for node_files in (files.setdefault(h, {}) for h in by_host):
        node_files[run_vocab.GUARD_CONFIG] = _json(guard)
    return LaunchSpec(
        run_id=job["run_id"], job=job["job"], mode=mode, transport=job.get("transport", "tcp"),
        image=None if runtime == "process" else job.get("image"),
        master_host=table["master_host"], master_addr=table["master_addr"], master_port=int(table["master_port"]),
        world_size=int(table["world_size"]), num_nodes=int(table["num_nodes"]),
        ranks=sorted(ranks, key=lambda r: r.rank), units=units, guard=guard, files=files,
    )


def guard_settings(job: Mapping[str, Any], master_port: int) -> dict[str, float]:
    """The guard's settings, checked: a port of its own, positive intervals. Every one is
    the run's (GUARD_VARIABLES); what follows from them is computed here, once:
    ``start_timeout``, the allowance of a unit still starting, and ``stop_wait``, how long a
    stop waits for the guards to end every unit before it kills what is left (a guard cut
    off from the store gives up after the node timeout, then its unit gets the grace)."""
    given = {k: v for k, v in (job.get("guard") or {}).items() if v not in (None, "")}
    unset = [variable for k, variable in GUARD_VARIABLES.items() if k not in given]
    if unset:
        raise InventoryError(f"{', '.join(unset)} not set for the run's guards", None, unset[0])
    settings = {k: float(given[k]) for k in GUARD_VARIABLES}
    settings["port"] = int(settings["port"])
    settings["start_timeout"] = settings["master_wait_timeout"] + settings["node_timeout"]
    if not 1 <= settings["port"] <= 65535 or settings["port"] == int(master_port):
        raise InventoryError(f"launch_guard_port={settings['port']} must be a port from 1 to 65535 other than "
                             f"MASTER_PORT ({master_port})", None, "launch_guard_port")
    for name, low in (("node_timeout", 1.0), ("poll_interval", 0.05), ("stop_grace", 0.0),
                      ("master_wait_timeout", 1.0), ("stall_timeout", 0.0), ("timeout", 0.0)):
        variable = GUARD_VARIABLES[name]
        if settings[name] < low:
            raise InventoryError(f"{variable}={settings[name]:g} must be at least {low:g}", None, variable)
    if settings["node_timeout"] < 2 * settings["poll_interval"]:
        raise InventoryError(f"launch_node_timeout={settings['node_timeout']:g} must be at least twice "
                             f"launch_guard_poll_interval ({settings['poll_interval']:g})", None, "launch_node_timeout")
    settings["stop_wait"] = settings["node_timeout"] + settings["stop_grace"] + STOP_MARGIN_S
    return settings


def _guard(job: Mapping[str, Any], table: Mapping[str, Any], units: list[Unit],
           nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The guard's config, and every unit's command wrapped in its guard. The master's first
    unit to start hosts the store, on the cluster address, on its own port."""
    settings = guard_settings(job, table["master_port"])
    master = table["master_host"]
    host_unit = min((i for i, u in enumerate(units) if u.host == master), key=lambda i: (units[i].phase, i))
    for i, unit in enumerate(units):
        s = nodes[unit.host].get("settings") or {}
        out = CONTAINER_OUT if unit.kind == "container" else \
            f"{s.get('node_dir', '/var/lib/torchfleet')}/runs/{job['run_id']}"
        python = "python3" if unit.kind == "container" else s.get("python", "python3")
        unit.command = [python, f"{out}/{run_vocab.GUARD_SOURCE}", f"{out}/{run_vocab.GUARD_CONFIG}", str(i), "--",
                        *unit.argv]
    return {
        "run_id": job["run_id"], "job": job["job"], "store_unit": host_unit,
        "store": {"host": str(table["master_addr"]), "port": settings["port"], "node": master},
        "node_timeout": settings["node_timeout"], "stall_timeout": settings["stall_timeout"],
        "job_timeout": settings["timeout"], "poll_interval": settings["poll_interval"],
        "stop_grace": settings["stop_grace"], "start_timeout": settings["start_timeout"],
        "stop_wait": settings["stop_wait"], "peer_error": PEER_ERROR_RE.pattern,
        "units": [{"name": u.name, "host": u.host, "role": u.role, "ranks": u.ranks, "service": u.role == "sshd",
                   "heartbeat": u.env.get("TORCHFLEET_HEARTBEAT"), "log": _log(u)} for u in units],
    }


def _log(unit: Unit) -> str | None:
    """Where a container unit's guard copies its output, so that it can be read while the
    unit runs (a process unit's output already goes to its log file)."""
    if unit.kind != "container":
        return None
    return f"{CONTAINER_OUT}/{f'rank-{unit.ranks[0]}' if unit.role == 'rank' else unit.role}.log"


def _json(data: Any) -> str:
    import json

    return json.dumps(data, indent=1, sort_keys=True) + "\n"


class _NodeContext:
    """One node's share of the spec while a builder fills it in."""

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
        env.update(malloc_env(self.settings.get("malloc"), env))
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
        """What the other nodes' start waits for: MASTER_PORT, unless the job says to start
        them as soon as the master's ranks run (their stores retry until it listens)."""
        if not self.is_master or not self.job.get("wait_master_listen", True):
            return None
        return {"host": self.table["master_addr"], "port": int(self.table["master_port"])}



def _build_ranks(ctx: _NodeContext) -> None:
    """container and process: one unit per rank, the master node's first."""
    argv = ctx.workload_argv() + ctx.args()
    for i, row in enumerate(ctx.rows):
        env = ctx.rank_env(row, i)
        name = ctx.name(f"rank{row['rank']}") if ctx.runtime == "container" else f"rank-{row['rank']}"
        env["TORCHFLEET_HEARTBEAT"] = ctx.heartbeat(name)
        mems = ctx.mems(i) if ctx.runtime == "container" else None
        ctx.unit(name=name, role="rank", phase=0 if ctx.is_master else 1, argv=argv, env=env, ranks=[int(row["rank"])],
                 cpuset=ctx.cpuset(i), cpuset_mems=mems, labels=ctx.labels("rank", row["rank"]),
                 listen=ctx.master_listen() if i == 0 else None)
        ctx.rank(row, i, ctx.runtime, name, argv, env, mems=mems)


# Pins each local rank to its own cpuset with its own thread count (torchrun and mpirun
# start a node's ranks themselves); $1.. is the rank's command.
_PIN = ('i=$(({local} + 1)); '
        '[ -z "$TORCHFLEET_CPUSETS" ] || {{ export OMP_NUM_THREADS="$(echo "$TORCHFLEET_THREADS" | cut -d";" -f$i)"; '
        'exec taskset --cpu-list "$(echo "$TORCHFLEET_CPUSETS" | cut -d";" -f$i)" "$@"; }}; exec "$@"')


def _pin_env(ctx: _NodeContext) -> dict[str, str]:
    return {"TORCHFLEET_CPUSETS": ";".join(p["cpuset"] for p in ctx.pinning),
            "TORCHFLEET_THREADS": ";".join(str(t) for t in ctx.threads)} if ctx.pinning else {}


def _build_torchrun(ctx: _NodeContext) -> None:
    """One torchrun agent per node, static rendezvous on the master at MASTER_PORT: the
    node rank decides who hosts the store and which global ranks run where, so they are the
    plan's (c10d rendezvous ignores --node-rank and orders the nodes by address)."""
    workload = ctx.workload_argv()
    script = workload[1:]
    argv = [ctx.python, "-m", "torch.distributed.run", "--nnodes", str(ctx.table["num_nodes"]),
            "--nproc-per-node", str(len(ctx.rows)), "--node-rank", str(ctx.rows[0]["node_rank"]),
            "--rdzv-backend", "static", "--master-addr", str(ctx.table["master_addr"]),
            "--master-port", str(ctx.table["master_port"]), "--rdzv-id", ctx.run_id, "--max-restarts", "0",
            "--tee", "3"]
    # torchrun runs `python -u script` or `python -u -m module`; through the pin wrapper it
    # runs the command as given.
    if ctx.job.get("command"):
        argv += ["--no-python", "sh", "-c", _PIN.format(local="$LOCAL_RANK"), "rank", *workload]
    elif ctx.pinning:
        argv += ["--no-python", "sh", "-c", _PIN.format(local="$LOCAL_RANK"), "rank", ctx.python, "-u", *script]
    elif script[0] == "-m":
        argv += ["-m", *script[1:]]
    else:
        argv += script
    argv += ctx.args()
    # torchrun forces OMP_NUM_THREADS=1 for several ranks unless it is set.
    env = ctx.env()
    name = ctx.name("torchrun") if ctx.runtime == "container" else "torchrun"
    env.update(OMP_NUM_THREADS=str(ctx.threads[0]), NODE_RANK=str(ctx.rows[0]["node_rank"]),
               TORCHFLEET_HEARTBEAT=ctx.heartbeat(name), **_pin_env(ctx))
    # taskset pins each rank's CPUs; only a container can hold its memory to the ranks' nodes.
    mems = ",".join(sorted({m for i in range(len(ctx.rows)) if (m := ctx.mems(i))})) or None
    mems = mems if ctx.runtime == "container" else None
    ctx.unit(name=name, role="torchrun", phase=0 if ctx.is_master else 1, argv=argv, env=env,
             ranks=[int(r["rank"]) for r in ctx.rows],
             cpuset=",".join(p["cpuset"] for p in ctx.pinning) if ctx.pinning else None, cpuset_mems=mems,
             labels=ctx.labels("torchrun", ctx.rows[0]["rank"]), listen=ctx.master_listen())
    rank_argv = [ctx.python, "-u", *script] if not ctx.job.get("command") else workload
    for i, row in enumerate(ctx.rows):
        rank_env = ctx.rank_env(row, i)
        rank_env.update(_pin_env(ctx), TORCHFLEET_HEARTBEAT=env["TORCHFLEET_HEARTBEAT"])
        ctx.rank(row, i, "torchrun", name, rank_argv + ctx.args(), rank_env, runner_env=TORCHRUN_DECIDES, mems=mems)


def _build_mpirun(ctx: _NodeContext) -> None:
    """sshd in the training image on every other node, then mpirun on the master over the
    ssh_mesh. Open MPI binds nothing; each rank sources its node's env file, takes the
    torchrun-style variables from Open MPI's and pins itself (node.env: -x passes one value
    to every node, but the interface, threads and cpusets are the node's own)."""
    s = ctx.settings
    user = f"{s.get('ssh_uid', 61000)}:{s.get('ssh_gid', 61000)}"
    env = ctx.env()
    env.update(NODE_RANK=str(ctx.rows[0]["node_rank"]), OMP_NUM_THREADS=str(ctx.threads[0]), **_pin_env(ctx))
    env.pop("PYTHONUNBUFFERED")
    ctx.files = {"node.env": "".join(f"{k}={shlex.quote(v)}\n" for k, v in sorted(env.items())
                                     if k not in ctx.secret_names)}
    workload = ctx.workload_argv() + ctx.args()
    container_dir = s.get("ssh_container_dir", "/etc/torchfleet/ssh")
    if ctx.is_master:
        hosts = ",".join(f"{r['host']}:{r['local_world_size']}" for r in ctx.table["ranks"] if r["local_rank"] == 0)
        network = ctx.node.get("mpi_network") or ""
        argv = ["mpirun", "-np", str(ctx.table["world_size"]), "-H", hosts, "-bind-to", "none", "-map-by", "slot",
                "--tag-output", "-wdir", CONTAINER_WORKLOAD,
                "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "PATH", "-x", "PYTHONUNBUFFERED",
                "--mca", "oob_tcp_if_include", network, "--mca", "btl_tcp_if_include", network,
                *[str(a) for a in s.get("mpirun_args") or []],
                "/bin/sh", "-c", _MPI_RANK, "rank", *workload]
        ssh_dir = f"/home/{s.get('ssh_user', 'torchfleet')}/.ssh"
        ctx.unit(name=ctx.name("mpirun"), role="mpirun", phase=1, argv=argv,
                 env={"MASTER_ADDR": str(ctx.table["master_addr"]), "MASTER_PORT": str(ctx.table["master_port"]),
                      "PYTHONUNBUFFERED": "1"},
                 ranks=[int(r["rank"]) for r in ctx.table["ranks"]], user=user, secret_env=[],
                 labels=ctx.labels("mpirun"),
                 mounts=ctx.mounts() + [Mount(s.get("ssh_client_dir", "/etc/torchfleet/ssh-client"), ssh_dir,
                                              True).docker()])
    else:
        ctx.unit(name=ctx.name("sshd"), role="sshd", phase=0,
                 argv=[s.get("sshd_path", "/usr/sbin/sshd"), "-D", "-e", "-f", f"{container_dir}/sshd_config"],
                 env={}, ranks=[], user=user, secret_env=[], labels=ctx.labels("sshd"),
                 listen={"host": str(ctx.rows[0]["address"]), "port": int(s.get("ssh_port", 12345))},
                 mounts=ctx.mounts() + [Mount(s.get("ssh_node_dir", "/etc/torchfleet/ssh"), container_dir,
                                              True).docker()])
    unit = ctx.name("mpirun")
    for i, row in enumerate(ctx.rows):
        rank_env = ctx.rank_env(row, i)
        rank_env.update(_pin_env(ctx))
        ctx.rank(row, i, "mpirun", unit, workload, rank_env, user=user)


# Each mpirun rank: its node's environment, the secret part where there is one, the
# torchrun-style names from Open MPI's, then its own cpuset.
_MPI_RANK = (
    f'set -a; . /out/node.env; [ ! -f /out/{run_vocab.SECRET_ENV} ] || . /out/{run_vocab.SECRET_ENV}; set +a; '
    'export RANK="$OMPI_COMM_WORLD_RANK" WORLD_SIZE="$OMPI_COMM_WORLD_SIZE" '
    'LOCAL_RANK="$OMPI_COMM_WORLD_LOCAL_RANK" LOCAL_WORLD_SIZE="$OMPI_COMM_WORLD_LOCAL_SIZE"; '
    + _PIN.format(local="$OMPI_COMM_WORLD_LOCAL_RANK"))


_BUILDERS: dict[str, Callable[[_NodeContext], None]] = {
    "container": _build_ranks, "process": _build_ranks, "torchrun": _build_torchrun, "mpirun": _build_mpirun,
}


def devices(settings: Mapping[str, Any]) -> list[str]:
    """The devices every rank of a node gets, as ``host[:container[:perms]]``."""
    return [str(d) for d in list(settings.get("sgx_devices") or []) + list(settings.get("extra_devices") or [])]


def node_paths(settings: Mapping[str, Any]) -> list[dict[str, str]]:
    """The paths a node must have for its ranks, each with the variable that asks for it."""
    needed = [{"path": str(d).split(":")[0], "variable": variable}
              for key, variable in (("sgx_devices", "launch_sgx_devices"), ("extra_devices", "launch_extra_devices"))
              for d in settings.get(key) or []]
    if settings.get("sgx_aesm_socket"):
        needed.append({"path": str(settings["sgx_aesm_socket_path"]), "variable": "launch_sgx_aesm_socket_path"})
    return needed


def as_bool(value: Any = False) -> bool:
    """A YAML or inventory boolean (yes, "true", 1, ...), as Ansible's bool filter reads it."""
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on", "y", "t")
    return bool(value)


# A node's launch settings, each from the variable that sets it (roles/launch/defaults says
# what each means). Read by the launch_input action from the host's variables: one Python
# call, where as many Jinja expressions would each be compiled again for every node.
SETTINGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "node_dir": ("launch_node_dir", str), "dataset_dir": ("launch_dataset_dir", str),
    "python": ("launch_python", str), "omp_num_threads": ("launch_omp_num_threads", int),
    "extra_volumes": ("launch_extra_volumes", list), "extra_devices": ("launch_extra_devices", list),
    "sgx_devices": ("launch_sgx_devices", list), "sgx_aesm_socket": ("launch_sgx_aesm_socket", as_bool),
    "sgx_aesm_socket_path": ("launch_sgx_aesm_socket_path", str), "sgx_enabled": ("launch_sgx_enabled", as_bool),
    "sgx_log_level": ("launch_sgx_log_level", str), "gloo_tls": ("launch_gloo_tls", as_bool),
    "tls_node_dir": ("launch_tls_node_dir", str), "tls_mount": ("launch_tls_mount", str),
    "oom_kill_disable": ("launch_oom_kill_disable", as_bool), "mpirun_args": ("launch_mpirun_args", list),
    "ssh_port": ("launch_ssh_port", int), "ssh_user": ("launch_ssh_user", str), "ssh_uid": ("launch_ssh_uid", int),
    "ssh_gid": ("launch_ssh_gid", int), "ssh_node_dir": ("launch_ssh_node_dir", str),
    "ssh_client_dir": ("launch_ssh_client_dir", str), "ssh_container_dir": ("launch_ssh_container_dir", str),
    "sshd_path": ("launch_sshd_path", str), "malloc": ("launch_malloc", str),
}
# The launch's numbers whose range argument_specs cannot express: (variable, min, max or
# None for no bound, what a bound value means).
RANGES: tuple[tuple[str, float, float | None, str], ...] = (
    ("launch_timeout", 0, None, " (0: no limit)"), ("launch_poll_interval", 0.1, 3600, ""),
    ("launch_progress_interval", 0.1, None, ""), ("launch_master_wait_timeout", 1, None, ""),
    ("launch_guard_port", 1, 65535, ""), ("launch_guard_poll_interval", 0.05, 60, ""),
    ("launch_node_timeout", 1, None, ""), ("launch_stall_timeout", 0, None, " (0: never)"),
    ("launch_stop_grace", 0, 3600, ""), ("launch_keep_runs", 1, None, ""),
    ("launch_omp_num_threads", 0, None, " (0: from the CPUs)"),
    ("launch_collect_out_max_mb", 0, 1 << 20, " (0: bring no out folder back)"),
)
# launch_transport wireguard's numbers, checked only with it.
OVERLAY_RANGES: tuple[tuple[str, float, float | None, str], ...] = (
    ("launch_overlay_probe_port", 1, 65535, ""), ("launch_overlay_probe_timeout", 0.01, None, ""),
    ("launch_overlay_handshake_max_age", 1, None, ""),
)
# Every variable node_input reads.
INPUT_VARIABLES = tuple(sorted({v for v, _ in SETTINGS.values()} | {r[0] for r in RANGES + OVERLAY_RANGES} | {
    "launch_mode", "launch_torchrun_runtime", "ssh_mesh_launcher", "launch_proxy_env", "launch_extra_env", "launch_secret_env",
    "launch_transport", "launch_overlay_interface", "launch_master_port"}))


def mode_runtime(mode: str, torchrun_runtime: str = "container") -> str:
    """Where a launch mode's ranks run: ``process`` (bare, in the node's Python) or ``container``."""
    if mode == "torchrun":
        return torchrun_runtime
    return "process" if mode == "process" else "container"


def node_input(values: Mapping[str, Any], host: str) -> dict[str, Any]:
    """A node's checked input (``values``: its INPUT_VARIABLES, templated): ``settings``, the
    open environment ``env_public``, what may be shown of every variable ``env_shown``,
    whether it has secrets, and under launch_transport wireguard the overlay's interface,
    whose address rank_plan takes as the node's, and ``bare``: whether its ranks run as
    processes (mode_runtime), which decides what the check phase reads on the node. The
    secret values stay out: the ranks' start reads them again.
    Out-of-range numbers and bad secret names raise, every failure in one message."""
    overlay = values.get("launch_transport") == "wireguard"
    bad = out_of_range([{"name": n, "value": values.get(n), "min": low, "max": high, "why": why}
                        for n, low, high, why in RANGES + (OVERLAY_RANGES if overlay else ())])
    if overlay and not bad and int(values["launch_overlay_probe_port"]) == int(values.get("launch_master_port") or 0):
        bad.append({"variable": "launch_overlay_probe_port", "message": f"launch_overlay_probe_port="
                    f"{values['launch_overlay_probe_port']} must differ from launch_master_port"})
    settings = {}
    if not bad:
        settings = {key: convert(values[variable]) if values.get(variable) is not None else convert()
                    for key, (variable, convert) in SETTINGS.items()}
        mpirun = values.get("launch_mode") == "mpirun"
        settings["ssh_launcher"] = str(values.get("ssh_mesh_launcher") or "") if mpirun else ""
    try:
        parts = split_site_env({**settings, "proxy_env": values.get("launch_proxy_env") or {},
                                "extra_env": values.get("launch_extra_env") or {}},
                               values.get("launch_secret_env") or {}, host)
    except InventoryError as exc:
        bad.append({"variable": exc.variable or "launch_secret_env", "message": str(exc)})
        parts = {}
    if bad:
        raise InventoryError("; ".join(b["message"] for b in bad), host, bad[0]["variable"])
    return {"settings": settings, "env_public": parts["public"], "env_shown": parts["shown"],
            "has_secrets": bool(parts["secret"]),
            "bare": mode_runtime(str(values.get("launch_mode")),
                                 str(values.get("launch_torchrun_runtime") or "container")) == "process",
            "overlay_interface": str(values.get("launch_overlay_interface") or "") if overlay else ""}


def node_entry(host: str, table: Mapping[str, Any], mode: str, probe: Mapping[str, Any],
               checked: Mapping[str, Any], pinning: list[Mapping[str, Any]] | None) -> dict[str, Any]:
    """What build needs of one node: its address (its first rank's), the interface it routes
    MASTER_ADDR through, its CPUs and pinning, and for mpirun's master its network; with
    its checked input (node_input). ``probe``: node_probe's reading, with its addresses and
    routing tables."""
    address = next(r["address"] for r in table["ranks"] if r["host"] == host)
    master = str(table["master_addr"])
    mpi = mode == "mpirun" and host == table["master_host"]
    return {
        "address": address,
        "interface": netif.gloo_interface(host, master, probe.get("ip_addr"), probe.get("routes")),
        "nproc": int(probe.get("nproc") or 1),
        "pinning": list(pinning or []),
        "mpi_network": netif.address_network(host, master, probe.get("ip_addr")) if mpi else "",
        "settings": checked["settings"], "env_public": checked["env_public"], "env_shown": checked["env_shown"],
    }


def unit_index(units: list[Mapping[str, Any]]) -> dict[str, dict[str, list[int]]]:
    """Each host's units by phase, as indexes into ``units`` (the spec's): a start task looks
    up its own, where filtering every node's units would cost each node the cluster's size."""
    index: dict[str, dict[str, list[int]]] = {}
    for i, unit in enumerate(units):
        index.setdefault(str(unit["host"]), {}).setdefault(str(unit["phase"]), []).append(i)
    return index


def mesh_paths(settings: Mapping[str, Any]) -> dict[str, str]:
    """The SSH mesh's file that the mpirun mode needs of a node: the launcher's ssh client
    configuration on the master, sshd's configuration on the others."""
    return {"master": f"{settings['ssh_client_dir']}/config", "worker": f"{settings['ssh_node_dir']}/sshd_config"}


def mesh_checks(reading: Mapping[str, Any], image_account: Mapping[str, Any] | None, settings: Mapping[str, Any],
                master: bool, image: str) -> list[dict[str, Any]]:
    """The mpirun mode's check_input entries for a node: its mesh file is there (``reading``:
    node_probe's, with ``missing`` and ``account``, the node's account of the mesh's uid), no
    login account has that uid (it would own the mesh's private keys), and the image has a
    user of that name and uid (``image_account``: rank_containers', None where the node lacks
    the image, which the runtime check reports)."""
    path = mesh_paths(settings)["master" if master else "worker"]
    uid, user = settings["ssh_uid"], settings["ssh_user"]
    checks = [{"that": path not in (reading.get("missing") or []), "kind": "node", "variable": "launch_mode",
               "msg": f"launch_mode=mpirun but {path} is missing; run site.yml with launch_mode: mpirun "
                      "(it adds the ssh_mesh role)"}]
    account = reading.get("account")
    login = bool(account) and account[6].rsplit("/", 1)[-1] not in ("nologin", "false")
    checks.append({"that": not login, "kind": "node", "variable": "launch_ssh_uid",
                   "msg": f"ssh_mesh_uid {uid} belongs to the login account {account[0] if account else ''} (shell "
                          f"{account[6] if account else ''}), which would own the mesh's private keys; set "
                          "ssh_mesh_uid and ssh_mesh_gid to a uid that no login account has, as the training "
                          f"image's {user} user (61000) does"})
    if image_account is not None:
        entry = image_account.get("entry")
        found = ":".join(entry) if entry else image_account.get("error") or "nothing"
        checks.append({"that": bool(entry) and entry[0] == user, "kind": "node", "variable": "launch_ssh_uid",
                       "msg": f"the image {image} has no user {user} with ssh_mesh_uid {uid} (getent passwd {uid}: "
                              f"{found}); add it to the image (useradd --uid {uid} {user}) or set ssh_mesh_uid and "
                              "ssh_mesh_user to the image's own"})
    return checks


def missing_path_check(needed: Mapping[str, str]) -> dict[str, Any]:
    """A failed check_input entry for a path a node lacks (``needed``: one of node_paths)."""
    return {"that": False, "kind": "node", "variable": needed["variable"],
            "msg": f"{needed['path']} does not exist on the node ({needed['variable']})"}


def taken_port_check(port: Any, table: Mapping[str, Any], skip: bool = False) -> dict[str, Any]:
    """A check_input entry for a port that already listens on the master (passes when ``skip``)."""
    variable = "launch_master_port" if int(port) == int(table["master_port"]) else "launch_guard_port"
    return {"that": bool(skip), "kind": "node", "variable": variable,
            "msg": f"{variable} {port} is already in use on {table['master_addr']}; choose another {variable}"}


def node_checks(host: str, reading: Mapping[str, Any], ready: bool, running: list[str], table: Mapping[str, Any], *,
                bare: bool, runtime: str, settings: Mapping[str, Any], job: str, planning: bool,
                replace: bool, mpirun: bool = False, image_account: Mapping[str, Any] | None = None,
                libraries: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """check_input's checks of a node's state against the launch: its runtime (``runtime``:
    launch_python, or launch_image where ``bare`` is false), each path its ranks need
    (``reading``: node_probe's, with ``missing`` and ``listening``), a run of the job that
    still runs there (``running``), and the ports already taken on the master (``host``
    is the master's where ``table`` says so). A plan
    (``planning``) reports what it finds and fails on none; under ``replace`` the ports
    are checked once the replaced run has stopped. Under ``mpirun``, the SSH mesh's checks
    (mesh_checks) come too, and launch_malloc's library where the loader was asked
    (``libraries``: in the image, or on the node for a bare launch; malloc_check)."""
    if bare:
        runtime_check = {"variable": "launch_python",
                         "msg": f"launch_python {runtime} does not exist; run site.yml with torchfleet_python_env: true first"}
    else:
        runtime_check = {"variable": "launch_image", "msg": f"launch_image {runtime} is not on this node; run site.yml first"}
    checks = [{"that": planning or bool(ready), "kind": "node", **runtime_check}]
    missing = set(reading.get("missing") or [])
    checks += [missing_path_check(p) for p in node_paths(settings) if p["path"] in missing]
    checks.append({"that": planning or replace or not running, "kind": "running", "variable": "launch_job",
                   "msg": f"job {job} is still running as run {', '.join(running)}; stop it (torchfleet stop "
                          f"{running[0] if running else ''}), or launch with --replace (launch_replace=true), which "
                          "stops it first and keeps its logs"})
    # Every node reports its ports; only the master's are the rendezvous's and the guards'.
    skip_ports = planning or replace or bool(running)
    taken = reading.get("listening") or [] if host == table["master_host"] else []
    checks += [taken_port_check(port, table, skip_ports) for port in taken]
    if mpirun:
        checks += mesh_checks(reading, image_account, settings, host == table["master_host"], runtime)
    where = f"launch_python {runtime}'s node" if bare else f"launch_image {runtime}"
    checks += [dict(c, that=planning or c["that"]) for c in malloc_check(settings.get("malloc"), libraries, where)]
    return checks


def split_site_env(settings: Mapping[str, Any], secret: Mapping[str, Any] | None, host: str) -> dict[str, dict[str, str]]:
    """A node's environment split into its open part, its secret part and what may be
    shown of every variable; secret names a shell cannot take are refused."""
    env = site_env(settings)
    redact.check_env(env, secret, host)
    return redact.split_env(env, secret)


def redacted(spec: LaunchSpec | Mapping[str, Any]) -> dict[str, Any]:
    """The spec as it may be written anywhere: secrets are never in it, and a URL's
    credentials anywhere in it (an argument, say) are masked."""
    data = spec.to_dict() if isinstance(spec, LaunchSpec) else dict(spec)
    return _mask(data)


def _mask(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _mask(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask(v) for v in value]
    return redact.redact(value) if isinstance(value, str) else value


JOB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def out_of_range(checks: list[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The launch numbers outside their range, each as the variable and a sentence. A check
    is ``{name, value, min, max}`` (``max`` None: no upper bound) and may say ``why``."""
    found = []
    for check in checks:
        name, value, low, high = check["name"], check["value"], check["min"], check.get("max")
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = None
        if number is not None and number >= low and (high is None or number <= high):
            continue
        bound = f"at least {low}" if high is None else f"between {low} and {high}"
        found.append({"variable": name, "message": f"{name}={value} must be {bound}{check.get('why', '')}"})
    return found


def check_job(name: Any) -> str:
    """launch_job names containers, folders and labels, so it is never empty and stays plain."""
    if not isinstance(name, str) or not JOB_NAME.match(name):
        raise InventoryError(f"launch_job={name!r} must be 1-63 letters, digits, '_', '.' or '-', starting with a "
                             "letter or digit", None, "launch_job")
    return name


# A run id names folders and containers on the nodes and a folder under runs/: one path
# component, never "." or "..", short enough for a container name.
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def check_run_id(run_id: Any) -> str:
    """launch_run_id as given, or InventoryError naming it (the pattern is RUN_ID)."""
    if not isinstance(run_id, str) or not RUN_ID.match(run_id):
        shown = repr(run_id) if len(repr(run_id)) <= 80 else f"{repr(run_id)[:60]}... ({len(str(run_id))} characters)"
        raise InventoryError(f"launch_run_id={shown} must be 1-64 letters, digits, '_', '.' or '-', starting with a "
                             "letter or digit", None, "launch_run_id")
    return run_id


def new_run_id(now: Any = None) -> str:
    """A fresh run id: UTC time plus a random suffix, which sorts by start time."""
    import secrets
    from datetime import datetime, timezone

    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(4)
