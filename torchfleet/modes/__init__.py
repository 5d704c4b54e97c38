"""Launch modes: how a job's ranks are started. Each mode is one module here, behind
:class:`LaunchMode`, and registers itself. Everything else asks the mode by name through
:func:`get`: the spec builder for its units, the check phase for what it needs of a node,
the report for its ranks' finals. The launch role only sees what a mode built (its units'
kind, container or process, and the spec's data), never a mode's name.

A new mode is a new module here that subclasses LaunchMode, calls :func:`register`, and is
imported at the end of this file; or a module of another installed package that does the
same and is named in the entry point group ``torchfleet.modes`` (docs/adding-a-launch-mode.md).
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from torchfleet.errors import InventoryError

if TYPE_CHECKING:
    from torchfleet.modes.context import NodeContext

# (variable, whether the node's settings use it, why the mode cannot apply it).
Unsupported = tuple[str, Callable[[Mapping[str, Any]], bool], str]
# A shell on the node that submits a scheduler's job: sh(script, *words) runs ``sh -c script sh
# words...`` there and returns what ansible.builtin.command does (rc, stdout, stderr, msg).
Shell = Callable[..., Mapping[str, Any]]


class Scheduler:
    """A batch scheduler's side of a run whose units it runs (a mode that has one starts the
    unit kind ``scheduler``), as torchx's Scheduler is: whether it would take the job,
    changing nothing (the launch's check); its submission, once every node's run folder is
    made (the start); its state (a status); and its cancel (the run's end, a stop, a
    replace, ``torchfleet down``). Each step runs on the node that submits, the run's
    master, through ``sh``; the scheduler_job action drives them, and the launch role
    reaches them only through that action, by the unit kind."""

    # Whether the scheduler's process that starts a unit (a Slurm step's shell) stays its
    # guard's parent while the scheduler holds the unit: the guard then counts its parent's
    # end (a cancelled step, a slurmstepd gone) as its unit's failure, and ends the run.
    parent_holds_unit = False

    def test(self, sh: Shell, spec: Mapping[str, Any], nodes: Mapping[str, Any]) -> str:
        """What the scheduler says of the spec's job (``nodes``: launch_spec's), or the
        InventoryError that names the variable to change."""
        raise NotImplementedError

    def submit(self, sh: Shell, spec: Mapping[str, Any], nodes: Mapping[str, Any], run_dir: str,
               timeout: float) -> str:
        """Submit the job from the master's run folder (``run_dir``) and return its id once
        the master's first unit runs; a job that cannot start within ``timeout`` seconds is
        cancelled, and an InventoryError says why."""
        raise NotImplementedError

    def describe(self, sh: Shell, run_dir: str) -> dict[str, Any] | None:
        """The run's job as the scheduler lists it: ``job_id``, ``state`` (a run state, by
        run_vocab.run_state) and ``text``; None where it has none, or no longer lists it."""
        raise NotImplementedError

    def cancel(self, sh: Shell, run_dir: str, timeout: float) -> dict[str, Any]:
        """Cancel the run's job, if it has one, and wait until the scheduler lets go of it:
        ``changed``, ``job_id`` and what it still ``listed`` after ``timeout``."""
        raise NotImplementedError



class LaunchMode:
    """One way of starting a job's ranks. Only :meth:`build` must be written; every other
    hook has the plain answer of a mode that starts each rank itself."""

    name = ""
    # The scheduler that runs the mode's units, for a mode whose units a scheduler runs.
    scheduler: Scheduler | None = None
    # The mode's own node settings, each from its variable with its type (as inputs.SETTINGS).
    SETTINGS: dict[str, tuple[str, Callable[[Any], Any]]] = {}
    # What a mode cannot do on a node whose units run as processes, by option.
    PROCESS_UNSUPPORTED: tuple[Unsupported, ...] = (
        ("launch_extra_volumes", lambda s: bool(s.get("extra_volumes")),
         "bare processes have no mounts; the paths are already on the node"),
        ("launch_oom_kill_disable", lambda s: bool(s.get("oom_kill_disable")), "it is a docker run option"),
    )

    def runtime(self, job: Mapping[str, Any]) -> str:
        """Where the mode's units run for ``job`` (its launch_* choices, e.g.
        ``torchrun_runtime``): ``container`` (the training image) or ``process`` (the
        node's own Python, launch_python). This is the unit kind the launch role starts."""
        return "container"

    def node_roles(self, job: Mapping[str, Any]) -> frozenset[str]:
        """The roles that site.yml gives every node for this mode, beyond the engine, the
        image and the dataset: ``python_env`` where the units run in the node's Python."""
        return frozenset({"python_env"}) if self.runtime(job) == "process" else frozenset()

    def unit_kind(self, job: Mapping[str, Any]) -> str:
        """What the launch role starts for ``job`` (the start_units action): its runtime's
        units itself, or ``scheduler``, one job that the mode's scheduler runs as the units."""
        return "scheduler" if self.scheduler is not None else self.runtime(job)

    def spec_files(self, spec: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, str]]:
        """Files made from the whole spec (``LaunchSpec.to_dict()``, every unit's guarded
        command in it), per node, that its start writes into the run's folder beside
        ``ctx.files``; ``nodes``: spec.build's."""
        return {}

    def summary(self, run_dir: Path) -> dict[str, Any]:
        """What the mode adds to the run's summary, from the files collected into ``run_dir``;
        a ``note`` is added to the run's own."""
        return {}

    def chosen_by(self, job: Mapping[str, Any]) -> str:
        """The settings that chose this mode's runtime, as an error names them."""
        return f"launch_mode={self.name}"

    def unsupported(self, job: Mapping[str, Any]) -> tuple[Unsupported, ...]:
        """The node settings this mode refuses for ``job``."""
        return self.PROCESS_UNSUPPORTED if self.runtime(job) == "process" else ()

    def pod_refusal(self, job: Mapping[str, Any]) -> tuple[str, str] | None:
        """(variable, why) where a Kubernetes pod, whose torchrun starts the node's ranks in the
        training image (torchfleet.k8s), cannot stand in for this mode's start; else None."""
        if self.runtime(job) == "process":
            return ("launch_mode", f"{self.chosen_by(job)} runs the ranks in the node's own Python (launch_python), "
                                   "which a pod does not have; render a container launch")
        return None

    def check_node(self, host: str, settings: Mapping[str, Any], table: Mapping[str, Any]) -> None:
        """Refuse a node's input that cannot work under this mode (InventoryError)."""

    def build(self, ctx: NodeContext) -> None:
        """Fill in one node's units and ranks (``ctx.unit``, ``ctx.rank``) and the files
        the start writes into its run folder (``ctx.files``)."""
        raise NotImplementedError

    def run_owner(self, settings: Mapping[str, Any]) -> str | None:
        """``uid:gid`` that owns the run's folder where the ranks are not root."""
        return None

    # Whether the ranks read the secret environment from a file in the run folder (which the
    # start writes, readable by run_owner only, and the stop removes) rather than from their
    # container's environment.
    secret_env_file = False

    def node_facts(self, host: str, table: Mapping[str, Any], probe: Mapping[str, Any]) -> dict[str, Any]:
        """What build needs of a node's probe beyond its address, interface and CPUs."""
        return {}

    def probe(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """What the check phase must read on the node for this mode: ``paths`` it needs,
        ``uid`` whose account node_probe reports, ``image_uid`` whose account the image
        reports."""
        return {}

    def node_checks(self, host: str, reading: Mapping[str, Any], image_account: Mapping[str, Any] | None,
                    settings: Mapping[str, Any], table: Mapping[str, Any], image: str) -> list[dict[str, Any]]:
        """check_input entries for what the mode needs of a node (``reading``: node_probe's)."""
        return []

    def run_files(self, host: str, master: bool) -> list[tuple[str, str]]:
        """The mode's own files a node holds of a run, as (name on the node, name in runs/RUN/)."""
        return []

    def finals(self, spec: Mapping[str, Any], run_dir: Path, finals: list[dict[str, Any]],
               reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """Each rank's final state from what the units left in ``run_dir`` (``finals``: per
        unit, with the guards' records applied), writing rank-N.log where a unit ran
        several ranks; and the failure's reason, with the mode's own words added."""
        return finals, reason


def refuse_restarts(job: Mapping[str, Any], why: str) -> Unsupported:
    """launch_max_restarts above 0 refused, for a mode whose guards cannot restart its ranks
    (the run's setting, in ``job["guard"]``, not a node's)."""
    asked = int(float((job.get("guard") or {}).get("max_restarts") or 0)) > 0
    return ("launch_max_restarts", lambda settings: asked, why)


_MODES: dict[str, LaunchMode] = {}
# Modes that other installed packages add, by the entry point group that names them (as torchx
# finds its schedulers): loaded the first time a mode is not among torchfleet's own.
ENTRY_POINTS = "torchfleet.modes"
_plugins_loaded = False


def register(mode: LaunchMode) -> LaunchMode:
    _MODES[mode.name] = mode
    return mode


def _load_plugins() -> None:
    global _plugins_loaded
    if not _plugins_loaded:
        _plugins_loaded = True
        for entry in importlib.metadata.entry_points(group=ENTRY_POINTS):
            entry.load()  # the module registers its mode


def get(name: Any) -> LaunchMode:
    """The mode called ``name``, or InventoryError naming launch_mode."""
    if name not in _MODES:
        _load_plugins()
    if name not in _MODES:
        raise InventoryError(f"launch_mode={name!r} is not one of {', '.join(_MODES)}", None, "launch_mode")
    return _MODES[name]


def names() -> tuple[str, ...]:
    _load_plugins()
    return tuple(_MODES)


from torchfleet.modes import container, mpirun, process, slurm, torchrun  # noqa: E402,F401  (each registers itself)
