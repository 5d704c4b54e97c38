"""The local cluster: docker hosts on this machine (playbooks/local_cluster.yml), each
running its own Docker engine as a real node does, and a Cluster on them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from torchfleet.cluster import Cluster
from torchfleet.events import EventHook
from torchfleet.results import PlaybookResult
from torchfleet.runner import find_project


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
                            env: Mapping[str, str] | None) -> tuple[Path, Path, PlaybookResult]:
    """Run playbooks/local_cluster.yml on this machine for the cluster ``name``."""
    project = Path(project_dir).resolve() if project_dir else find_project()
    inventory = _local_inventory(project, inventory_dir)
    controller = Cluster(project / "inventory" / "local", project_dir=project, progress=progress, env=env,
                         extra_vars={"local_cluster_name": name, "local_cluster_inventory": str(inventory / "hosts.yml"),
                                     **variables})
    result, _ = controller._run("playbooks/local_cluster.yml", title, {})
    controller._raise_for(result, title)
    return project, inventory, result


def _local_inventory(project: Path, inventory_dir: str | Path | None) -> Path:
    """The local cluster's inventory folder; another than the default shares its group_vars."""
    if inventory_dir is None:
        return project / "inventory" / "local"
    folder = Path(inventory_dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "group_vars"
    if not link.exists():
        link.symlink_to(project / "inventory" / "local" / "group_vars")
    return folder
