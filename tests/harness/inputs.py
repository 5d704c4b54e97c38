"""A role's variables as the role's own ``defaults/main.yml`` gives them, for the unit tests
that check a node's input: never a copy of the defaults, which drifts."""

from functools import lru_cache

import yaml

from harness import ROOT

# The launch role's defaults that name other variables (Jinja), which only a play renders:
# a plain value for each, as the local cluster's group_vars would make them.
LAUNCH_RENDERED = {
    "launch_job": "mnist", "launch_image": "torchfleet/train:2.13.0-cpu", "launch_workload": "mnist.py",
    "launch_dataset_dir": "/var/lib/torchfleet/datasets/fashion-mnist", "launch_runs_dir": "runs",
}


@lru_cache(maxsize=None)
def role_defaults(role: str) -> dict:
    """``roles/ROLE/defaults/main.yml``, the values that name other variables left out."""
    defaults = yaml.safe_load((ROOT / "roles" / role / "defaults" / "main.yml").read_text()) or {}
    return {k: v for k, v in defaults.items() if not (isinstance(v, str) and "{{" in v)}


def role_guard() -> dict:
    """A launch's job["guard"] (torchfleet.spec.GUARD_VARIABLES) as the launch role's defaults set it."""
    from torchfleet.spec import GUARD_VARIABLES

    defaults = role_defaults("launch")
    return {key: defaults[variable] for key, variable in GUARD_VARIABLES.items()}


def launch_values(**over) -> dict:
    """A node's launch variables as the launch_input action hands them to node_input: the
    launch role's defaults (LAUNCH_RENDERED for those a play renders), overridden by ``over``."""
    return {**role_defaults("launch"), **LAUNCH_RENDERED, **over}
