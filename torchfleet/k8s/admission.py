"""What the API server and the operators' admission webhooks refuse that a CRD's schema does
not say, carried over as named rules, each with the upstream file that holds it.

A manifest that passes its CRD's ``openAPIV3Schema`` can still be denied at admission:
Trainer's webhook checks the runtime patches and the trainer's environment, the v1 training
operator's checks the replicas and their containers, and the API server checks labels and the
keys of list-maps. Every rendered manifest is held to all of them (``check``); a rule is a
function from the manifest to its failures, (field, why).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from torchfleet.k8s import schema
from torchfleet.k8s.schema import DNS1035_LABEL, SchemaError

TRAINER = "kubeflow/trainer v2.3.0"
OPERATOR = "kubeflow/trainer v1.9.4 (the v1 training operator)"
APIMACHINERY = "kubernetes/kubernetes"
# The torch-distributed ClusterTrainingRuntime's replicated jobs and their containers
# (kubeflow/trainer v2.3.0, manifests/base/runtimes/torch_distributed.yaml).
RUNTIME_JOBS = {"node": {"node"}}
# Trainer's torch plugin sets these for torchrun (pkg/constants/constants.go, TorchRunReservedEnvNames).
TORCHRUN_RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
# The v1 operator appends these to every container of a PyTorchJob with a Master, after the
# manifest's own (pkg/controller.v1/pytorch/envvar.go, master.go).
OPERATOR_ENV = ("PYTHONUNBUFFERED", "MASTER_ADDR", "PET_MASTER_ADDR", "MASTER_PORT", "PET_MASTER_PORT", "WORLD_SIZE",
                "RANK", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_NNODES")
PYTORCH_CONTAINER, PYTORCH_PORT = "pytorch", "pytorchjob-port"

Failure = tuple[str, str]


@dataclass(frozen=True)
class Rule:
    name: str
    kinds: tuple[str, ...]
    says: str
    source: str
    check: Callable[[Mapping[str, Any]], list[Failure]]


RULES: list[Rule] = []


def rule(name: str, kinds: tuple[str, ...], says: str, source: str):
    def register(check: Callable[[Mapping[str, Any]], list[Failure]]):
        RULES.append(Rule(name, kinds, says, source, check))
        return check
    return register


class AdmissionError(SchemaError):
    """A manifest that admission would deny; ``rules`` are the names of the rules it breaks."""

    def __init__(self, kind: str, failures: list[tuple[Rule, str, str]]):
        self.rules = sorted({r.name for r, _, _ in failures})
        super().__init__(f"the rendered {kind} would be denied at admission",
                         [(f, f"{why} [{r.name}: {r.source}]") for r, f, why in failures])


def failures(manifest: Mapping[str, Any]) -> list[tuple[Rule, str, str]]:
    kind = str(manifest.get("kind"))
    return [(r, f, why) for r in RULES if kind in r.kinds for f, why in r.check(manifest)]


def check(manifest: Mapping[str, Any]) -> None:
    """Raise AdmissionError naming every field and rule that admission would deny."""
    found = failures(manifest)
    if found:
        raise AdmissionError(str(manifest.get("kind")), found)


# --- walking a manifest -------------------------------------------------------------------------


def pod_templates(manifest: Mapping[str, Any]) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """(role, path, pod template) of each kind of pod the manifest makes: the TrainJob's node
    pods (the trainer and its runtime patch together), the PyTorchJob's Master and Worker."""
    spec = manifest.get("spec") or {}
    if manifest.get("kind") == "PyTorchJob":
        for role, replica in sorted((spec.get("pytorchReplicaSpecs") or {}).items()):
            yield role, f"spec.pytorchReplicaSpecs.{role}.template", (replica or {}).get("template") or {}
        return
    for i, patch in enumerate(spec.get("runtimePatches") or []):
        jobs = ((((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {})
                .get("replicatedJobs") or [])
        for j, job in enumerate(jobs):
            template = ((job.get("template") or {}).get("spec") or {}).get("template") or {}
            yield (job.get("name") or "", f"spec.runtimePatches[{i}].trainingRuntimeSpec.template.spec"
                   f".replicatedJobs[{j}].template.spec.template", template)


def containers(manifest: Mapping[str, Any], part: str = "containers") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(path, container) of every container (or init container) of the manifest's pod templates."""
    for _, path, template in pod_templates(manifest):
        for k, container in enumerate((template.get("spec") or {}).get(part) or []):
            yield f"{path}.spec.{part}[{k}]", container


def _labels(manifest: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    yield "metadata.labels", (manifest.get("metadata") or {}).get("labels") or {}
    for _, path, template in pod_templates(manifest):
        yield f"{path}.metadata.labels", (template.get("metadata") or {}).get("labels") or {}


# --- the API server ---------------------------------------------------------------------------

QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def label_problems(key: str, value: Any) -> list[str]:
    """Why a label is not one the API server takes (IsQualifiedName, IsValidLabelValue)."""
    problems = []
    prefix, _, name = key.rpartition("/")
    if "/" in key and (not prefix or len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix)):
        problems.append(f"key {key!r}: its prefix must be a DNS subdomain")
    if len(name) > 63 or not QUALIFIED_NAME.match(name):
        problems.append(f"key {key!r}: its name must be at most 63 letters, digits, '-', '_' or '.', starting "
                        "and ending with a letter or digit")
    if not isinstance(value, str) or len(value) > 63 or (value and not QUALIFIED_NAME.match(value)):
        problems.append(f"value {value!r} of {key}: at most 63 letters, digits, '-', '_' or '.', starting and "
                        "ending with a letter or digit")
    return problems


@rule("labels", ("TrainJob", "PyTorchJob"), "every label key is a qualified name, every value a label value",
      f"{APIMACHINERY}: staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go (IsQualifiedName, "
      "IsValidLabelValue), through ValidateObjectMeta; a pod template's labels fail when the operator makes the pod")
def _check_labels(manifest: Mapping[str, Any]) -> list[Failure]:
    return [(f"{path}.{key}", why) for path, labels in _labels(manifest) for key, value in labels.items()
            for why in label_problems(str(key), value)]


@rule("list-map-keys", ("TrainJob", "PyTorchJob"),
      "the items of a list the CRD marks x-kubernetes-list-type: map have distinct keys (env names, volumes, "
      "mounts, runtime patches' managers)",
      f"{APIMACHINERY}: staging/src/k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype/validation.go")
def _check_list_maps(manifest: Mapping[str, Any]) -> list[Failure]:
    return schema.duplicate_keys(manifest)


# --- Kubeflow Trainer v2.3.0 ------------------------------------------------------------------


def _patches(manifest: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((manifest.get("spec") or {}).get("runtimePatches") or [])


def is_domain_prefixed_path(value: Any) -> str | None:
    """Why ``value`` is not a domain-prefixed path (such as acme.io/foo), or None."""
    host, sep, path = str(value or "").partition("/")
    if not sep or not host or not path:
        return f"{value!r} must be a domain-prefixed path (such as \"acme.io/foo\")"
    if len(host) > 253 or not DNS1123_SUBDOMAIN.match(host):
        return f"{host!r} is not a lower-case RFC 1123 subdomain"
    if not re.fullmatch(r"[A-Za-z0-9/\-._~%!$&'()*+,;=:]+", path):
        return f"{path!r} is not a path of RFC 3986 characters"
    return None


@rule("runtime-patch-manager", ("TrainJob",), "each runtime patch's manager is a domain-prefixed path",
      f"{TRAINER}: pkg/runtime/framework/plugins/jobset/jobset.go (Validate, validation.IsDomainPrefixedPath)")
def _check_manager(manifest: Mapping[str, Any]) -> list[Failure]:
    return [(f"spec.runtimePatches[{i}].manager", why) for i, patch in enumerate(_patches(manifest))
            if (why := is_domain_prefixed_path(patch.get("manager")))]


@rule("runtime-patch-jobs", ("TrainJob",),
      "a runtime patch names only replicated jobs and containers that the runtime's template has (torch-distributed: "
      "the job node and its container node)",
      f"{TRAINER}: pkg/runtime/framework/plugins/jobset/jobset.go (Validate); "
      "manifests/base/runtimes/torch_distributed.yaml")
def _check_patch_jobs(manifest: Mapping[str, Any]) -> list[Failure]:
    found = []
    for role, path, template in pod_templates(manifest):
        if role not in RUNTIME_JOBS:
            found.append((path.rsplit(".template.spec.template", 1)[0] + ".name",
                          f"{role!r} is not a replicated job of the runtime ({', '.join(RUNTIME_JOBS)})"))
            continue
        spec = template.get("spec") or {}
        for part in ("initContainers", "containers"):
            for k, container in enumerate(spec.get(part) or []):
                if container.get("name") not in RUNTIME_JOBS[role]:
                    found.append((f"{path}.spec.{part}[{k}].name", f"{container.get('name')!r} is not a container of "
                                                                    f"the runtime's job {role}"))
    return found


@rule("runtime-patch-env", ("TrainJob",),
      "a runtime patch sets no env on the node, dataset-initializer or model-initializer container (the trainer's "
      "env goes in spec.trainer.env)", f"{TRAINER}: pkg/runtime/framework/plugins/jobset/jobset.go (Validate)")
def _check_patch_env(manifest: Mapping[str, Any]) -> list[Failure]:
    return [(f"{path}.env", f"must not be set on the {c.get('name')} container") for path, c in containers(manifest)
            if c.get("env") and c.get("name") in ("node", "dataset-initializer", "model-initializer")]


@rule("trainer-reserved-env", ("TrainJob",), f"spec.trainer.env sets none of {', '.join(TORCHRUN_RESERVED_ENV)}",
      f"{TRAINER}: pkg/runtime/framework/plugins/torch/torch.go (Validate); pkg/constants/constants.go")
def _check_trainer_env(manifest: Mapping[str, Any]) -> list[Failure]:
    env = ((manifest.get("spec") or {}).get("trainer") or {}).get("env") or []
    taken = sorted({str(e.get("name")) for e in env} & set(TORCHRUN_RESERVED_ENV))
    return [("spec.trainer.env", f"must not set the reserved {', '.join(taken)}")] if taken else []


@rule("trainjob-name", ("TrainJob",), "metadata.name is a DNS-1035 label of at most 63 characters",
      f"{TRAINER}: manifests/base/crds/trainer.kubeflow.org_trainjobs.yaml (x-kubernetes-validations, which the "
      "schema check does not run)")
def _check_trainjob_name(manifest: Mapping[str, Any]) -> list[Failure]:
    return _dns1035_name(manifest)


def _dns1035_name(manifest: Mapping[str, Any]) -> list[Failure]:
    name = (manifest.get("metadata") or {}).get("name")
    if isinstance(name, str) and len(name) <= 63 and DNS1035_LABEL.match(name):
        return []
    return [("metadata.name", f"{name!r} must be a DNS label: at most 63 lower-case letters, digits and '-', "
                              "starting with a letter")]


# --- the v1 training operator, v1.9.4 ---------------------------------------------------------

WEBHOOK = f"{OPERATOR}: pkg/webhooks/pytorch/pytorchjob_webhook.go"


def _replicas(manifest: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return dict((manifest.get("spec") or {}).get("pytorchReplicaSpecs") or {})


@rule("pytorchjob-name", ("PyTorchJob",), "metadata.name is a DNS-1035 label",
      f"{WEBHOOK} (validatePyTorchJob, NameIsDNS1035Label)")
def _check_pytorchjob_name(manifest: Mapping[str, Any]) -> list[Failure]:
    return _dns1035_name(manifest)


@rule("pytorchjob-replicas", ("PyTorchJob",),
      "the replica types are Master and Worker, Master has exactly 1 replica and Worker at least 1",
      f"{WEBHOOK} (validatePyTorchReplicaSpecs)")
def _check_replicas(manifest: Mapping[str, Any]) -> list[Failure]:
    found = []
    replicas = _replicas(manifest)
    if not replicas:
        found.append(("spec.pytorchReplicaSpecs", "must be set"))
    for role, replica in replicas.items():
        path = f"spec.pytorchReplicaSpecs.{role}"
        count = (replica or {}).get("replicas")
        if role not in ("Master", "Worker"):
            found.append((path, f"{role!r} is not Master or Worker"))
        elif role == "Master" and count != 1:
            found.append((f"{path}.replicas", "must be 1"))
        elif role == "Worker" and count is not None and count < 1:
            found.append((f"{path}.replicas", "must be at least 1"))
    return found


@rule("pytorchjob-containers", ("PyTorchJob",),
      f"every replica has containers, each with an image, one of them named {PYTORCH_CONTAINER}",
      f"{WEBHOOK} (validatePyTorchReplicaSpecs)")
def _check_containers(manifest: Mapping[str, Any]) -> list[Failure]:
    found = [(f"{path}.image", "must be set") for path, c in containers(manifest) if not c.get("image")]
    for _, path, template in pod_templates(manifest):
        names = [c.get("name") for c in (template.get("spec") or {}).get("containers") or []]
        if PYTORCH_CONTAINER not in names:
            found.append((f"{path}.spec.containers", f"must have a container named {PYTORCH_CONTAINER}"
                                                    if names else "must be set"))
    return found


@rule("pytorchjob-operator-env", ("PyTorchJob",),
      f"no container sets {', '.join(OPERATOR_ENV)}: the operator appends its own after them, and the last wins",
      f"{OPERATOR}: pkg/controller.v1/pytorch/envvar.go (setPodEnv), master.go")
def _check_operator_env(manifest: Mapping[str, Any]) -> list[Failure]:
    found = []
    for path, c in containers(manifest):
        taken = sorted({str(e.get("name")) for e in c.get("env") or []} & set(OPERATOR_ENV))
        if taken:
            found.append((f"{path}.env", f"sets {', '.join(taken)}, which the operator sets"))
    return found


@rule("pytorchjob-master-port", ("PyTorchJob",),
      f"the Master's {PYTORCH_CONTAINER} container names its rendezvous port {PYTORCH_PORT} (else the operator adds "
      "port 23456, and MASTER_PORT is that)",
      f"{OPERATOR}: pkg/apis/kubeflow.org/v1/pytorch_defaults.go (setPyTorchDefaultPort), "
      "pkg/controller.v1/pytorch/envvar.go (getPortFromPyTorchJob)")
def _check_master_port(manifest: Mapping[str, Any]) -> list[Failure]:
    master = _replicas(manifest).get("Master") or {}
    for c in ((master.get("template") or {}).get("spec") or {}).get("containers") or []:
        if c.get("name") == PYTORCH_CONTAINER and any(p.get("name") == PYTORCH_PORT for p in c.get("ports") or []):
            return []
    return [("spec.pytorchReplicaSpecs.Master.template.spec.containers", f"no {PYTORCH_CONTAINER} container with a "
                                                                          f"port named {PYTORCH_PORT}")]
