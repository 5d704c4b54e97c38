"""The launch spec as a Kubernetes manifest: a Kubeflow Trainer v2 TrainJob (torch-distributed
runtime) or a v1 Training Operator PyTorchJob.

Pure: ``render(fmt, plan, variables)`` takes the plan (``Plan.to_dict()``, the redacted
launch spec) and the ``k8s_*`` variables, and returns the manifest as a dict, checked
against the shipped CRD (``schema.check``). Every node runs one pod in which torchrun
starts its ranks; the operator gives torchrun the node count, the node's rank and the
master's address (PET_* variables). What the plan holds that a pod cannot mean is refused,
naming its variable; nothing is dropped without a word. docs/kubernetes.md says what maps
to what.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any, Mapping

import yaml

from torchfleet import cpus
from torchfleet.errors import InventoryError
from torchfleet.k8s.schema import DNS1035_LABEL, SchemaError, check
from torchfleet.ranks import PROCS_VAR, RANK_ENV_NAMES
from torchfleet.units import CONTAINER_CHECKPOINTS

__all__ = ["FORMATS", "VARIABLES", "SchemaError", "check", "render", "to_yaml", "variables"]

FORMATS = ("trainjob", "pytorchjob")
# The variables rendering reads (docs/kubernetes.md says what each means), with defaults.
VARIABLES: dict[str, str] = {
    "k8s_name": "",
    "k8s_namespace": "",
    "k8s_image": "",
    "k8s_secret_name": "",
    "k8s_data_claim": "",
    "k8s_workload_claim": "",
    "k8s_output_claim": "",
    "k8s_memory": "",
    "k8s_runtime": "torch-distributed",
}
# The torch plugin of Trainer v2 gives torchrun this MASTER_PORT (constants.ContainerTrainerPort).
TRAINJOB_MASTER_PORT = 29500
# Set by the operator for torchrun (PET_*), by torchrun for each rank, or naming the docker
# host (its interface) or torchfleet's own pinning and guard: a pod has its own.
_NOT_PASSED = set(RANK_ENV_NAMES) - {"OMP_NUM_THREADS"} | {"TORCHFLEET_HEARTBEAT", "TORCHFLEET_CPUSETS",
                                                            "TORCHFLEET_THREADS"}
DIGEST = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The run's folders as volumes: mount target -> (volume name, the variable naming its claim).
FOLDERS = {"/data": ("data", "k8s_data_claim"), "/workload": ("workload", "k8s_workload_claim"),
           "/out": ("out", "k8s_output_claim")}


def variables(values: Mapping[str, Any]) -> dict[str, str]:
    """The k8s_* variables from ``values`` (other names are left alone), over their
    defaults; an unknown k8s_* name is refused, naming the one probably meant."""
    unknown = sorted(k for k in values if str(k).startswith("k8s_") and k not in VARIABLES)
    if unknown:
        close = difflib.get_close_matches(unknown[0], VARIABLES, 1)
        raise InventoryError(f"{unknown[0]} is not a torchfleet Kubernetes variable"
                             + (f"; did you mean {close[0]}?" if close else f" (known: {', '.join(VARIABLES)})"),
                             None, unknown[0])
    return {k: str(values.get(k) if values.get(k) is not None else d) for k, d in VARIABLES.items()}


def render(fmt: str, plan: Mapping[str, Any], values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of ``plan`` in ``fmt`` (trainjob or pytorchjob), checked against the
    shipped CRD. Raises InventoryError naming the variable for anything a pod cannot
    mean, and SchemaError naming the field for a manifest its CRD refuses."""
    if fmt not in FORMATS:
        raise InventoryError(f"format {fmt!r} is not one of {', '.join(FORMATS)}", None, "format")
    k8s = variables(values or {})
    node = _node(fmt, plan, k8s)
    manifest = (_trainjob if fmt == "trainjob" else _pytorchjob)(plan, k8s, node)
    check(manifest)
    return manifest


class _Dumper(yaml.SafeDumper):
    # Written out in full where a part repeats: kubectl reads anchors, but people read the file.
    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(manifest: Mapping[str, Any]) -> str:
    return yaml.dump(dict(manifest), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)


# --- what every node's pod gets ----------------------------------------------------------------


def _node(fmt: str, plan: Mapping[str, Any], k8s: Mapping[str, str]) -> dict[str, Any]:
    """One node's pod, the same on every node: image, command, environment, resources,
    volumes. Every refusal is gathered into one error, naming the first variable."""
    refused: list[tuple[str, str]] = []
    ranks = list(plan.get("ranks") or [])
    units = list(plan.get("units") or [])
    refused += _refuse_options(plan, ranks, units)
    by_host: dict[str, list[Mapping[str, Any]]] = {}
    for r in ranks:
        by_host.setdefault(r["host"], []).append(r)
    procs = {h: len(rs) for h, rs in by_host.items()}
    if len(set(procs.values())) > 1:
        refused.append((PROCS_VAR, f"{PROCS_VAR} differs between nodes ({_per_host(procs)}); a pod template is "
                                   "the same on every node, so give every node the same number of ranks"))
    threads = {h: sorted({int(r["threads"]) for r in rs}) for h, rs in by_host.items()}
    if len({t for ts in threads.values() for t in ts}) > 1:
        refused.append(("launch_omp_num_threads", "OMP_NUM_THREADS differs between ranks ("
                        + _per_host({h: "/".join(map(str, t)) for h, t in threads.items()})
                        + "); set launch_omp_num_threads, or give every node the same CPUs"))
    pinned = any(r.get("cpuset") for r in ranks)
    node_cpus = {h: sum(len(cpus.parse_cpulist(r.get("cpuset") or "")) for r in rs) for h, rs in by_host.items()}
    if pinned and len(set(node_cpus.values())) > 1:
        refused.append(("cpu_pinning_cores_per_rank", f"the pinned CPUs differ between nodes ({_per_host(node_cpus)}); "
                                                      "a pod's CPU request is the same on every node, so set "
                                                      "cpu_pinning_cores_per_rank"))
    if pinned and not k8s["k8s_memory"]:
        refused.append(("k8s_memory", "ranks are pinned, so each pod asks for whole CPUs with requests equal to "
                                      "limits (Guaranteed QoS, which the kubelet's static CPU manager pins); "
                                      "Guaranteed needs memory requests equal to limits too: set k8s_memory "
                                      "(the memory of one node's pod, such as 16Gi)"))
    first = ranks[0] if ranks else {}
    env, env_refused = _env(fmt, ranks, k8s)
    refused += env_refused
    image, image_refused = _image(plan, k8s)
    refused += image_refused
    mounts, volumes, mount_refused = _volumes(first, k8s)
    refused += mount_refused
    if fmt == "trainjob" and int(plan.get("master_port") or 0) != TRAINJOB_MASTER_PORT:
        refused.append(("launch_master_port", f"launch_master_port={plan.get('master_port')}, but the TrainJob's "
                                              f"torch plugin gives torchrun port {TRAINJOB_MASTER_PORT}; set "
                                              f"launch_master_port: {TRAINJOB_MASTER_PORT} or render a pytorchjob"))
    name = k8s["k8s_name"] or re.sub(r"[^a-z0-9-]", "-", str(plan.get("job", "")).lower()).strip("-")
    if len(name) > 63 or not DNS1035_LABEL.match(name):
        refused.append(("k8s_name", f"the manifest's name {name!r} (k8s_name, else launch_job) must be a DNS label: "
                                    "at most 63 lower-case letters, digits and '-', starting with a letter"))
    for variable in ("k8s_namespace", "k8s_secret_name", "k8s_data_claim", "k8s_workload_claim", "k8s_output_claim"):
        value = k8s[variable]
        # A namespace is a DNS label; the others may hold dots too.
        longest = 63 if variable == "k8s_namespace" else 253
        if value and (len(value) > longest or not DNS1123_SUBDOMAIN.match(value)
                      or (variable == "k8s_namespace" and "." in value)):
            refused.append((variable, f"{variable}={value!r} is not a Kubernetes object name (lower-case letters, "
                                      "digits, '-' and '.')"))
    if refused:
        raise InventoryError("; ".join(m for _, m in refused), None, refused[0][0])
    procs_per_node = next(iter(procs.values()))
    resources: dict[str, Any] = {}
    if pinned:
        whole = {"cpu": str(next(iter(node_cpus.values()))), "memory": k8s["k8s_memory"]}
        resources = {"requests": dict(whole), "limits": dict(whole)}
    elif k8s["k8s_memory"]:
        resources = {"requests": {"memory": k8s["k8s_memory"]}, "limits": {"memory": k8s["k8s_memory"]}}
    guard = plan.get("guard") or {}
    return {
        "name": name, "image": image, "env": env, "resources": resources, "mounts": mounts, "volumes": volumes,
        "argv": [str(a) for a in first.get("argv") or []], "workdir": str(first.get("workdir") or "/workload"),
        "python": _python(units), "num_nodes": int(plan["num_nodes"]), "procs_per_node": procs_per_node,
        "deadline": math.ceil(float(guard.get("job_timeout") or 0)) or None,
        "grace": math.ceil(float(guard.get("stop_grace") or 0)),
        "annotations": {"torchfleet.job": str(plan.get("job", "")), "torchfleet.run": str(plan.get("run_id", ""))},
    }


def _per_host(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{h} {v}" for h, v in sorted(values.items()))


def _refuse_options(plan: Mapping[str, Any], ranks: list[Mapping[str, Any]],
                    units: list[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The plan's options that no pod can mean, each with its variable."""
    refused = []
    mode = plan.get("mode")
    if mode == "mpirun":
        refused.append(("launch_mode", "launch_mode=mpirun starts ranks over torchfleet's SSH mesh (ssh_mesh: sshd "
                                       "in every node's container); in Kubernetes torchrun starts them, so render "
                                       "launch_mode container or torchrun"))
    if any(u.get("kind") == "process" for u in units):
        variable = "launch_torchrun_runtime" if mode == "torchrun" else "launch_mode"
        refused.append((variable, f"{variable}=process runs ranks in the node's own Python (launch_python), which "
                                  "a pod does not have; render a container launch"))
    if int((plan.get("guard") or {}).get("max_restarts") or 0):
        refused.append(("launch_max_restarts", "launch_max_restarts restarts a run through torchfleet's guards on "
                                               "the hosts; in Kubernetes the training operator restarts the pods "
                                               "(restartPolicy, runPolicy.backoffLimit), so render launch_max_restarts: 0"))
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
    stall = float((plan.get("guard") or {}).get("stall_timeout") or 0)
    if stall > 0:
        refused.append(("launch_stall_timeout", f"launch_stall_timeout={stall:g} is watched by torchfleet's guards, "
                                                "which do not run in Kubernetes; remove it"))
    return refused


def _env(fmt: str, ranks: list[Mapping[str, Any]], k8s: Mapping[str, str]) -> tuple[list[dict[str, Any]],
                                                                                    list[tuple[str, str]]]:
    """The pod's environment: the plan's, less what the operator, torchrun or the pod set,
    with every secret as a reference to a key of the Secret k8s_secret_name (never a value)."""
    refused: list[tuple[str, str]] = []
    if not ranks:
        return [], refused
    secret = sorted({str(n) for r in ranks for n in r.get("secret_env") or []})

    def passed(r: Mapping[str, Any]) -> dict[str, str]:
        return {str(k): str(v) for k, v in (r.get("env") or {}).items() if k not in _NOT_PASSED}

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
    entries = []
    for name, value in env.items():
        if name in secret:
            entries.append({"name": name, "valueFrom": {"secretKeyRef": {"name": k8s["k8s_secret_name"], "key": name}}})
        else:
            entries.append({"name": name, "value": value})
    return entries, refused


def _image(plan: Mapping[str, Any], k8s: Mapping[str, str]) -> tuple[str, list[tuple[str, str]]]:
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


def _volumes(rank: Mapping[str, Any], k8s: Mapping[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                         list[tuple[str, str]]]:
    """The run's folders (data, workload, output) as the claims the user names; any other
    mount of the plan is a host path of the docker hosts, and refused."""
    refused, mounts, volumes = [], [], []
    env = rank.get("env") or {}
    tls = str(env.get("GLOO_DEVICE_TRANSPORT_TCP_TLS_CA_FILE") or "").rsplit("/", 1)[0]
    for m in rank.get("mounts") or []:
        target = str(m["target"])
        if target in FOLDERS:
            volume, variable = FOLDERS[target]
            if not k8s[variable]:
                refused.append((variable, f"the run's {target} folder needs a volume: set {variable} to the "
                                          "PersistentVolumeClaim that holds it"))
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
        elif target == CONTAINER_CHECKPOINTS:
            refused.append(("launch_checkpoint_dir", f"launch_checkpoint_dir mounts the host path {m['source']} at "
                                                     f"{target}; a pod's volumes are the cluster's, so remove it"))
        elif "aesm" in target:
            refused.append(("launch_sgx_aesm_socket", f"launch_sgx_aesm_socket mounts the host's {target}, which no "
                                                      "pod has; remove it"))
        else:
            refused.append(("launch_extra_volumes", f"launch_extra_volumes mounts the host path {m['source']} at "
                                                    f"{target}; a pod's volumes are the cluster's, so remove it"))
    return mounts, volumes, refused


def _python(units: list[Mapping[str, Any]]) -> str:
    """The Python that runs torchrun in the image: the torchrun unit's, else the ranks'."""
    for unit in units:
        if unit.get("role") == "torchrun" and unit.get("argv"):
            return str(unit["argv"][0])
    return "python3"


def _torchrun(node: Mapping[str, Any]) -> list[str]:
    """torchrun's arguments: the plan's rank command, as torchrun runs it. The node count,
    its rank and the master come from the operator (PET_*); the processes per node too."""
    return ["--no-python", *node["argv"]]


# --- the two kinds -----------------------------------------------------------------------------


def _metadata(node: Mapping[str, Any], k8s: Mapping[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": node["name"]}
    if k8s["k8s_namespace"]:
        meta["namespace"] = k8s["k8s_namespace"]
    meta["annotations"] = dict(node["annotations"])
    return meta


def _trainjob(plan: Mapping[str, Any], k8s: Mapping[str, str], node: Mapping[str, Any]) -> dict[str, Any]:
    """A TrainJob on the torch-distributed ClusterTrainingRuntime. The trainer has no working
    directory, so the command enters the workload's folder first; the volumes go in through
    runtimePatches (the runtime's node job, its container "node")."""
    trainer: dict[str, Any] = {
        "image": node["image"],
        "command": ["/bin/sh", "-c", 'cd "$0" && exec "$@"', node["workdir"]],
        "args": [node["python"], "-m", "torch.distributed.run", *_torchrun(node)],
        "numNodes": node["num_nodes"],
        "numProcPerNode": node["procs_per_node"],
        "env": node["env"],
    }
    if node["resources"]:
        trainer["resourcesPerNode"] = node["resources"]
    pod = {"terminationGracePeriodSeconds": node["grace"],
           "containers": [{"name": "node", "volumeMounts": node["mounts"]}], "volumes": node["volumes"]}
    spec: dict[str, Any] = {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                       "name": k8s["k8s_runtime"]},
        "trainer": trainer,
        "runtimePatches": [{"manager": "torchfleet", "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
                "metadata": {"annotations": dict(node["annotations"])}, "spec": pod}}}}]}}}}],
    }
    if node["deadline"]:
        spec["activeDeadlineSeconds"] = node["deadline"]
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": _metadata(node, k8s),
            "spec": spec}


def _pytorchjob(plan: Mapping[str, Any], k8s: Mapping[str, str], node: Mapping[str, Any]) -> dict[str, Any]:
    """A PyTorchJob: one Master pod and numNodes-1 Workers, the same container ("pytorch")
    in each; the Master's port named pytorchjob-port is the plan's MASTER_PORT."""

    def replica(count: int, master: bool) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": "pytorch", "image": node["image"], "workingDir": node["workdir"],
            "command": [node["python"], "-m", "torch.distributed.run"], "args": _torchrun(node),
            "env": node["env"], "volumeMounts": node["mounts"],
        }
        if node["resources"]:
            container["resources"] = node["resources"]
        if master:
            container["ports"] = [{"name": "pytorchjob-port", "containerPort": int(plan["master_port"])}]
        return {"replicas": count, "restartPolicy": "Never", "template": {
            "metadata": {"annotations": dict(node["annotations"])},
            "spec": {"terminationGracePeriodSeconds": node["grace"], "containers": [container],
                     "volumes": node["volumes"]}}}

    replicas = {"Master": replica(1, True)}
    if node["num_nodes"] > 1:
        replicas["Worker"] = replica(node["num_nodes"] - 1, False)
    # A failed run is not retried, as torchfleet's own is not (torchrun --max-restarts 0).
    run_policy: dict[str, Any] = {"backoffLimit": 0}
    if node["deadline"]:
        run_policy["activeDeadlineSeconds"] = node["deadline"]
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _metadata(node, k8s),
            "spec": {"nprocPerNode": str(node["procs_per_node"]), "pytorchReplicaSpecs": replicas,
                     "runPolicy": run_policy}}
