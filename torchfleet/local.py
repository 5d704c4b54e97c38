"""The local cluster: docker hosts on this machine (the local_cluster playbook), each
running its own Docker engine as a real node does, and a Cluster on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from torchfleet.cluster import Cluster
from torchfleet.events import EventHook
from torchfleet.results import PlaybookResult
from torchfleet import runner


def local_up(nodes: int = 3, *, name: str = "torchfleet", subnet: str | None = None,
             inventory_dir: str | Path | None = None, project_dir: str | Path | None = None,
             progress: bool | EventHook = True, **cluster_kwargs: Any) -> tuple[Cluster, PlaybookResult]:
    """Create (or keep) N docker hosts on this machine; returns a Cluster on them."""
    env = cluster_kwargs.pop("env", None)
    variables: dict[str, Any] = {"local_cluster_nodes": int(nodes)}
    if subnet:
        variables["local_cluster_subnet"] = subnet
    project, inventory, result = _local_cluster_playbook(f"local up ({nodes} nodes)", variables, name, inventory_dir,
                                                         project_dir, progress, env)
    return Cluster(inventory, project_dir=project, progress=progress, env=env, **cluster_kwargs), result


def local_down(*, name: str = "torchfleet", inventory_dir: str | Path | None = None,
               project_dir: str | Path | None = None, progress: bool | EventHook = True,
               env: Mapping[str, str] | None = None) -> PlaybookResult:
    """Remove the local docker hosts and their network."""
    return _local_cluster_playbook("local down", {"local_cluster_state": "absent"}, name, inventory_dir,
                                   project_dir, progress, env)[2]


def _local_cluster_playbook(title: str, variables: Mapping[str, Any], name: str, inventory_dir: str | Path | None,
                            project_dir: str | Path | None, progress: bool | EventHook,
                            env: Mapping[str, str] | None) -> tuple[Path | None, Path, PlaybookResult]:
    """Run the local_cluster playbook on this machine for the cluster ``name``. Its inventory
    goes to ``inventory_dir`` (default: inventory/local in the checkout or the current
    folder), the local cluster's settings beside it (group_vars/all.yml)."""
    project = Path(project_dir).resolve() if project_dir else runner.find_project()
    inventory = Path(inventory_dir).resolve() if inventory_dir else (project or Path.cwd()) / "inventory" / "local"
    controller = Cluster([], project_dir=project, progress=progress, env=env,
                         extra_vars={"local_cluster_name": name, "local_cluster_inventory": str(inventory / "hosts.yml"),
                                     **variables})
    result, _ = controller._run(runner.playbook("local_cluster"), title, {})
    controller._raise_for(result, title)
    return project, inventory, result
