"""The launch spec as a Kubernetes manifest: a Kubeflow Trainer v2 TrainJob (torch-distributed
runtime) or a v1 Training Operator PyTorchJob.

``render(fmt, plan, variables)`` takes a plan (``Plan.to_dict()``, the redacted launch spec)
made for the Kubernetes node (torchfleet.k8s.offline makes one from the inventory's
variables, contacting nothing) and the ``k8s_*`` variables. Every node runs one pod in which
torchrun starts its ranks; the operator gives torchrun the node count, the node's rank and
the master's address (PET_* variables). The manifest is held to its CRD's schema
(schema.check), to what admission refuses beyond it (admission.check), and, where its pods
are pinned, to the kubelet's CPU manager (kubelet.py). What the plan holds that a pod cannot
mean is refused, naming its variable. docs/kubernetes.md says what maps to what.
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

import yaml

from torchfleet.errors import InventoryError
from torchfleet.k8s import admission, kubelet, pod
from torchfleet.k8s.schema import SchemaError, check
from torchfleet.settings import as_bool

__all__ = ["FORMATS", "VARIABLES", "Rendered", "SchemaError", "check", "render", "to_yaml", "variables"]

FORMATS = ("trainjob", "pytorchjob")
# The variables rendering reads, each with its default and type (docs/kubernetes.md says
# what each means). The node's and the kubelet's defaults are the kubelet_cpu_manager role's.
VARIABLES: dict[str, tuple[Any, type]] = {
    "k8s_name": ("", str), "k8s_namespace": ("", str), "k8s_image": ("", str), "k8s_secret_name": ("", str),
    "k8s_data_claim": ("", str), "k8s_workload_claim": ("", str), "k8s_output_claim": ("", str),
    "k8s_checkpoint_claim": ("", str), "k8s_claim_size": ("10Gi", str), "k8s_memory": ("", str),
    "k8s_runtime": ("torch-distributed", str), "k8s_trainer_version": ("v2.3.0", str),
    "k8s_labels": ({}, dict), "k8s_queue_name": ("", str), "k8s_node_selector": ({}, dict),
    "k8s_tolerations": ([], list), "k8s_image_pull_secrets": ([], list), "k8s_worker_init_guaranteed": (False, bool),
    "k8s_node_lscpu": ("", str), "k8s_node_cpus": (0, int), "k8s_node_sockets": (1, int),
    "k8s_node_threads_per_core": (1, int), "k8s_node_numa_nodes": (0, int), "k8s_reserved_cpus": ("0", str),
    "k8s_cpu_manager_policy": ("static", str), "k8s_full_pcpus_only": (False, bool),
    "k8s_topology_policy": ("single-numa-node", str),
}
# runtimePatches' terminationGracePeriodSeconds came with Trainer v2.3.0 (kubeflow/trainer#3324);
# v2.2 prunes it, and v2.1 has no runtimePatches at all (podTemplateOverrides).
MIN_TRAINER = (2, 3, 0)
# Who owns torchfleet's runtime patch: Trainer asks for a domain-prefixed path (admission.py).
PATCH_MANAGER = "torchfleet.local/plan"


@dataclass
class Rendered:
    """A manifest, what must exist before it is applied (``needs``: objects and commands to
    create them), and what it cannot promise (``warnings``)."""

    manifest: dict[str, Any]
    needs: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def variables(values: Mapping[str, Any]) -> dict[str, Any]:
    """The k8s_* variables from ``values`` (other names are left alone), over their defaults,
    each of its type; an unknown k8s_* name is refused, naming the one probably meant."""
    unknown = sorted(k for k in values if str(k).startswith("k8s_") and k not in VARIABLES)
    if unknown:
        close = difflib.get_close_matches(unknown[0], VARIABLES, 1)
        raise InventoryError(f"{unknown[0]} is not a torchfleet Kubernetes variable"
                             + (f"; did you mean {close[0]}?" if close else f" (known: {', '.join(VARIABLES)})"),
                             None, unknown[0])
    out: dict[str, Any] = {}
    for name, (default, kind) in VARIABLES.items():
        value = values.get(name)
        if value is None or value == "":
            out[name] = default
        elif kind is bool:
            out[name] = as_bool(value)
        elif kind in (dict, list) and not isinstance(value, kind):
            raise InventoryError(f"{name} must be a {'mapping' if kind is dict else 'list'}, not {value!r}",
                                 None, name)
        else:
            try:
                out[name] = kind(value)
            except (TypeError, ValueError):
                raise InventoryError(f"{name}={value!r} must be a whole number", None, name) from None
    return out


def render(fmt: str, plan: Mapping[str, Any], values: Mapping[str, Any] | None = None) -> Rendered:
    """The manifest of ``plan`` in ``fmt`` (trainjob or pytorchjob), checked against the
    shipped CRD, admission's rules and the kubelet's. Raises InventoryError naming the
    variable for anything a pod cannot mean, SchemaError naming the field for a manifest
    that its CRD or admission refuses."""
    if fmt not in FORMATS:
        raise InventoryError(f"format {fmt!r} is not one of {', '.join(FORMATS)}", None, "format")
    k8s = variables(values or {})
    if fmt == "trainjob" and _version(k8s["k8s_trainer_version"]) < MIN_TRAINER:
        raise InventoryError(f"k8s_trainer_version={k8s['k8s_trainer_version']}: a TrainJob as torchfleet renders it "
                             "needs Kubeflow Trainer v2.3.0 or later (its runtimePatches' pod terminationGracePeriodSeconds "
                             "came in v2.3.0, and v2.1 and earlier have no runtimePatches); upgrade Trainer, or render "
                             "a pytorchjob", None, "k8s_trainer_version")
    kube = kubelet.node(k8s)
    node = pod.build(fmt, plan, k8s, kube)
    manifest = (_trainjob if fmt == "trainjob" else _pytorchjob)(plan, k8s, node)
    check(manifest)
    admission.check(manifest)
    warnings = pod.policy_warnings(kube) + check_pods(manifest, kube, k8s["k8s_worker_init_guaranteed"])
    return Rendered(manifest, needs(fmt, plan, k8s, node), warnings)


def _version(text: str) -> tuple[int, ...]:
    numbers = re.findall(r"\d+", str(text))
    if not numbers:
        raise InventoryError(f"k8s_trainer_version={text!r} is not a version such as v2.3.0", None,
                             "k8s_trainer_version")
    return tuple(int(n) for n in numbers[:3])


class _Dumper(yaml.SafeDumper):
    # Written out in full where a part repeats: kubectl reads anchors, but people read the file.
    def ignore_aliases(self, data: Any) -> bool:
        return True


def to_yaml(manifest: Mapping[str, Any]) -> str:
    return yaml.dump(dict(manifest), Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)


# --- the kubelet's word on each pod -----------------------------------------------------------

# The v1 operator's init container in every Worker of a PyTorchJob with a Master
# (kubeflow/trainer v1.9.4, pkg/controller.v1/pytorch/initcontainer.go), as it adds it unless
# its --pytorch-init-container-template-file says otherwise.
INIT_PYTORCH = {"requests": {"cpu": "50m", "memory": "10Mi"}, "limits": {"cpu": "100m", "memory": "20Mi"}}


def check_pods(manifest: Mapping[str, Any], kube: kubelet.Node | None, init_guaranteed: bool = False) -> list[str]:
    """Hold each pinned pod of ``manifest`` to the kubelet's rules (kubelet.RULES): raise
    KubeletRuleError where its own container cannot have exclusive CPUs, and return a warning
    for a pod that the operator's additions keep from them."""
    warnings = []
    spec = manifest.get("spec") or {}
    if manifest.get("kind") == "TrainJob":
        pods = [("node", (spec.get("trainer") or {}).get("resourcesPerNode") or {}, [])]
    else:
        pods = []
        for role, replica in sorted((spec.get("pytorchReplicaSpecs") or {}).items()):
            containers = (((replica or {}).get("template") or {}).get("spec") or {}).get("containers") or []
            main = next((c for c in containers if c.get("name") == admission.PYTORCH_CONTAINER), {})
            added = [INIT_PYTORCH] if role == "Worker" and "Master" in spec["pytorchReplicaSpecs"] \
                and not init_guaranteed else []
            pods.append((role, main.get("resources") or {}, added))
    for role, resources, added in pods:
        cpu = (resources.get("limits") or {}).get("cpu") or (resources.get("requests") or {}).get("cpu")
        if cpu is None or kube is None or kube.policy != "static":
            continue
        if kubelet.qos_class([resources]) != "Guaranteed":
            raise kubelet.KubeletRuleError("guaranteed", f"the {role} pod's container asks for cpu {cpu} with "
                                           f"requests {resources.get('requests')} and limits {resources.get('limits')}",
                                           "k8s_memory")
        kubelet.check_grant(kube, cpu)
        if kubelet.qos_class([resources, *added]) != "Guaranteed":
            warnings.append(f"the {role} pods are Burstable, not Guaranteed, so the static CPU manager pins none of "
                            "their CPUs: the v1 training operator adds its init-pytorch container (requests 50m/10Mi, "
                            "limits 100m/20Mi; pkg/controller.v1/pytorch/initcontainer.go) to every Worker, and the "
                            "QoS class counts init containers (pkg/apis/core/v1/helper/qos/qos.go). Only the Master "
                            "is pinned. Give the operator an init container template whose requests equal its limits "
                            "(--pytorch-init-container-template-file; docs/kubernetes.md), then set "
                            "k8s_worker_init_guaranteed: true; or render a trainjob")
    return warnings


# --- the two kinds -----------------------------------------------------------------------------


def _metadata(node: Mapping[str, Any], k8s: Mapping[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": node["name"]}
    if k8s["k8s_namespace"]:
        meta["namespace"] = k8s["k8s_namespace"]
    labels = dict(node["labels"])
    if node["queue"]:
        # Kueue admits the job by its queue (and suspends it until then).
        labels[pod.QUEUE_LABEL] = node["queue"]
    meta["labels"] = labels
    return meta


def _torchrun(node: Mapping[str, Any]) -> list[str]:
    """torchrun's arguments: the plan's rank command, as torchrun runs it. The node count,
    its rank and the master come from the operator (PET_*); the processes per node too."""
    return ["--no-python", *node["argv"]]


def _trainjob(plan: Mapping[str, Any], k8s: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
    """A TrainJob on the torch-distributed ClusterTrainingRuntime. The trainer has no working
    directory, so the command enters the workload's folder first; the volumes, labels and
    placement go in through runtimePatches (the runtime's node job, its container "node")."""
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
    pod_spec = {"terminationGracePeriodSeconds": node["grace"], **node["placement"],
                "containers": [{"name": "node", "volumeMounts": node["mounts"]}], "volumes": node["volumes"]}
    spec: dict[str, Any] = {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                       "name": k8s["k8s_runtime"]},
        "trainer": trainer,
        "runtimePatches": [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {
            "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
                "metadata": {"labels": dict(node["labels"])}, "spec": pod_spec}}}}]}}}}],
    }
    if node["deadline"]:
        spec["activeDeadlineSeconds"] = node["deadline"]
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob", "metadata": _metadata(node, k8s),
            "spec": spec}


def _pytorchjob(plan: Mapping[str, Any], k8s: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
    """A PyTorchJob: one Master pod and numNodes-1 Workers, the same container ("pytorch")
    in each; the Master's port named pytorchjob-port is the plan's MASTER_PORT.

    launch_max_restarts N: every pod restarts its container on failure (restartPolicy
    OnFailure), and the operator fails the job once the containers' restarts, summed over
    the running pods, reach runPolicy.backoffLimit (pkg/core/job.go, PastBackoffLimit). A
    failed rank ends every node's torchrun, so one restart of the job is one per pod:
    N x num_nodes + 1 lets N of them run, and the next failure ends the job."""
    restarts = node["max_restarts"]

    def replica(count: int, master: bool) -> dict[str, Any]:
        container: dict[str, Any] = {
            "name": admission.PYTORCH_CONTAINER, "image": node["image"], "workingDir": node["workdir"],
            "command": [node["python"], "-m", "torch.distributed.run"], "args": _torchrun(node),
            "env": node["env"], "volumeMounts": node["mounts"],
        }
        if node["resources"]:
            container["resources"] = node["resources"]
        if master:
            container["ports"] = [{"name": admission.PYTORCH_PORT, "containerPort": int(plan["master_port"])}]
        return {"replicas": count, "restartPolicy": "OnFailure" if restarts else "Never", "template": {
            "metadata": {"labels": dict(node["labels"])},
            "spec": {"terminationGracePeriodSeconds": node["grace"], **node["placement"], "containers": [container],
                     "volumes": node["volumes"]}}}

    replicas = {"Master": replica(1, True)}
    if node["num_nodes"] > 1:
        replicas["Worker"] = replica(node["num_nodes"] - 1, False)
    run_policy: dict[str, Any] = {"backoffLimit": restarts * node["num_nodes"] + 1 if restarts else 0}
    if node["deadline"]:
        run_policy["activeDeadlineSeconds"] = node["deadline"]
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _metadata(node, k8s),
            "spec": {"nprocPerNode": str(node["procs_per_node"]), "pytorchReplicaSpecs": replicas,
                     "runPolicy": run_policy}}


# --- what must exist first ---------------------------------------------------------------------


def needs(fmt: str, plan: Mapping[str, Any], k8s: Mapping[str, Any], node: Mapping[str, Any]) -> list[dict[str, Any]]:
    """What the job's pods need that the manifest does not make, each as ``what`` and either
    the ``manifest`` or the ``command`` that makes it: the runtime or operator, the Secret
    (its keys from the shell's variables of the same names, never a value here), the image
    pull Secrets and the claims."""
    namespace = ["--namespace", k8s["k8s_namespace"]] if k8s["k8s_namespace"] else []
    found: list[dict[str, Any]] = []
    if fmt == "trainjob":
        found.append({"what": f"Kubeflow Trainer {k8s['k8s_trainer_version']} and its ClusterTrainingRuntime "
                              f"{k8s['k8s_runtime']}",
                      "command": "kubectl apply --server-side -k 'https://github.com/kubeflow/trainer.git/manifests/"
                                 f"overlays/manager?ref={k8s['k8s_trainer_version']}' && kubectl apply --server-side -k "
                                 "'https://github.com/kubeflow/trainer.git/manifests/overlays/runtimes?ref="
                                 f"{k8s['k8s_trainer_version']}'"})
    else:
        found.append({"what": "the v1 training operator v1.9.4",
                      "command": "kubectl apply --server-side -k 'github.com/kubeflow/trainer.git/manifests/overlays/"
                                 "standalone?ref=v1.9.4'"})
    secret = sorted({str(n) for r in plan.get("ranks") or [] for n in r.get("secret_env") or []})
    if secret:
        found.append({"what": f"the Secret {k8s['k8s_secret_name']}, one key per secret variable",
                      "command": shlex.join(["kubectl", "create", "secret", "generic", k8s["k8s_secret_name"],
                                             *namespace]) + "".join(f' --from-literal={n}="${n}"' for n in secret)})
    registry = node["image"].split("/")[0] if "/" in node["image"] else "docker.io"
    for name in k8s["k8s_image_pull_secrets"]:
        found.append({"what": f"the image pull Secret {name}",
                      "command": shlex.join(["kubectl", "create", "secret", "docker-registry", str(name), *namespace,
                                             f"--docker-server={registry}", "--docker-username=USER"])
                      + ' --docker-password="$REGISTRY_PASSWORD"'})
    shared = node["num_nodes"] > 1
    for mount in node["mounts"]:
        claim = next(v["persistentVolumeClaim"]["claimName"] for v in node["volumes"] if v["name"] == mount["name"])
        holds = next(h for _, (volume, _, h) in pod.FOLDERS.items() if volume == mount["name"])
        metadata = {"name": claim, **({"namespace": k8s["k8s_namespace"]} if k8s["k8s_namespace"] else {})}
        found.append({"what": f"the PersistentVolumeClaim {claim}: {holds}"
                              + (", filled before the job" if mount["readOnly"] else ""),
                      "manifest": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata,
                                   "spec": {"accessModes": ["ReadWriteMany" if shared else "ReadWriteOnce"],
                                            "resources": {"requests": {"storage": k8s["k8s_claim_size"]}}}}})
    return found


def needs_text(rendered: Rendered) -> str:
    """``needs`` for people: each command, and each manifest as YAML to apply."""
    lines = []
    for need in rendered.needs:
        lines.append(f"# {need['what']}:")
        lines.append(need["command"] if "command" in need else
                     "kubectl apply -f - <<'EOF'\n" + to_yaml(need["manifest"]) + "EOF")
    return "\n".join(lines)
