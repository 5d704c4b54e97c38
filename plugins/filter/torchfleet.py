"""Filters that turn facts into cluster addresses, Gloo interfaces, rank environments, overlay addresses
and slurm.conf's node lines."""

import base64
import os

from ansible.errors import AnsibleFilterError

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab
from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core  # noqa: F401  # pylint: disable=unused-import
from torchfleet import attempts, cpus, hosts, inputs, modes, outputs, overlay, preflight, ranks, redact, settings, site_state, slurm
from torchfleet.errors import InventoryError


def _wrap(func):
    def inner(*args, **kwargs):
        try:
            return func(*args, **kwargs)
        except InventoryError as exc:
            raise AnsibleFilterError(str(exc)) from None

    inner.__doc__ = func.__doc__
    return inner


def cluster_address(host_vars, host):
    """The address other nodes reach ``host`` on, from its variables and facts."""
    return ranks.cluster_address_of(host, host_vars)


def pinning_checks(values, host):
    """check_input's checks of the cpu_pinning role's input (``values``: its variables), by
    the rules the launch applies too (torchfleet.cpus.settings): none where they hold."""
    try:
        cpus.settings(values, host)
    except InventoryError as exc:
        return [{"that": False, "msg": str(exc).removeprefix(f"host {host}: "), "variable": exc.variable}]
    return []


def kubelet_config_dir(cmdline):
    """The drop-in folder a running kubelet reads (its --config-dir), from its /proc/PID/cmdline
    as slurp returns it (base64); "" where it reads none."""
    from torchfleet.k8s import kubelet  # here: the Kubernetes checks cost the other filters nothing

    return kubelet.config_dir(base64.b64decode(cmdline)) or ""


def start_gate(listens):
    """Whether the start may go on: every unit that others start after listens, or ended with
    code 0 without listening, by the start's waits (``listens``; None where a node did not wait)."""
    return all(wait.get("outcome") in (run_vocab.StartOutcome.LISTENING, run_vocab.StartOutcome.SUCCEEDED)
               for wait in listens if wait)


def mode_roles(mode, torchrun_runtime="container"):
    """The roles that site.yml gives a node for its launch mode (LaunchMode.node_roles), by
    the mode's name and its runtime's setting."""
    return sorted(modes.get(mode).node_roles({"torchrun_runtime": torchrun_runtime}))


def scheduler_runs(asked):
    """The runs whose units a scheduler runs (their mode has one), each with the node that
    holds it, from every node's run_state stop (``asked``: host -> its result): their jobs
    are the scheduler's to cancel too."""
    found = {}
    for host, result in sorted(asked.items()):
        for run in (result or {}).get("stopped_runs") or []:
            mode = run.get("mode")
            if mode in modes.names() and modes.get(mode).scheduler is not None:
                found.setdefault(run["run_id"], {"run_id": run["run_id"], "mode": mode, "host": host})
    return [found[k] for k in sorted(found)]


def redact_url(text):
    """``text`` with the credentials of every URL in it replaced by ***."""
    return redact.redact(text)


def overlay_allocate(network, hosts, explicit=None, previous=None):
    """The overlay's state ``{network, addresses}``: explicit addresses, then kept ones, then new ones."""
    return overlay.allocate(network, hosts, explicit, previous)


def overlay_allocate_error(network, hosts, explicit=None, previous=None):
    """What is wrong with the overlay's network or addresses, as data ({} when nothing is)."""
    try:
        overlay.allocate(network, hosts, explicit, previous)
    except InventoryError as exc:
        return {"message": str(exc), "host": exc.host, "variable": exc.variable or "overlay_network"}
    return {}


def split_site_env(settings, secret, host):
    """A node's rank environment: open part, secret part and what may be shown (torchfleet.inputs).
    Bad names come back as ``error`` (names only, never a value): the task that splits runs
    under no_log, which would hide the message, so a check after it reports it."""
    try:
        return inputs.split_site_env(settings, secret, host)
    except InventoryError as exc:
        return {"public": {}, "secret": {}, "shown": {}, "error": {"message": str(exc), "variable": exc.variable}}


def running_runs(nodes, bare):
    """The runs of the job that still run on ``nodes`` (hostvars entries), as node_probe
    (process modes) or rank_containers (container modes) found them."""
    found = []
    for node in nodes:
        if bare:
            found += (node.get("launch__node_state") or {}).get("running_runs") or []
        else:
            found += [c["run"] for c in (node.get("launch__job_containers") or {}).get("containers") or []
                      if c.get("running")]
    return sorted(set(found))


def run_file(word):
    """A file of a run's folder by its name in the run's vocabulary (module_utils/run_vocab),
    such as ``SECRET_ENV``: tasks never spell a run's file names themselves."""
    name = getattr(run_vocab, str(word), None)
    if not isinstance(name, str):
        raise AnsibleFilterError(f"run_file: {word!r} names no file of a run (the collection's module_utils.run_vocab)")
    return name


def run_word(word):
    """A word of a run's vocabulary (module_utils/run_vocab) by its class and member, such as
    ``RunState.RUNNING``: tasks compare a run's states and outcomes with these, never with
    words of their own."""
    kind, _dot, member = str(word).partition(".")
    words = getattr(run_vocab, kind, None)
    if not (isinstance(words, type) and issubclass(words, run_vocab._Word) and member in words.__members__):
        raise AnsibleFilterError(f"run_word: {word!r} names no word of a run (the collection's module_utils.run_vocab)")
    return words[member].value


def files_to_copy(names, src_files, dest_files, mode, owner=None, group=None):
    """Which of ``names`` to copy: those the node (``dest_files``, as ansible.builtin.find
    returns them with get_checksum) lacks, or holds with another checksum than the
    controller's (``src_files``), another mode than ``mode``, or where given another
    ``owner`` or ``group`` (numeric ids). A name the controller's find did not return is
    copied anyway, so that the copy reports it."""
    src = {os.path.basename(f["path"]): f.get("checksum") for f in src_files or []}
    dest = {os.path.basename(f["path"]): f for f in dest_files or []}

    def same(name):
        held = dest.get(name)
        return held is not None and (held.get("checksum"), held.get("mode")) == (src[name], mode) \
            and (owner is None or str(held.get("uid")) == str(owner)) \
            and (group is None or str(held.get("gid")) == str(group))

    return [name for name in names if name not in src or not same(name)]


def taken_port_check(port, table, skip=False):
    """A check_input entry for a port that already listens on the master (passes when ``skip``)."""
    return preflight.taken_port_check(port, table, skip)


def runtime_ready(node, bare):
    """Whether a node (its hostvars) has what its ranks run on: launch_python, as node_probe
    found it, or the image, as node_probe looked for it (the fact launch__job_containers)."""
    if bare:
        return bool((node.get("launch__node_state") or {}).get("python_ok"))
    return len((node.get("launch__job_containers") or {}).get("images") or []) == 1


def node_checks(nodes, hosts, table, bare, image, job, planning=False, replace=False, mode="container"):
    """check_input's checks of every node's state (torchfleet.preflight.node_checks), each with
    its host, from what each node's own tasks read (``nodes``: the hostvars of ``hosts``):
    one task on the controller, where a task per node costs a process per node."""
    checks = []
    for host, node in zip(hosts, nodes):
        settings = (node.get("launch__input") or {}).get("settings") or {}
        found = preflight.node_checks(host, node.get("launch__node_state") or {}, runtime_ready(node, bare),
                                      running_runs([node], bare), table, bare=bare,
                                      runtime=settings.get("python") if bare else image, settings=settings, job=job,
                                      planning=planning, replace=replace, mode=mode,
                                      image_account=(node.get("launch__job_containers") or {}).get("image_account"),
                                      libraries=((node.get("launch__node_state") if bare else
                                                  node.get("launch__job_containers")) or {}).get("libraries"))
        checks += [dict(c, host=host) for c in found]
    return checks


def plan_lines(nodes, hosts, table):
    """One line per node of the plan: its ranks, interface and cpusets (``nodes``: each host's launch__node)."""
    return [f"{host} runs ranks {','.join(str(r['rank']) for r in table['ranks'] if r['host'] == host)} on "
            f"{node['interface']}, cpusets {' '.join(p['cpuset'] for p in node['pinning']) or 'unpinned'}, preloads "
            f"{settings.malloc_library((node.get('settings') or {}).get('malloc')) or 'nothing (glibc malloc)'}"
            for host, node in zip(hosts, nodes)]


def process_entries(units, job):
    """The rank_processes entries of process units; secret values are added by the module."""
    return [{"rank": (u["ranks"] or [0])[0], "name": u["name"], "role": u["role"], "job": job, "argv": u["command"],
             "env": {k: v for k, v in u["env"].items() if k not in u["secret_env"]}, "cwd": u["workdir"],
             "cpuset": u["cpuset"]} for u in units]


def overlay_check_endpoints(network, endpoints):
    """The overlay network, once no node's endpoint (cluster address) is found inside it."""
    return overlay.check_endpoints(network, endpoints)


def overlay_state(text):
    """The overlay state file's content (empty when there is none yet)."""
    return overlay.load_state(text)


def overlay_unreachable(results, max_age):
    """The node pairs that cannot talk over the overlay, from every node's overlay_probe result."""
    return overlay.unreachable_pairs(results, int(max_age))


def slurm_input_error(host_vars, hosts, chosen, cluster_name, partition):
    """What is wrong with the slurm role's cluster-wide input (its controller among ``hosts``,
    ordered by their torchfleet_node_rank in ``host_vars``, and its names), as data ({} when
    nothing is)."""
    try:
        slurm.controller([{"name": h, "node_rank": host_vars[h].get(ranks.NODE_RANK_VAR)} for h in hosts], chosen)
        slurm.check_names(cluster_name, partition)
    except InventoryError as exc:
        return {"message": str(exc), "host": exc.host, "variable": exc.variable}
    return {}


def slurm_conf(nodes, chosen=None, reserve_mib=0):
    """slurm.conf's controller and node lines (torchfleet.slurm.conf_nodes), from each node's
    name, node rank, hostname, cluster address and readings."""
    return slurm.conf_nodes(nodes, chosen, int(reserve_mib))


def slurm_unready(sinfo, hostnames):
    """The nodes that do not serve jobs, with their state, from sinfo's node list."""
    return slurm.unready(sinfo, hostnames)


class FilterModule:
    def filters(self):
        return {
            "cluster_address": _wrap(cluster_address),
            "overlay_allocate": _wrap(overlay_allocate),
            "overlay_check_endpoints": _wrap(overlay_check_endpoints),
            "overlay_allocate_error": overlay_allocate_error,
            "split_site_env": split_site_env,
            "process_entries": process_entries,
            "node_checks": node_checks,
            "runtime_ready": runtime_ready,
            "running_runs": running_runs,
            "start_gate": start_gate,
            "scheduler_runs": scheduler_runs,
            "mode_roles": _wrap(mode_roles),
            "follow_order": attempts.follow_order,
            "collect_plans": outputs.collect_plans,
            "files_to_copy": files_to_copy,
            "run_file": run_file,
            "run_word": run_word,
            "plan_lines": plan_lines,
            "pinning_checks": pinning_checks,
            "same_machine_checks": hosts.same_identity_checks,
            "site_plan": site_state.plan,
            "taken_port_check": taken_port_check,
            "overlay_state": _wrap(overlay_state),
            "overlay_unreachable": _wrap(overlay_unreachable),
            "redact_url": redact_url,
            "kubelet_config_dir": kubelet_config_dir,
            "slurm_input_error": slurm_input_error,
            "slurm_conf": _wrap(slurm_conf),
            "slurm_unready": slurm_unready,
        }
