"""``torchfleet plan --format`` without a playbook: the inventory's job, planned for the
Kubernetes node that the k8s_* variables describe, from the inventory's variables alone.

Nothing is contacted: no SSH, no name lookup, no node's CPUs (a pod's CPUs are the
Kubernetes node's; kubelet.py). No variable of the controller's environment enters the
plan either: a role default that reads one (launch_proxy_env's proxies) counts as unset,
so only a variable that the inventory or ``-e`` sets can ask for it. The spec is then built
as a launch builds it (spec.build), and rendered (torchfleet.k8s.render).
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path
from typing import Any, Mapping, Sequence

from torchfleet import cpus, hosts, inputs, modes, ranks, runner, spec, workload
from torchfleet.errors import InventoryError
from torchfleet.k8s import VARIABLES, Rendered, kubelet, render, variables
from torchfleet.k8s.pod import NO_NODE

# A role default that reads the controller's environment, and what it is without one.
_READS_ENV = re.compile(r"lookup\(\s*['\"](ansible\.builtin\.)?env['\"]")
WITHOUT_CONTROLLER = {"launch_proxy_env": {}}
# The variables a plan reads besides the launch's input (inputs.input_variables) and the
# pinning's (cpus.PINNING_VARIABLES): the job's, its guard's and the rank table's.
JOB_VARIABLES = ("launch_run_id", "launch_job", "launch_image", "launch_container_prefix", "launch_command",
                 "launch_args", "launch_workload", "launch_entrypoint", "launch_wait_master_listen",
                 *spec.GUARD_VARIABLES.values(), *spec.RESTART_VARIABLES.values(), ranks.NODE_RANK_VAR,
                 ranks.PROCS_VAR)
# GLOO_SOCKET_IFNAME of the plan's ranks, which a pod never gets (pod.NOT_PASSED).
POD_INTERFACE = "eth0"


def manifest(fmt: str, inventory: Sequence[str | Path], extra_vars: Mapping[str, Any],
             project: Path | None = None) -> Rendered:
    """The manifest of the job that ``inventory`` and ``extra_vars`` describe (``-e`` and the
    job's flags, as a playbook would take them), for the Kubernetes node the k8s_* variables
    describe. ``project``: the checkout whose roles' defaults apply (None: the installed
    collection's)."""
    values = read(inventory, extra_vars, project)
    # Another tool's k8s_* variables in the inventory (kubespray has some) are left alone; a -e is ours.
    ours = {h: {k: v for k, v in vs.items() if k in VARIABLES or k in extra_vars} for h, vs in values.items()}
    k8s = same_everywhere(ours)
    rendered = render(fmt, plan(values, k8s), k8s)
    unknown = sorted({k for vs in values.values() for k in vs if k.startswith("k8s_") and k not in VARIABLES})
    rendered.warnings += [f"{k} in the inventory is no torchfleet variable; did you mean {close[0]}?"
                          for k in unknown if (close := difflib.get_close_matches(k, VARIABLES, 1, cutoff=0.9))]
    return rendered


def read(inventory: Sequence[str | Path], extra_vars: Mapping[str, Any], project: Path | None) -> dict[str, dict]:
    """Each host's values of the launch group (launch_hosts_group, from -e), templated over
    the launch and cpu_pinning roles' defaults as a play would, with plain Python types."""
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import init_plugin_loader
    from ansible.template import Templar, trust_as_template
    from ansible.utils.collection_loader import AnsibleCollectionConfig
    from ansible.vars.manager import VariableManager

    if AnsibleCollectionConfig.collection_finder is None:
        # Lookups and filters by their collection's name, found where a play finds them.
        init_plugin_loader(runner.collection_paths(project))
    loader = DataLoader()
    found = InventoryManager(loader=loader, sources=[str(p) for p in inventory])
    group = str(extra_vars.get("launch_hosts_group") or "torchfleet_nodes")
    names = hosts.group_hosts(found.get_groups_dict(), group)
    defaults: dict[str, Any] = {}
    for role in ("cpu_pinning", "launch"):
        for name, value in (loader.load_from_file(str(_role_dir(role, project) / "defaults" / "main.yml"),
                                                  trusted_as_template=True) or {}).items():
            defaults[name] = WITHOUT_CONTROLLER[name] if _READS_ENV.search(str(value)) else value
    given = {k: _trusted(v, trust_as_template) for k, v in extra_vars.items()}
    wanted = set(inputs.input_variables()) | set(cpus.PINNING_VARIABLES) | set(JOB_VARIABLES)
    manager = VariableManager(loader=loader, inventory=found)
    values = {}
    for name in names:
        own = manager.get_vars(host=found.get_host(name), include_hostvars=False)
        merged = {**defaults, **own, **given, "role_path": str(_role_dir("launch", project)),
                  "playbook_dir": str(_role_dir("launch", project).parent.parent / "playbooks")}
        templar = Templar(loader=loader, variables=merged)
        values[name] = {}
        for key in sorted(k for k in merged if k in wanted or k.startswith("k8s_")):
            try:
                values[name][key] = _plain(templar.template(merged[key]))
            except Exception as exc:  # Ansible's templating errors have no common public base
                raise InventoryError(f"{key} cannot be worked out without a play: {exc}", name, key) from None
    return values


def _trusted(value: Any, trust: Any) -> Any:
    # ansible-playbook templates -e values as it does the inventory's.
    if isinstance(value, str):
        return trust(value)
    if isinstance(value, dict):
        return {k: _trusted(v, trust) for k, v in value.items()}
    if isinstance(value, list):
        return [_trusted(v, trust) for v in value]
    return value


def _plain(value: Any) -> Any:
    """Ansible's tagged values as the plain types they stand for."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    return value


def _role_dir(role: str, project: Path | None) -> Path:
    """A role of torchfleet's: the checkout's, else the installed collection's."""
    if project is not None and (Path(project) / "roles" / role).is_dir():
        return Path(project) / "roles" / role
    found = importlib.util.find_spec("ansible_collections.torchfleet.cluster")
    for folder in (found.submodule_search_locations or []) if found else []:
        if (Path(folder) / "roles" / role).is_dir():
            return Path(folder) / "roles" / role
    raise InventoryError(f"cannot find torchfleet's {role} role: run from a checkout, or install torchfleet's "
                         "collection", None, "inventory")


def same_everywhere(per_host: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The k8s_* variables, which describe one pod template: the same on every host."""
    first = next(iter(per_host.values()), {})
    for host, own in per_host.items():
        differ = sorted(k for k in set(first) | set(own) if first.get(k) != own.get(k))
        if differ:
            raise InventoryError(f"{differ[0]} differs between hosts; the k8s_* variables describe the one pod "
                                 "template of every node: set them for the whole group (or with -e)", host, differ[0])
    return dict(first)


def plan(values: Mapping[str, Mapping[str, Any]], k8s_values: Mapping[str, Any]) -> dict[str, Any]:
    """The redacted launch spec of the hosts' ``values``, each node planned as the Kubernetes
    node that ``k8s_values`` describe, refusing first a launch mode that no pod can run."""
    names = list(values)
    first = values[names[0]]
    mode = modes.get(first.get("launch_mode"))
    refusal = mode.pod_refusal({"torchrun_runtime": first.get("launch_torchrun_runtime") or "container"})
    if refusal:
        raise InventoryError(refusal[1], None, refusal[0])
    kube = kubelet.node(variables(k8s_values))
    guard = {k: first.get(v) for k, v in {**spec.GUARD_VARIABLES, **spec.RESTART_VARIABLES}.items()}
    table = ranks.rank_table([{"name": h, "address": h, "node_rank": values[h].get(ranks.NODE_RANK_VAR),
                               "procs": values[h].get(ranks.PROCS_VAR)} for h in names],
                             first.get("launch_master_port"))
    guard["min_nodes"] = inputs.check_min_nodes(guard.get("min_nodes"), table["num_nodes"])
    job = {
        "run_id": inputs.check_run_id(first["launch_run_id"]) if first.get("launch_run_id") else inputs.new_run_id(),
        "job": inputs.check_job(first.get("launch_job")), "mode": mode.name,
        "transport": first.get("launch_transport") or "tcp", "image": first.get("launch_image"),
        "torchrun_runtime": first.get("launch_torchrun_runtime") or "container",
        "container_prefix": first.get("launch_container_prefix"), "command": first.get("launch_command") or [],
        "args": first.get("launch_args") or [],
        "workload_argv": workload.entrypoint_argv(str(first.get("launch_workload")),
                                                  str(first.get("launch_entrypoint") or ""), "python3"),
        "wait_master_listen": bool(first.get("launch_wait_master_listen", True)), "guard": guard,
    }
    nodes = {h: _node(h, values[h], table, job, kube) for h in names}
    return spec.redacted(spec.build(job, table, nodes))


def _node(host: str, values: Mapping[str, Any], table: Mapping[str, Any], job: Mapping[str, Any],
          kube: kubelet.Node | None) -> dict[str, Any]:
    """What spec.build needs of a node, with the Kubernetes node's CPUs for the inventory's."""
    checked = inputs.node_input(values, host)
    settings = dict(checked["settings"], checkpoint_dir=inputs.checkpoint_dir(
        checked["settings"], job["run_id"], job["guard"].get("max_restarts")))
    pinning = cpus.settings(values, host)
    local = sum(1 for r in table["ranks"] if r["host"] == host)
    if kube is None and pinning["enabled"]:
        raise InventoryError(NO_NODE, None, "k8s_node_lscpu")
    if kube is None and not int(values.get("launch_omp_num_threads") or 0):
        raise InventoryError("unpinned ranks get OMP_NUM_THREADS from the node's CPUs, and a pod's are the "
                             "Kubernetes node's: set launch_omp_num_threads, or describe the Kubernetes node "
                             "(k8s_node_lscpu or k8s_node_cpus)", None, "launch_omp_num_threads")
    return {"address": host, "interface": POD_INTERFACE, "nproc": len(kube.rows) if kube else 1,
            "pinning": kubelet.pod_pinning(kube, local, pinning) if kube and pinning["enabled"] else [],
            "settings": settings, "env_public": checked["env_public"], "env_shown": checked["env_shown"]}
