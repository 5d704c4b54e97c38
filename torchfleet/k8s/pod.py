"""One node's pod, the same on every node, from the plan and the k8s_* variables: image,
command, environment, resources, volumes, labels and placement. What the plan holds that a
pod cannot mean is refused, naming its variable; every refusal is gathered into one error."""

from __future__ import annotations

import math
import re
from typing import Any, Mapping

from torchfleet import modes
from torchfleet.errors import InventoryError
from torchfleet.k8s import kubelet
from torchfleet.k8s.admission import DNS1123_SUBDOMAIN, label_problems
from torchfleet.k8s.schema import DNS1035_LABEL
from torchfleet.ranks import PROCS_VAR, RANK_ENV_NAMES
from torchfleet.units import CONTAINER_CHECKPOINTS

# Set by the operator for torchrun (PET_*), by torchrun for each rank, or naming the docker
# host (its interface), torchfleet's own pinning and guard, or an attempt's number (a pod's
# restarts are the operator's): a pod has its own, or none.
NOT_PASSED = (set(RANK_ENV_NAMES) - {"OMP_NUM_THREADS"}) | {
    "TORCHFLEET_HEARTBEAT", "TORCHFLEET_CPUSETS", "TORCHFLEET_THREADS", "TORCHFLEET_RESTART_COUNT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHFLEET_CHECKPOINT_DIR"}
DIGEST = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
# The run's folders as volumes: mount target -> (volume name, the variable naming its claim, what it holds).
FOLDERS = {"/data": ("data", "k8s_data_claim", "the dataset"),
           "/workload": ("workload", "k8s_workload_claim", "the workload's files (launch_workload)"),
           "/out": ("out", "k8s_output_claim", "each run's output, in a folder named by its run id"),
           CONTAINER_CHECKPOINTS: ("checkpoints", "k8s_checkpoint_claim", "the checkpoints a restart resumes from")}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The torch plugin of Trainer v2 gives torchrun this MASTER_PORT (constants.ContainerTrainerPort).
TRAINJOB_MASTER_PORT = 29500


def build(fmt: str, plan: Mapping[str, Any], k8s: Mapping[str, Any], kube: kubelet.Node | None) -> dict[str, Any]:
    """Every node's pod, as the two kinds' builders take it."""
    refused: list[tuple[str, str]] = []
    ranks = list(plan.get("ranks") or [])
    first = ranks[0] if ranks else {}
    refused += refuse_options(fmt, plan, ranks, list(plan.get("units") or []))
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for r in ranks:
        by_host.setdefault(r["host"], []).append(r)
    procs = {h: len(rs) for h, rs in by_host.items()}
    if len(set(procs.values())) > 1:
        refused.append((PROCS_VAR, f"{PROCS_VAR} differs between nodes ({_per_host(procs)}); a pod template is the "
                                   "same on every node, so give every node the same number of ranks"))
    threads = {h: sorted({int(r["threads"]) for r in rs}) for h, rs in by_host.items()}
    if len({t for ts in threads.values() for t in ts}) > 1:
        refused.append(("launch_omp_num_threads", "OMP_NUM_THREADS differs between ranks ("
                        + _per_host({h: "/".join(map(str, t)) for h, t in threads.items()})
                        + "); set launch_omp_num_threads, or give every node the same CPUs"))
    env, env_refused = environment(fmt, ranks, k8s)
    refused += env_refused
    image, image_refused = _image(plan, k8s)
    refused += image_refused
    mounts, volumes, mount_refused = _volumes(first, k8s)
    refused += mount_refused
    name = k8s["k8s_name"] or re.sub(r"[^a-z0-9-]", "-", str(plan.get("job", "")).lower()).strip("-")
    if len(name) > 63 or not DNS1035_LABEL.match(name):
        refused.append(("k8s_name", f"the manifest's name {name!r} (k8s_name, else launch_job) must be a DNS label: "
                                    "at most 63 lower-case letters, digits and '-', starting with a letter"))
    refused += _names(k8s)
    labels = {"torchfleet.job": str(plan.get("job", "")), "torchfleet.run": str(plan.get("run_id", "")),
              **{str(k): v for k, v in k8s["k8s_labels"].items()}}
    for key, value in labels.items():
        variable = {"torchfleet.job": "launch_job", "torchfleet.run": "launch_run_id"}.get(key, "k8s_labels")
        refused += [(variable, f"label {why}") for why in label_problems(key, value)]
    pinned = any(r.get("cpuset") for r in ranks)
    resources, resource_refused = _resources(pinned, by_host, k8s, kube)
    refused += resource_refused
    if refused:
        raise InventoryError("; ".join(m for _, m in refused), None, refused[0][0])
    guard = plan.get("guard") or {}
    return {
        "name": name, "image": image, "env": env, "resources": resources, "mounts": mounts, "volumes": volumes,
        "argv": [str(a) for a in first.get("argv") or []], "workdir": str(first.get("workdir") or "/workload"),
        "python": _python(list(plan.get("units") or [])), "num_nodes": int(plan["num_nodes"]),
        "procs_per_node": next(iter(procs.values()), 1), "pinned": pinned,
        "deadline": math.ceil(float(guard.get("job_timeout") or 0)) or None,
        "grace": math.ceil(float(guard.get("stop_grace") or 0)),
        "max_restarts": int(guard.get("max_restarts") or 0),
        "labels": labels, "queue": k8s["k8s_queue_name"], "placement": _placement(k8s),
    }


def _per_host(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{h} {v}" for h, v in sorted(values.items()))


def refuse_options(fmt: str, plan: Mapping[str, Any], ranks: list[Mapping[str, Any]],
                   units: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The plan's options that no pod can mean, each with its variable."""
    refused = []
    # A spec runs its units as processes exactly where its mode's runtime is the node's Python.
    job = {"torchrun_runtime": "process" if any(u.get("kind") == "process" for u in units) else "container"}
    mode = modes.get(plan.get("mode"))
    refusal = mode.pod_refusal(job)
    if refusal:
        refused.append(refusal)
    guard = plan.get("guard") or {}
    if fmt == "trainjob" and int(guard.get("max_restarts") or 0):
        refused.append(("launch_max_restarts", "launch_max_restarts: a TrainJob (Trainer v2.3.0) cannot set retries: "
                                               "its runtime's JobSet failurePolicy decides them; render a pytorchjob, "
                                               "which maps it to restartPolicy and runPolicy.backoffLimit, or set "
                                               "launch_max_restarts: 0"))
    if fmt == "trainjob" and int(plan.get("master_port") or 0) != TRAINJOB_MASTER_PORT:
        refused.append(("launch_master_port", f"launch_master_port={plan.get('master_port')}, but the TrainJob's "
                                              f"torch plugin gives torchrun port {TRAINJOB_MASTER_PORT}; set "
                                              f"launch_master_port: {TRAINJOB_MASTER_PORT} or render a pytorchjob"))
    if plan.get("transport") == "wireguard":
        refused.append(("launch_transport", "launch_transport=wireguard carries Gloo over torchfleet's WireGuard "
                                            "overlay between the hosts; a pod uses the cluster's network (its CNI), "
                                            "so render launch_transport: tcp"))
    devices = sorted({str(d) for r in ranks for d in r.get("devices") or []})
    sgx = [d for d in devices if "sgx" in d.split(":")[0]]
    if sgx:
        refused.append(("launch_sgx_devices", f"launch_sgx_devices {', '.join(sgx)}: a pod gets devices only from a "
                                              "device plugin's resource, which the manifest cannot name; remove them"))
    if set(devices) - set(sgx):
        refused.append(("launch_extra_devices", f"launch_extra_devices {', '.join(sorted(set(devices) - set(sgx)))}: "
                                                "a pod gets devices only from a device plugin's resource; remove them"))
    env = (ranks[0].get("env") or {}) if ranks else {}
    if "SGX_ENABLED" in env:
        refused.append(("launch_sgx_enabled", "launch_sgx_enabled needs SGX devices and the aesm socket on the node, "
                                              "which a pod cannot name; remove it"))
    if env.get("GLOO_DEVICE_TRANSPORT") == "TCP_TLS":
        refused.append(("launch_gloo_tls", "launch_gloo_tls reads each node's key and certificate from the host's "
                                           "tls_pki folder, which no pod has; remove it (use the cluster network's "
                                           "own encryption)"))
    if any(u.get("oom_kill_disable") for u in units):
        refused.append(("launch_oom_kill_disable", "launch_oom_kill_disable is a docker run option with no pod "
                                                   "field; remove it"))
    stall = float(guard.get("stall_timeout") or 0)
    if stall > 0:
        refused.append(("launch_stall_timeout", f"launch_stall_timeout={stall:g} is watched by torchfleet's guards, "
                                                "which do not run in Kubernetes; remove it"))
    return refused


def environment(fmt: str, ranks: list[Mapping[str, Any]], k8s: Mapping[str, Any]) -> tuple[list[dict[str, Any]],
                                                                                        list[tuple[str, str]]]:
    """The pod's environment: the plan's, less what the operator, torchrun or the pod set,
    with every secret as a reference to a key of the Secret k8s_secret_name (never a value)."""
    refused: list[tuple[str, str]] = []
    if not ranks:
        return [], refused
    secret = sorted({str(n) for r in ranks for n in r.get("secret_env") or []})

    def passed(r: Mapping[str, Any]) -> dict[str, str]:
        return {str(k): str(v) for k, v in (r.get("env") or {}).items() if k not in NOT_PASSED}

    env = passed(ranks[0])
    differ = sorted({k for r in ranks for k, v in passed(r).items() if k != "OMP_NUM_THREADS" and env.get(k) != v}
                    | {k for r in ranks for k in env if k not in passed(r)})
    if differ:
        refused.append(("launch_extra_env", f"{', '.join(differ)} differ between nodes; a pod template is the same on "
                                            "every node, so set them alike for every node (launch_extra_env, "
                                            "launch_secret_env, launch_proxy_env)"))
    operator = sorted(k for k in env if k.startswith("PET_"))
    if operator:
        refused.append(("launch_extra_env", f"launch_extra_env sets {', '.join(operator)}, but the operator sets PET_* "
                                            "for torchrun; remove them"))
    if fmt == "pytorchjob" and env.get("PYTHONUNBUFFERED", "1") != "1":
        refused.append(("launch_extra_env", "launch_extra_env sets PYTHONUNBUFFERED, but the PyTorchJob operator sets "
                                            "PYTHONUNBUFFERED=1 after the manifest's own and overrides it; remove it"))
    if fmt == "pytorchjob":
        env.pop("PYTHONUNBUFFERED", None)
    if secret and not k8s["k8s_secret_name"]:
        refused.append(("k8s_secret_name", f"the job has secret variables ({', '.join(secret)}); set "
                                           "k8s_secret_name to the Secret that holds a key of each name"))
    if k8s["k8s_checkpoint_claim"]:
        env["TORCHFLEET_CHECKPOINT_DIR"] = CONTAINER_CHECKPOINTS
    entries = []
    for name, value in env.items():
        if name in secret:
            entries.append({"name": name, "valueFrom": {"secretKeyRef": {"name": k8s["k8s_secret_name"], "key": name}}})
        else:
            entries.append({"name": name, "value": value})
    return entries, refused


def _image(plan: Mapping[str, Any], k8s: Mapping[str, Any]) -> tuple[str, list[tuple[str, str]]]:
    """The image by digest: k8s_image, else the plan's (launch_image, from torchfleet_image).
    The plan knows only the reference the nodes were given, and an image ID is not a
    registry digest, so a tag is refused rather than guessed."""
    image = k8s["k8s_image"] or str(plan.get("image") or "")
    if DIGEST.match(image):
        return image, []
    variable = "k8s_image" if k8s["k8s_image"] else "torchfleet_image"
    return image, [(variable, f"{variable} {image or '(none)'} is not pinned by digest; a manifest names its image "
                              "as repository@sha256:<digest> so that every pod runs the same one: set "
                              "torchfleet_image to it (or k8s_image, for the manifest alone); `docker inspect "
                              "--format '{{index .RepoDigests 0}}' IMAGE` on a host that pulled it prints it")]


def _volumes(rank: Mapping[str, Any], k8s: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                       list[tuple[str, str]]]:
    """The run's folders (data, workload, output, checkpoints) as the claims the user names;
    any other mount of the plan is a host path of the docker hosts, and refused."""
    refused, mounts, volumes = [], [], []
    env = rank.get("env") or {}
    tls = str(env.get("GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_FILE") or "").rsplit("/", 1)[0]
    targets = [(str(m["target"]), m) for m in rank.get("mounts") or []]
    if k8s["k8s_checkpoint_claim"] and CONTAINER_CHECKPOINTS not in dict(targets):
        targets.append((CONTAINER_CHECKPOINTS, {"target": CONTAINER_CHECKPOINTS, "read_only": False}))
    for target, m in targets:
        if target in FOLDERS:
            volume, variable, holds = FOLDERS[target]
            if not k8s[variable]:
                why = "launch_checkpoint_dir or launch_max_restarts gives the ranks a checkpoint folder" \
                    if target == CONTAINER_CHECKPOINTS else f"the run's {target} folder needs a volume"
                refused.append((variable, f"{why}: set {variable} to the PersistentVolumeClaim that holds {holds}"))
                continue
            mount = {"name": volume, "mountPath": target, "readOnly": bool(m.get("read_only"))}
            # Each run writes into a folder of its own, as on the nodes (runs/RUN_ID).
            if target == "/out":
                mount["subPath"] = str(env.get("TORCHFLEET_RUN_ID") or "")
            mounts.append(mount)
            volumes.append({"name": volume, "persistentVolumeClaim": {"claimName": k8s[variable],
                                                                      "readOnly": bool(m.get("read_only"))}})
        elif tls and target == tls:
            continue  # launch_gloo_tls, refused with its variable
        elif "aesm" in target:
            refused.append(("launch_sgx_aesm_socket", f"launch_sgx_aesm_socket mounts the host's {target}, which no "
                                                      "pod has; remove it"))
        else:
            refused.append(("launch_extra_volumes", f"launch_extra_volumes mounts the host path {m['source']} at "
                                                    f"{target}; a pod's volumes are the cluster's, so remove it"))
    return mounts, volumes, refused


def _names(k8s: Mapping[str, Any]) -> list[tuple[str, str]]:
    refused = []
    for variable in ("k8s_namespace", "k8s_secret_name", "k8s_data_claim", "k8s_workload_claim", "k8s_output_claim",
                     "k8s_checkpoint_claim", "k8s_queue_name"):
        value = k8s[variable]
        # A namespace is a DNS label; the others may hold dots too.
        longest = 63 if variable in ("k8s_namespace", "k8s_queue_name") else 253
        if value and (len(value) > longest or not DNS1123_SUBDOMAIN.match(value)
                      or (variable == "k8s_namespace" and "." in value)):
            refused.append((variable, f"{variable}={value!r} is not a Kubernetes object name (lower-case letters, "
                                      "digits, '-' and '.')"))
    for i, secret in enumerate(k8s["k8s_image_pull_secrets"]):
        if not isinstance(secret, str) or not DNS1123_SUBDOMAIN.match(secret):
            refused.append(("k8s_image_pull_secrets", f"k8s_image_pull_secrets[{i}]={secret!r} is not a Secret's name"))
    return refused


def _resources(pinned: bool, by_host: Mapping[str, list[Mapping[str, Any]]], k8s: Mapping[str, Any],
               kube: kubelet.Node | None) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Pinned: whole cores of the Kubernetes node, requests equal to limits, memory too
    (Guaranteed, so that the static CPU manager pins them). Unpinned: no CPUs, and the
    memory k8s_memory asks."""
    memory = k8s["k8s_memory"]
    if not pinned:
        return ({"requests": {"memory": memory}, "limits": {"memory": memory}} if memory else {}), []
    refused = []
    if not memory:
        refused.append(("k8s_memory", "ranks are pinned, so each pod asks for whole CPUs with requests equal to "
                                      "limits (Guaranteed QoS, which the kubelet's static CPU manager pins); "
                                      "Guaranteed needs memory requests equal to limits too: set k8s_memory "
                                      "(the memory of one node's pod, such as 16Gi)"))
    if kube is None:
        return {}, refused + [("k8s_node_lscpu", NO_NODE)]
    asked = {h: kubelet.request(kube, [str(r.get("cpuset") or "") for r in rs]) for h, rs in by_host.items()}
    if len(set(asked.values())) > 1:
        refused.append(("cpu_pinning_cores_per_rank", f"the pinned CPUs differ between nodes ({_per_host(asked)}); "
                                                      "a pod's CPU request is the same on every node, so set "
                                                      "cpu_pinning_cores_per_rank"))
    whole = {"cpu": str(next(iter(asked.values()))), "memory": memory}
    return {"requests": dict(whole), "limits": dict(whole)}, refused


NO_NODE = ("ranks are pinned, and a pod's whole cores are the Kubernetes node's, not the inventory's: set "
           "k8s_node_lscpu to a file holding `lscpu -p` of a Kubernetes node, or k8s_node_cpus (with "
           "k8s_node_sockets, k8s_node_threads_per_core and k8s_node_numa_nodes); or set cpu_pinning: false")


def _placement(k8s: Mapping[str, Any]) -> dict[str, Any]:
    """The pod spec's nodeSelector, tolerations and imagePullSecrets, where the variables set them."""
    placement: dict[str, Any] = {}
    if k8s["k8s_node_selector"]:
        placement["nodeSelector"] = {str(k): str(v) for k, v in k8s["k8s_node_selector"].items()}
    if k8s["k8s_tolerations"]:
        placement["tolerations"] = [dict(t) for t in k8s["k8s_tolerations"]]
    if k8s["k8s_image_pull_secrets"]:
        placement["imagePullSecrets"] = [{"name": str(s)} for s in k8s["k8s_image_pull_secrets"]]
    return placement


def _python(units: list[Mapping[str, Any]]) -> str:
    """The Python that runs torchrun in the image: the torchrun unit's, else the ranks'."""
    for unit in units:
        if unit.get("role") == "torchrun" and unit.get("argv"):
            return str(unit["argv"][0])
    return "python3"


def policy_warnings(kube: kubelet.Node | None) -> list[str]:
    if kube is not None and kube.policy != "static":
        return [f"k8s_cpu_manager_policy={kube.policy}: the kubelet pins nothing; the pods' CPU requests are CFS "
                "quota only"]
    return []
