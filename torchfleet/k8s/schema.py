"""Offline checks of a Kubeflow manifest against its CRD's ``openAPIV3Schema``, as shipped in
``schemas/`` (SOURCES.md says where each comes from).

The check is strict about field names, where a misspelled field would otherwise do nothing:
the API server prunes an unknown field of a custom resource (``kubectl apply`` rejects it,
by default). What the schema cannot say (CEL rules, webhooks) is torchfleet.k8s.admission's.
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

from torchfleet.errors import InventoryError

SCHEMAS = Path(__file__).resolve().parent / "schemas"
# kind -> (the CRD file, where it comes from, as the error says it)
CRDS = {
    "TrainJob": ("trainer.kubeflow.org_trainjobs.yaml", "Kubeflow Trainer v2.3.0"),
    "PyTorchJob": ("kubeflow.org_pytorchjobs.yaml", "Kubeflow Training Operator v1.9.4"),
}
# A DNS-1035 label: the TrainJob CRD's CEL rule for its name (x-kubernetes-validations, which
# jsonschema does not run), and the v1 operator's webhook's for a PyTorchJob (admission.py).
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
    openAPIV3Schema of its kind's shipped CRD at its apiVersion."""
    kind, api_version = manifest.get("kind"), manifest.get("apiVersion")
    what = f"the rendered {kind} does not pass its CRD's schema ({CRDS.get(str(kind), ('', 'none'))[1]})"
    if kind not in CRDS:
        raise SchemaError(what, [("kind", f"{kind!r} is not one of {', '.join(CRDS)}")])
    problems = [p for e in _validator(str(kind), str(api_version)).iter_errors(manifest) for p in _problems(e)]
    if problems:
        raise SchemaError(what, sorted(set(problems)))


def duplicate_keys(manifest: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The items of ``manifest`` that repeat a key of a list its CRD marks
    ``x-kubernetes-list-type: map`` (its ``x-kubernetes-list-map-keys``, a key's schema default
    standing in where it is left out) or an item of a ``set``: the API server refuses them."""
    kind, api_version = str(manifest.get("kind")), str(manifest.get("apiVersion"))
    found: list[tuple[str, str]] = []
    stack: list[tuple[Mapping[str, Any], Any, list[Any]]] = [(_validator(kind, api_version).schema, manifest, [])]
    while stack:
        node, value, where = stack.pop()
        if isinstance(value, dict):
            properties = node.get("properties") or {}
            extra = node.get("additionalProperties")
            stack += [(properties.get(k) or (extra if isinstance(extra, dict) else {}), v, where + [k])
                      for k, v in value.items()]
        elif isinstance(value, list):
            items = node.get("items") or {}
            kind_of_list = node.get("x-kubernetes-list-type")
            if kind_of_list in ("map", "set"):
                keys = node.get("x-kubernetes-list-map-keys") or []
                defaults = {k: ((items.get("properties") or {}).get(k) or {}).get("default") for k in keys}
                seen: dict[Any, int] = {}
                for i, item in enumerate(value):
                    key = (tuple(item.get(k, defaults[k]) for k in keys) if kind_of_list == "map" and
                           isinstance(item, dict) else repr(item))
                    if key in seen:
                        shown = ", ".join(f"{k}={v!r}" for k, v in zip(keys, key)) if keys else repr(item)
                        found.append((_path(where + [i]), f"repeats {shown} of item {seen[key]}"))
                    seen.setdefault(key, i)
            stack += [(items, v, where + [i]) for i, v in enumerate(value)]
    return sorted(found)
