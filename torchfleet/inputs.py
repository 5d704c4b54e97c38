"""A launch's input: the variables it reads, their types and ranges, each node's checked
settings, and the job name and run id checks. Pure: the launch_input action reads each
node's variables once and hands them here."""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from torchfleet import modes, redact
from torchfleet.errors import InventoryError
from torchfleet.settings import as_bool, site_env


# A node's launch settings in every mode, each from the variable that sets it
# (roles/launch/defaults says what each means); a mode adds its own (LaunchMode.SETTINGS). Read by the launch_input action from the host's variables: one Python
# call, where as many Jinja expressions would each be compiled again for every node.
SETTINGS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "node_dir": ("launch_node_dir", str), "dataset_dir": ("launch_dataset_dir", str),
    "python": ("launch_python", str), "omp_num_threads": ("launch_omp_num_threads", int),
    "extra_volumes": ("launch_extra_volumes", list), "extra_devices": ("launch_extra_devices", list),
    "sgx_devices": ("launch_sgx_devices", list), "sgx_aesm_socket": ("launch_sgx_aesm_socket", as_bool),
    "sgx_aesm_socket_path": ("launch_sgx_aesm_socket_path", str), "sgx_enabled": ("launch_sgx_enabled", as_bool),
    "sgx_log_level": ("launch_sgx_log_level", str), "gloo_tls": ("launch_gloo_tls", as_bool),
    "tls_node_dir": ("launch_tls_node_dir", str), "tls_mount": ("launch_tls_mount", str),
    "oom_kill_disable": ("launch_oom_kill_disable", as_bool), "malloc": ("launch_malloc", str),
    "checkpoint_dir": ("launch_checkpoint_dir", str),
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
    ("launch_max_restarts", 0, 1000, " (0: no restarts)"), ("launch_min_nodes", 0, None, " (0: every node)"),
    ("launch_restart_backoff", 0, 3600, ""), ("launch_rejoin_timeout", 0, 3600, ""),
)


# launch_transport wireguard's numbers, checked only with it.
OVERLAY_RANGES: tuple[tuple[str, float, float | None, str], ...] = (
    ("launch_overlay_probe_port", 1, 65535, ""), ("launch_overlay_probe_timeout", 0.01, None, ""),
    ("launch_overlay_handshake_max_age", 1, None, ""),
)




def input_variables() -> tuple[str, ...]:
    """Every variable node_input reads, each registered mode's own included."""
    own = {v for mode in modes.names() for v, _ in modes.get(mode).SETTINGS.values()}
    return tuple(sorted({v for v, _ in SETTINGS.values()} | own | {r[0] for r in RANGES + OVERLAY_RANGES} | {
        "launch_mode", "launch_torchrun_runtime", "launch_proxy_env", "launch_extra_env", "launch_secret_env",
        "launch_transport", "launch_overlay_interface", "launch_master_port", "launch_checkpoint_shared"}))


def node_input(values: Mapping[str, Any], host: str) -> dict[str, Any]:
    """A node's checked input (``values``: its input_variables(), templated): ``settings``, the
    open environment ``env_public``, what may be shown of every variable ``env_shown``,
    whether it has secrets, and under launch_transport wireguard the overlay's interface,
    whose address rank_plan takes as the node's, and ``bare``: whether its ranks run as
    processes (the mode's runtime), which decides what the check phase reads on the node. The
    secret values stay out: the ranks' start reads them again.
    Out-of-range numbers and bad secret names raise, every failure in one message."""
    mode = modes.get(values.get("launch_mode"))
    job = {"torchrun_runtime": values.get("launch_torchrun_runtime") or "container"}
    overlay = values.get("launch_transport") == "wireguard"
    bad = out_of_range([{"name": n, "value": values.get(n), "min": low, "max": high, "why": why}
                        for n, low, high, why in RANGES + (OVERLAY_RANGES if overlay else ())])
    if overlay and not bad and int(values["launch_overlay_probe_port"]) == int(values.get("launch_master_port") or 0):
        bad.append({"variable": "launch_overlay_probe_port", "message": f"launch_overlay_probe_port="
                    f"{values['launch_overlay_probe_port']} must differ from launch_master_port"})
    settings = {}
    if not bad:
        settings = {key: convert(values[variable]) if values.get(variable) is not None else convert()
                    for key, (variable, convert) in {**SETTINGS, **mode.SETTINGS}.items()}
        if settings["checkpoint_dir"] and not settings["checkpoint_dir"].startswith("/"):
            bad.append({"variable": "launch_checkpoint_dir", "message": f"launch_checkpoint_dir="
                        f"{settings['checkpoint_dir']!r} must be an absolute path on the node"})
        if as_bool(values.get("launch_checkpoint_shared") or False) and not settings["checkpoint_dir"]:
            bad.append({"variable": "launch_checkpoint_shared", "message": "launch_checkpoint_shared=true says every "
                        "node sees the same launch_checkpoint_dir, but launch_checkpoint_dir is empty"})
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
            "bare": mode.runtime(job) == "process",
            # What the launch role's start_units action starts (LaunchMode.unit_kind).
            "unit_kind": mode.unit_kind(job),
            # What the check phase reads on the node for the mode, beyond every mode's.
            "mode_probe": mode.probe(settings),
            "overlay_interface": str(values.get("launch_overlay_interface") or "") if overlay else ""}


def split_site_env(settings: Mapping[str, Any], secret: Mapping[str, Any] | None, host: str) -> dict[str, dict[str, str]]:
    """A node's environment split into its open part, its secret part and what may be
    shown of every variable; secret names a shell cannot take are refused."""
    env = site_env(settings)
    redact.check_env(env, secret, host)
    return redact.split_env(env, secret)


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


def check_min_nodes(min_nodes: Any, num_nodes: int) -> int:
    """launch_min_nodes as a count of nodes (0: every node of the launch), or InventoryError
    naming it when the launch has fewer nodes. Resolving a count again gives it back."""
    try:
        wanted = int(min_nodes or 0)
    except (TypeError, ValueError):
        wanted = -1
    if not 0 <= wanted <= int(num_nodes):
        raise InventoryError(f"launch_min_nodes={min_nodes} must be between 0 (every node) and the launch's "
                             f"{num_nodes} nodes", None, "launch_min_nodes")
    return wanted or int(num_nodes)


# The per-run checkpoint folder's name in the node's run folder.
RUN_CHECKPOINTS = "checkpoints"


def checkpoint_dir(settings: Mapping[str, Any], run_id: str, max_restarts: Any) -> str:
    """The node's checkpoint folder (TORCHFLEET_CHECKPOINT_DIR): launch_checkpoint_dir, else with
    restarts on one of the run's own under launch_node_dir, so that every attempt after the
    first has one to resume from; else none ("")."""
    if settings.get("checkpoint_dir") or not int(float(max_restarts or 0)):
        return str(settings.get("checkpoint_dir") or "")
    return f"{settings['node_dir']}/runs/{run_id}/{RUN_CHECKPOINTS}"


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
