"""Offline checks against the upstream schemas shipped in ``schemas/`` (SOURCES.md says
where each comes from): a Kubeflow manifest against its CRD's ``openAPIV3Schema``, and a
kubelet drop-in against the kubelet's own ``KubeletConfiguration`` type.

Both checks are strict about field names, where a misspelled field would otherwise do
nothing: the API server prunes an unknown field of a custom resource (``kubectl apply``
rejects it, by default), and the kubelet decodes a v1beta1 file leniently, only logging one.
"""

from __future__ import annotations

import copy
import difflib
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, Mapping

import jsonschema
import yaml

from torchfleet import cpus
from torchfleet.errors import InventoryError

SCHEMAS = Path(__file__).resolve().parent / "schemas"
# kind -> (the CRD file, where it comes from, as the error says it)
CRDS = {
    "TrainJob": ("trainer.kubeflow.org_trainjobs.yaml", "Kubeflow Trainer v2.3.0"),
    "PyTorchJob": ("kubeflow.org_pytorchjobs.yaml", "Kubeflow Training Operator v1.9.4"),
}
KUBELET_TYPES = "kubelet_config_v1beta1_types.go"
KUBELET_API = "kubelet.config.k8s.io/v1beta1"
# The TrainJob CRD's own CEL rule for its name (x-kubernetes-validations, which jsonschema
# does not run); the v1 operator's webhook asks the same of a PyTorchJob.
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class SchemaError(InventoryError):
    """A document that fails its schema; ``fields`` are the paths of the failing fields."""

    def __init__(self, what: str, problems: list[tuple[str, str]]):
        self.fields = [path for path, _ in problems]
        detail = "; ".join(f"{path}: {why}" for path, why in problems)
        super().__init__(f"{what}: {detail}", variable=None)


# --- CRDs -------------------------------------------------------------------------------------


@lru_cache(maxsize=None)
def crd(kind: str) -> dict[str, Any]:
    if kind not in CRDS:
        raise SchemaError("no shipped schema", [("kind", f"{kind!r} is not one of {', '.join(CRDS)}")])
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(SCHEMAS / CRDS[kind][0]) as fh:
        return yaml.load(fh, Loader=loader)


@lru_cache(maxsize=None)
def _validator(kind: str, api_version: str) -> jsonschema.Draft4Validator:
    definition = crd(kind)["spec"]
    served = {f"{definition['group']}/{v['name']}": v for v in definition["versions"] if v.get("served")}
    if api_version not in served:
        raise SchemaError(f"the {kind} CRD ({CRDS[kind][1]})",
                          [("apiVersion", f"{api_version!r} is not served; served: {', '.join(sorted(served))}")])
    return jsonschema.Draft4Validator(strict(served[api_version]["schema"]["openAPIV3Schema"]))


def strict(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema with every object that lists its properties closed to others, as a
    structural CRD schema is (unless it says x-kubernetes-preserve-unknown-fields)."""
    out = copy.deepcopy(dict(schema))
    stack = [out]
    while stack:
        node = stack.pop()
        if "properties" in node and "additionalProperties" not in node \
                and not node.get("x-kubernetes-preserve-unknown-fields"):
            node["additionalProperties"] = False
        stack += [v for v in (node.get("properties") or {}).values() if isinstance(v, dict)]
        for key in ("items", "additionalProperties", "not"):
            if isinstance(node.get(key), dict):
                stack.append(node[key])
        for key in ("anyOf", "allOf", "oneOf"):
            stack += [v for v in node.get(key) or [] if isinstance(v, dict)]
    return out


def _path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(the document)"


def _problems(error: jsonschema.ValidationError) -> list[tuple[str, str]]:
    """The error as (field path, why), naming the missing or unexpected field itself."""
    where = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        return [(_path(where + [name]), "is required but missing")
                for name in error.validator_value if name not in error.instance]
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = set(error.schema.get("properties") or {})
        return [(_path(where + [name]), "is not a field of the schema"
                 + (f" (did you mean {close[0]}?)" if (close := difflib.get_close_matches(name, known, 1)) else ""))
                for name in error.instance if name not in known]
    return [(_path(where), error.message)]


def check(manifest: Mapping[str, Any]) -> None:
    """Raise SchemaError, naming every failing field, unless ``manifest`` passes the
    openAPIV3Schema of its kind's shipped CRD at its apiVersion, and its name the CRD's
    name rule."""
    kind, api_version = manifest.get("kind"), manifest.get("apiVersion")
    what = f"the rendered {kind} does not pass its CRD's schema ({CRDS.get(str(kind), ('', 'none'))[1]})"
    if kind not in CRDS:
        raise SchemaError(what, [("kind", f"{kind!r} is not one of {', '.join(CRDS)}")])
    problems = [p for e in _validator(str(kind), str(api_version)).iter_errors(manifest) for p in _problems(e)]
    name = (manifest.get("metadata") or {}).get("name")
    if not isinstance(name, str) or len(name) > 63 or not DNS1035_LABEL.match(name):
        problems.append(("metadata.name", f"{name!r} must be a DNS label: at most 63 lower-case letters, digits "
                                          "and '-', starting with a letter"))
    if problems:
        raise SchemaError(what, sorted(set(problems)))


# --- the kubelet's configuration --------------------------------------------------------------

# A Go type in a json-tagged struct field -> the JSON type its value must have.
_GO_JSON = (
    (re.compile(r"^\*?(bool)$"), "boolean"),
    (re.compile(r"^\*?u?int(8|16|32|64)?$"), "integer"),
    (re.compile(r"^\*?float(32|64)$"), "number"),
    (re.compile(r"^\*?(string|metav1\.Duration)$"), "string"),
    (re.compile(r"^map\["), "object"),
    (re.compile(r"^\[\]"), "array"),
)
_JSON_PY = {"boolean": bool, "integer": int, "number": (int, float), "string": str, "object": dict, "array": list}


@lru_cache(maxsize=None)
def kubelet_fields() -> dict[str, str]:
    """KubeletConfiguration's fields, JSON name -> JSON type, read from the kubelet's own
    Go type (its json tags); a struct-typed field is an object."""
    text = (SCHEMAS / KUBELET_TYPES).read_text()
    strings = set(re.findall(r"^type (\w+) string$", text, re.M))
    body = re.search(r"^type KubeletConfiguration struct \{\n(.*?)^\}", text, re.M | re.S)
    if not body:
        raise SchemaError(f"{KUBELET_TYPES}", [("KubeletConfiguration", "has no struct of that name")])
    fields = {"apiVersion": "string", "kind": "string"}  # metav1.TypeMeta, inline
    for go_type, name in re.findall(r"^\t\w+\s+(\S+)\s+`json:\"(\w+)[,\"]", body[1], re.M):
        bare = go_type.lstrip("*")
        json_type = "string" if bare in strings else next((t for rx, t in _GO_JSON if rx.match(go_type)), "object")
        fields[name] = json_type
    return fields


@lru_cache(maxsize=None)
def kubelet_choices() -> dict[str, set[str]]:
    """The values types.go names for the topology manager's fields (its constants)."""
    text = (SCHEMAS / KUBELET_TYPES).read_text()
    return {field: set(re.findall(rf"^\t\w+{suffix}\s*=\s*\"([^\"]+)\"", text, re.M))
            for field, suffix in (("topologyManagerPolicy", "TopologyManagerPolicy"),
                                  ("topologyManagerScope", "TopologyManagerScope"))}


def check_kubelet(config: Mapping[str, Any], where: str = "the kubelet configuration") -> None:
    """Raise SchemaError, naming every failing field, unless ``config`` is a
    KubeletConfiguration whose fields the kubelet knows, each of its type, with
    reservedSystemCPUs a CPU list and the topology manager's values ones it names."""
    fields, choices = kubelet_fields(), kubelet_choices()
    problems: list[tuple[str, str]] = []
    if config.get("apiVersion") != KUBELET_API or config.get("kind") != "KubeletConfiguration":
        problems.append(("apiVersion", f"must be {KUBELET_API} with kind KubeletConfiguration, not "
                                       f"{config.get('apiVersion')!r} {config.get('kind')!r}"))
    for name, value in config.items():
        if name not in fields:
            close = difflib.get_close_matches(name, fields, 1)
            problems.append((name, "is not a KubeletConfiguration field" + (f" (did you mean {close[0]}?)" if close
                                                                              else "")))
            continue
        expected = _JSON_PY[fields[name]]
        if not isinstance(value, expected) or (fields[name] in ("integer", "number") and isinstance(value, bool)):
            problems.append((name, f"{value!r} is not of type {fields[name]}"))
        elif name in choices and value not in choices[name]:
            problems.append((name, f"{value!r} is not one of {', '.join(sorted(choices[name]))}"))
        elif name == "reservedSystemCPUs":
            try:
                cpus.parse_cpulist(value, variable=name)
            except InventoryError as exc:
                problems.append((name, exc.message))
    if problems:
        raise SchemaError(f"{where} does not pass KubeletConfiguration ({KUBELET_TYPES}, kubelet v0.36.3)",
                          problems)
