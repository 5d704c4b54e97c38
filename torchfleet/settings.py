"""What a node's launch settings ask of its ranks: the site's environment, the allocator
launch_malloc preloads, the devices and paths they need. Pure, and shared by the modes'
builders (torchfleet.modes.context) and the input checks."""

from __future__ import annotations

from typing import Any, Mapping


# The allocators launch_malloc preloads: the library's soname, which the dynamic loader
# finds in the image or on the node (preflight asks it: ldconfig -p), and the settings it
# gets. jemalloc's are torch.backends.xeon.run_cpu's own.
ALLOCATORS: dict[str, dict[str, Any]] = {
    "tcmalloc": {"library": "libtcmalloc.so.4", "package": "libgoogle-perftools4", "env": {}},
    "jemalloc": {"library": "libjemalloc.so.2", "package": "libjemalloc2",
                 "env": {"MALLOC_CONF": "oversize_threshold:1,background_thread:true,metadata_thp:auto,"
                                        "dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"}},
}


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
