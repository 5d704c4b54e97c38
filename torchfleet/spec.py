"""The launch spec: every rank of a job as it will run, computed once, in one place.

The job's launch mode (torchfleet.modes) turns the inventory's settings and the facts read
from the nodes into a :class:`LaunchSpec`, node by node; this module adds what every mode
shares: the input every node's environment must pass, and each unit's guard. The plan shows
the spec, the start tasks only apply its ``units`` (what torchfleet starts on a node), and
the report records it. Everything here is pure: no node, no Ansible.

Secret values never enter a spec. A secret variable appears under its name in ``env`` with
the value a report may show (``<secret>``, or a URL with ``***`` for its credentials), and
in ``secret_env``; the start task adds the real values from the node's private facts.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from torchfleet import modes, netif, redact
from torchfleet.errors import InventoryError
from torchfleet.modes.context import NodeContext
from torchfleet.ranks import RANK_ENV_NAMES
from torchfleet.report import PEER_ERROR_RE
from torchfleet.units import CONTAINER_OUT, LaunchSpec, Mount, RankSpec, Unit  # noqa: F401  (the spec's parts)
from torchfleet import run_vocab
# What the launch sets for every rank besides the rank variables; the user may not set them.
RESERVED_ENV = RANK_ENV_NAMES + ("TORCHFLEET_DATA_DIR", "TORCHFLEET_OUT_DIR", "TORCHFLEET_RUN_ID",
                                 "TORCHFLEET_CPUSETS", "TORCHFLEET_THREADS", "TORCHFLEET_HEARTBEAT",
                                 "TORCHFLEET_CHECKPOINT_DIR", "TORCHFLEET_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")


# The run's settings for its guards (job["guard"]), each from its variable: their defaults
# live in roles/launch/defaults/main.yml only, which also says what each means.
GUARD_VARIABLES = {"port": "launch_guard_port", "node_timeout": "launch_node_timeout",
                   "stall_timeout": "launch_stall_timeout", "timeout": "launch_timeout",
                   "poll_interval": "launch_guard_poll_interval", "stop_grace": "launch_stop_grace",
                   "master_wait_timeout": "launch_master_wait_timeout"}


# The run's restart settings (job["guard"]), each from its variable; absent, a run has one attempt.
RESTART_VARIABLES = {"max_restarts": "launch_max_restarts", "min_nodes": "launch_min_nodes",
                     "restart_backoff": "launch_restart_backoff", "rejoin_timeout": "launch_rejoin_timeout",
                     "checkpoint_shared": "launch_checkpoint_shared"}


# What a stop allows the guards beyond a node timeout and a grace before it kills what is left.
STOP_MARGIN_S = 5.0


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


def _refuse_unsupported(host: str, mode: modes.LaunchMode, job: Mapping[str, Any],
                        settings: Mapping[str, Any]) -> None:
    for variable, used, why in mode.unsupported(job):
        if used(settings):
            raise InventoryError(f"{variable} cannot apply under {mode.chosen_by(job)} ({why}); remove it or use a "
                                 "container launch", host, variable)


def build(job: Mapping[str, Any], table: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> LaunchSpec:
    """The spec of one launch.

    ``job``: run_id, job, mode, transport, image, torchrun_runtime, container_prefix, command
    (an explicit command, else ``workload_argv``: the entry point) and args.
    ``table``: ranks.rank_table's result. ``nodes``: per host, its facts (address,
    interface, nproc, pinning, mpi_network) and ``settings`` (that host's launch_* values,
    the open env ``env_public`` and what may be shown of every variable ``env_shown``).
    """
    mode = modes.get(job["mode"])
    runtime = mode.runtime(job)
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for row in table["ranks"]:
        by_host.setdefault(row["host"], []).append(row)
    ranks: list[RankSpec] = []
    units: list[Unit] = []
    files: dict[str, dict[str, str]] = {}
    for host, rows in by_host.items():
        node = nodes[host]
        settings = node.get("settings") or {}
        _refuse_unsupported(host, mode, job, settings)
        shown = {str(k): str(v) for k, v in (node.get("env_shown") or {}).items()}
        public = {str(k): str(v) for k, v in (node.get("env_public") or {}).items()}
        secret_names = sorted(set(shown) - set(public))
        check_env(host, shown, secret_names)
        mode.check_node(host, settings, table)
        ctx = NodeContext(job, table, host, node, rows, runtime, shown, secret_names)
        mode.build(ctx)
        ranks += ctx.ranks
        units += ctx.units
        if ctx.files:
            files[host] = ctx.files
    # A listen matters only to the units that start after it: one that no unit waits for (a
    # run of one rank, or of one node) has no deadline to meet, and no wait before it.
    waited = {j for after in start_after(units) for j in after}
    for j, unit in enumerate(units):
        if j not in waited:
            unit.listen = None
    guard = _guard(job, table, units, nodes, mode)
    for node_files in (files.setdefault(h, {}) for h in by_host):
        node_files[run_vocab.GUARD_CONFIG] = _json(guard)
    built = LaunchSpec(
        run_id=job["run_id"], job=job["job"], mode=mode.name, transport=job.get("transport", "tcp"),
        image=None if runtime == "process" else job.get("image"),
        master_host=table["master_host"], master_addr=table["master_addr"], master_port=int(table["master_port"]),
        world_size=int(table["world_size"]), num_nodes=int(table["num_nodes"]),
        ranks=sorted(ranks, key=lambda r: r.rank), units=units, guard=guard, files=files,
        run_owner={h: owner for h in by_host if (owner := mode.run_owner(nodes[h].get("settings") or {}))},
        secret_env_file=mode.secret_env_file, unit_kind=mode.unit_kind(job),
    )
    for host, made in mode.spec_files(built.to_dict(), nodes).items():
        built.files.setdefault(host, {}).update(made)
    return built


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
    settings["max_restarts"] = int(float(given.get("max_restarts") or 0))
    settings["min_nodes"] = int(float(given.get("min_nodes") or 0))
    settings["restart_backoff"] = float(given.get("restart_backoff") or 0)
    settings["rejoin_timeout"] = float(given.get("rejoin_timeout") or 0)
    settings["checkpoint_shared"] = str(given.get("checkpoint_shared", False)).lower() in ("true", "1", "yes", "on")
    for name in ("max_restarts", "min_nodes", "restart_backoff", "rejoin_timeout"):
        if settings[name] < 0:
            raise InventoryError(f"{RESTART_VARIABLES[name]}={settings[name]:g} must be at least 0", None,
                                 RESTART_VARIABLES[name])
    return settings


def _guard(job: Mapping[str, Any], table: Mapping[str, Any], units: list[Unit],
           nodes: Mapping[str, Mapping[str, Any]], mode: modes.LaunchMode) -> dict[str, Any]:
    """The guard's config, and every unit's command wrapped in its guard. The master's first
    unit to start hosts the store, on the cluster address, on its own port."""
    settings = guard_settings(job, table["master_port"])
    master = table["master_host"]
    order = restart_nodes(table)
    if settings["min_nodes"] > len(order):
        raise InventoryError(f"launch_min_nodes={settings['min_nodes']} is more than the launch's {len(order)} nodes",
                             None, "launch_min_nodes")
    # Each node's first unit to start hosts the store while its node is the master: the
    # master's at first, the next node's after the master is lost (launch_max_restarts).
    firsts = {n["host"]: min((i for i, u in enumerate(units) if u.host == n["host"]), key=lambda i: (units[i].phase, i))
              for n in order}
    host_unit = firsts[master]
    for i, unit in enumerate(units):
        s = nodes[unit.host].get("settings") or {}
        out = CONTAINER_OUT if unit.kind == "container" else \
            f"{s.get('node_dir', '/var/lib/torchfleet')}/runs/{job['run_id']}"
        python = "python3" if unit.kind == "container" else s.get("python", "python3")
        unit.command = [python, f"{out}/{run_vocab.GUARD_SOURCE}", f"{out}/{run_vocab.GUARD_CONFIG}", str(i), "--",
                        *unit.argv]
    return {
        "run_id": job["run_id"], "job": job["job"], "mode": job.get("mode"), "store_unit": host_unit,
        "store": {"host": str(table["master_addr"]), "port": settings["port"], "node": master},
        "node_timeout": settings["node_timeout"], "stall_timeout": settings["stall_timeout"],
        "job_timeout": settings["timeout"], "poll_interval": settings["poll_interval"],
        "stop_grace": settings["stop_grace"], "start_timeout": settings["start_timeout"],
        "listen_timeout": settings["master_wait_timeout"],
        "stop_wait": settings["stop_wait"], "peer_error": PEER_ERROR_RE.pattern,
        "parent_holds_unit": bool(mode.scheduler and mode.scheduler.parent_holds_unit),
        "units": [{"name": u.name, "host": u.host, "role": u.role, "ranks": u.ranks, "service": u.role == "sshd",
                   "heartbeat": u.env.get("TORCHFLEET_HEARTBEAT"), "log": _log(u), "attempt": u.attempt,
                   "listen": u.listen, "after": after}
                  for u, after in zip(units, start_after(units))],
        "max_restarts": settings["max_restarts"], "min_nodes": settings["min_nodes"] or len(order),
        "restart_backoff": settings["restart_backoff"], "rejoin_timeout": settings["rejoin_timeout"],
        "checkpoint_shared": settings["checkpoint_shared"],
        "nodes": order, "master_port": int(table["master_port"]),
        "store_candidates": [{"node": n["host"], "host": n["address"], "port": settings["port"], "unit": firsts[n["host"]]}
                             for n in order],
    }


def start_after(units: list[Unit]) -> list[list[int]]:
    """For each unit, the units whose listen its guard waits for before it starts the unit:
    every unit of an earlier phase that listens (the master's MASTER_PORT, mpirun's sshd).
    The controller starts every node's units at once; the guards keep the order."""
    return [[j for j, other in enumerate(units) if other.listen and other.phase < unit.phase] for unit in units]


def restart_nodes(table: Mapping[str, Any]) -> list[dict[str, str]]:
    """The launch's nodes in node-rank order, each with its cluster address: the order in which
    a later attempt numbers its nodes and a lost master's successor is chosen."""
    nodes: dict[str, dict[str, Any]] = {}
    for row in sorted(table["ranks"], key=lambda r: (int(r["node_rank"]), int(r["rank"]))):
        nodes.setdefault(str(row["host"]), {"host": str(row["host"]), "address": str(row["address"])})
    return list(nodes.values())


def _log(unit: Unit) -> str | None:
    """Where a container unit's guard copies its output, so that it can be read while the
    unit runs (a process unit's output already goes to its log file)."""
    if unit.kind != "container":
        return None
    return f"{CONTAINER_OUT}/{run_vocab.unit_log(unit.role, unit.ranks[0] if unit.ranks else None)}"


def _json(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"



def node_entry(host: str, table: Mapping[str, Any], mode: str, probe: Mapping[str, Any],
               checked: Mapping[str, Any], pinning: list[Mapping[str, Any]] | None) -> dict[str, Any]:
    """What build needs of one node: its address (its first rank's), the interface it routes
    MASTER_ADDR through, its CPUs and pinning, and what its launch mode reads of the probe
    (LaunchMode.node_facts); with its checked input (node_input). ``probe``: node_probe's reading, with its addresses and
    routing tables."""
    address = next(r["address"] for r in table["ranks"] if r["host"] == host)
    master = str(table["master_addr"])
    return {
        "address": address,
        "interface": netif.gloo_interface(host, master, probe.get("ip_addr"), probe.get("routes")),
        "nproc": int(probe.get("nproc") or 1),
        "pinning": list(pinning or []),
        **modes.get(mode).node_facts(host, table, probe),
        "settings": checked["settings"], "env_public": checked["env_public"], "env_shown": checked["env_shown"],
    }


def unit_index(units: list[Mapping[str, Any]]) -> dict[str, list[int]]:
    """Each host's units, as indexes into ``units`` (the spec's): a start task looks up its
    own, where filtering every node's units would cost each node the cluster's size. Every
    node starts its units at once; a unit of a later phase waits in its guard."""
    index: dict[str, list[int]] = {}
    for i, unit in enumerate(units):
        index.setdefault(str(unit["host"]), []).append(i)
    return index


def listen_hosts(units: list[Mapping[str, Any]]) -> list[str]:
    """The hosts with a unit that listens: the launch waits there until it answers."""
    return sorted({str(u["host"]) for u in units if u.get("listen")})


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
