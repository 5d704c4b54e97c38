"""The Kubernetes node as the kubelet's CPU manager sees it, and what a pod may ask of it.

On Kubernetes the kubelet picks a pod's CPUs, not torchfleet. Its static CPU manager gives a
container exclusive CPUs only as the rules below allow, each the kubelet's own, named by
its source in kubernetes/kubernetes (``pkg/kubelet/cm/...``, ``pkg/apis/core/v1/helper/qos``).
A pod that breaks one stays Pending, fails admission (SMTAlignmentError,
TopologyAffinityError), or runs unpinned; here it is refused before it is printed.

The node's shape comes from an ``lscpu -p`` capture of a Kubernetes node (k8s_node_lscpu)
or from its counts (k8s_node_cpus, k8s_node_sockets, k8s_node_threads_per_core,
k8s_node_numa_nodes), never from the inventory's nodes. Pure but for reading the capture.
"""

from __future__ import annotations

import itertools
import re
import shlex
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Iterable, Mapping

from torchfleet import cpus
from torchfleet.errors import InventoryError

# Each rule: (what it says, where the kubelet says it).
RULES = {
    "guaranteed": ("a container gets exclusive CPUs only in a Guaranteed pod: every container, init containers "
                   "included, has cpu and memory limits, and the pod's requests equal its limits",
                   "pkg/apis/core/v1/helper/qos/qos.go (GetPodQOS), pkg/kubelet/cm/cpumanager/policy_static.go "
                   "(guaranteedCPUs)"),
    "integer-cpu": ("only a whole number of CPUs is pinned; a fraction runs in the shared pool",
                    "pkg/kubelet/cm/cpumanager/policy_static.go (guaranteedCPUs)"),
    "reserved-cpus": ("reservedSystemCPUs are never given to a pod",
                      "pkg/kubelet/cm/cpumanager/policy_static.go (GetAvailableCPUs)"),
    "full-pcpus-only": ("with full-pcpus-only, a request is a multiple of the CPUs per core and fits the cores "
                        "that no reserved CPU touches, else SMTAlignmentError",
                        "pkg/kubelet/cm/cpumanager/policy_static.go (Allocate, GetAvailablePhysicalCPUs)"),
    "topology": ("single-numa-node admits a pod only where one NUMA node has its CPUs free; restricted only "
                 "where the fewest NUMA nodes that can hold it do; else TopologyAffinityError",
                 "pkg/kubelet/cm/cpumanager/policy_static.go (generateCPUTopologyHints), "
                 "pkg/kubelet/cm/topologymanager/policy_single_numa_node.go, policy_restricted.go"),
}
CPU_POLICIES = ("static", "none")
TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
TOPOLOGY_SCOPES = ("container", "pod")


class KubeletRuleError(InventoryError):
    """A pod the kubelet would not pin as asked; ``rule`` is the RULES key it breaks."""

    def __init__(self, rule: str, message: str, variable: str | None):
        self.rule = rule
        super().__init__(f"{message} (the kubelet's rule: {RULES[rule][0]}; {RULES[rule][1]})", None, variable)


@dataclass(frozen=True)
class Node:
    """A Kubernetes node's online CPUs (lscpu rows) and its kubelet's CPU settings."""

    rows: tuple[dict[str, Any], ...]
    reserved: frozenset[int]
    policy: str = "static"
    full_pcpus_only: bool = False
    topology_policy: str = "single-numa-node"
    source: str = ""

    @property
    def cores(self) -> dict[tuple, list[int]]:
        """Each physical core's online CPUs."""
        found: dict[tuple, list[int]] = {}
        for row in self.rows:
            found.setdefault((row["socket"], row["core"]), []).append(row["cpu"])
        return found

    @property
    def threads_per_core(self) -> int:
        return max((len(c) for c in self.cores.values()), default=1)

    def numa_of(self, cpu: int) -> Any:
        return next(r["node"] for r in self.rows if r["cpu"] == cpu)

    def whole_cores(self, numa: Iterable[Any] | None = None) -> list[list[int]]:
        """The cores that no reserved CPU touches, on the given NUMA nodes (all when None):
        those a pod asking for whole cores can have."""
        wanted = None if numa is None else set(numa)
        return [c for c in self.cores.values() if not self.reserved & set(c)
                and (wanted is None or self.numa_of(c[0]) in wanted)]

    @property
    def numa_nodes(self) -> list[Any]:
        return sorted({r["node"] for r in self.rows}, key=lambda n: (n is None, n))


def node(values: Mapping[str, Any]) -> Node | None:
    """The Kubernetes node the k8s_* variables (torchfleet.k8s.variables') describe, or None
    when they describe none."""
    capture, count = values.get("k8s_node_lscpu"), values.get("k8s_node_cpus")
    if capture and count:
        raise InventoryError("k8s_node_lscpu and k8s_node_cpus both describe the Kubernetes node: set one",
                             None, "k8s_node_cpus")
    if capture:
        try:
            text = Path(str(capture)).expanduser().read_text()
            rows = [r for r in cpus.parse_lscpu(text) if r["online"]]
        except (OSError, ValueError) as exc:
            raise InventoryError(f"k8s_node_lscpu={capture}: {exc}; it names a file holding `lscpu -p` of a "
                                 "Kubernetes node", None, "k8s_node_lscpu") from None
        source = f"lscpu -p of {capture}"
    elif count:
        rows = counted(values)
        source = "k8s_node_cpus"
    else:
        return None
    policy, topology = str(values["k8s_cpu_manager_policy"]), str(values["k8s_topology_policy"])
    for variable, value, allowed in (("k8s_cpu_manager_policy", policy, CPU_POLICIES),
                                     ("k8s_topology_policy", topology, TOPOLOGY_POLICIES)):
        if value not in allowed:
            raise InventoryError(f"{variable}={value!r} is not one of {', '.join(allowed)}", None, variable)
    reserved = frozenset(cpus.parse_cpulist(str(values["k8s_reserved_cpus"]), None, "k8s_reserved_cpus"))
    have = {r["cpu"] for r in rows}
    if reserved - have:
        raise InventoryError(f"k8s_reserved_cpus names CPUs {cpus.format_cpulist(reserved - have)} that the "
                             f"Kubernetes node ({source}) does not have online", None, "k8s_reserved_cpus")
    if policy == "static" and not reserved:
        raise InventoryError("k8s_cpu_manager_policy=static needs k8s_reserved_cpus: the kubelet refuses the static "
                             "policy without reserved CPUs (give reservedSystemCPUs, or the CPUs a kubeReserved/"
                             "systemReserved cpu count takes: the lowest-numbered cores)", None, "k8s_reserved_cpus")
    return Node(tuple(rows), reserved, policy, bool(values["k8s_full_pcpus_only"]), topology, source)


def counted(values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """lscpu rows for a node given by its counts, numbered as Linux numbers most x86 servers:
    the first thread of every core, then the second, and so on; cores fill a socket, then the
    next, and NUMA nodes split each socket's cores evenly."""
    try:
        total, sockets, threads, numa = (int(values.get(k) or d) for k, d in (
            ("k8s_node_cpus", 0), ("k8s_node_sockets", 1), ("k8s_node_threads_per_core", 1),
            ("k8s_node_numa_nodes", values.get("k8s_node_sockets") or 1)))
    except (TypeError, ValueError):
        raise InventoryError("k8s_node_cpus, k8s_node_sockets, k8s_node_threads_per_core and k8s_node_numa_nodes "
                             "are whole numbers", None, "k8s_node_cpus") from None
    cores = total // threads if threads > 0 else 0
    if min(total, sockets, threads, numa) < 1 or total % (sockets * threads) or numa % sockets \
            or cores % numa:
        raise InventoryError(f"k8s_node_cpus={total} with k8s_node_sockets={sockets}, k8s_node_threads_per_core="
                             f"{threads} and k8s_node_numa_nodes={numa} is no machine: the CPUs are sockets x cores "
                             "x threads, and each socket's cores split evenly between its NUMA nodes",
                             None, "k8s_node_cpus")
    return [{"cpu": cpu, "core": cpu % cores, "socket": (cpu % cores) // (cores // sockets),
             "node": (cpu % cores) // (cores // numa), "online": True} for cpu in range(total)]


def pod_pinning(kube: Node, ranks: int, pinning: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each local rank's cpuset, memory nodes and threads on the Kubernetes node, for a pod
    that asks for whole cores: the cores no reserved CPU touches, within the NUMA node with
    the most of them where the topology manager runs single-numa-node (cpu_pinning_*
    settings as cpus.settings reads them)."""
    if pinning.get("cpusets"):
        raise InventoryError("cpu_pinning_cpusets names host CPUs, but on Kubernetes the kubelet picks a pod's "
                             "CPUs; set cpu_pinning_cores_per_rank instead", None, "cpu_pinning_cpusets")
    pool = kube.whole_cores()
    where = "the Kubernetes node"
    if kube.policy == "static" and kube.topology_policy == "single-numa-node":
        best = max(kube.numa_nodes, key=lambda n: (len(kube.whole_cores([n])), -kube.numa_nodes.index(n)))
        pool = kube.whole_cores([best])
        where = f"NUMA node {best} (the one with the most; single-numa-node: k8s_topology_policy)"
    wanted = int(pinning.get("cores_per_rank") or 0)
    need = (wanted or 1) * ranks
    if need > len(pool):
        raise KubeletRuleError("topology" if where != "the Kubernetes node" else "reserved-cpus",
                               f"{ranks} ranks of {wanted or 'at least 1'} cores need {need} whole cores, but {where} "
                               f"has {len(pool)} that no reserved CPU (k8s_reserved_cpus) touches ({kube.source})",
                               "cpu_pinning_cores_per_rank" if wanted else "torchfleet_procs_per_node")
    allowed = sorted(c for core in pool for c in core)
    return cpus.allocate("kubernetes node", list(kube.rows), ranks, cores_per_rank=wanted or None,
                         use_hyperthreads=bool(pinning.get("use_hyperthreads")), allowed=allowed)


def request(kube: Node, cpusets: Iterable[str]) -> int:
    """The CPUs a pod whose ranks use ``cpusets`` asks for: every CPU of each core they touch,
    so that the static policy, which fills whole cores first, gives it those very cores."""
    wanted = {c for s in cpusets for c in cpus.parse_cpulist(s)}
    unknown = wanted - {r["cpu"] for r in kube.rows}
    if unknown:
        raise InventoryError(f"the plan's cpusets name CPUs {cpus.format_cpulist(unknown)} that the Kubernetes node "
                             f"({kube.source}) lacks: they are another machine's; plan with torchfleet plan --format, "
                             "which plans the pod on the Kubernetes node", None, "k8s_node_lscpu")
    return sum(len(core) for core in kube.cores.values() if wanted & set(core))


def check_grant(kube: Node, cpu: Any) -> None:
    """Raise KubeletRuleError where the static policy cannot give an otherwise empty node's
    pod ``cpu`` exclusive CPUs (the Guaranteed QoS class is checked on the manifest)."""
    try:
        wanted = float(str(cpu))
    except ValueError:
        wanted = -1.0
    if wanted != int(wanted) or wanted < 1:
        raise KubeletRuleError("integer-cpu", f"the pod asks for cpu: {cpu}", "cpu_pinning_cores_per_rank")
    wanted_cpus = int(wanted)
    if kube.policy != "static":
        return
    available = len(kube.rows) - len(kube.reserved)
    if wanted_cpus > available:
        raise KubeletRuleError("reserved-cpus", f"the pod asks for {wanted_cpus} CPUs, but the Kubernetes node "
                               f"({kube.source}) has {available} besides its reserved CPUs "
                               f"{cpus.format_cpulist(kube.reserved)}", "k8s_reserved_cpus")
    per_core = kube.threads_per_core
    physical = sum(len(c) for c in kube.whole_cores())
    if kube.full_pcpus_only and (wanted_cpus % per_core or wanted_cpus > physical):
        raise KubeletRuleError("full-pcpus-only", f"the pod asks for {wanted_cpus} CPUs on a node of {per_core} CPUs "
                               f"per core with {physical} CPUs on cores that no reserved CPU touches",
                               "k8s_full_pcpus_only")
    if kube.topology_policy in ("single-numa-node", "restricted"):
        _check_topology(kube, wanted_cpus)


def _check_topology(kube: Node, wanted: int) -> None:
    """The CPU manager's NUMA hints for ``wanted`` CPUs on an empty node, as the topology
    manager's policy takes them: a hint is preferred when it spans as few NUMA nodes as any
    that hold that many CPUs (reserved ones counted), and exists where its free CPUs suffice."""
    numa = [n for n in kube.numa_nodes if n is not None]
    total = {n: sum(1 for r in kube.rows if r["node"] == n) for n in numa}
    free = {n: sum(len(c) for c in kube.whole_cores([n])) for n in numa}
    masks = [m for size in range(1, len(numa) + 1) for m in itertools.combinations(numa, size)]
    fewest = min((len(m) for m in masks if sum(total[n] for n in m) >= wanted), default=len(numa))
    preferred = [m for m in masks if len(m) == fewest and sum(free[n] for n in m) >= wanted]
    largest = max(free.values(), default=0)
    if kube.topology_policy == "single-numa-node" and (fewest > 1 or not preferred):
        raise KubeletRuleError("topology", f"the pod asks for {wanted} CPUs, but under single-numa-node "
                               f"(k8s_topology_policy) they must come from one NUMA node, and the Kubernetes node's "
                               f"({kube.source}) largest has {largest} free on whole cores", "cpu_pinning_cores_per_rank")
    if not preferred:
        raise KubeletRuleError("topology", f"the pod asks for {wanted} CPUs, but under restricted (k8s_topology_policy) "
                               f"no {fewest} NUMA nodes of the Kubernetes node ({kube.source}) have them free",
                               "cpu_pinning_cores_per_rank")


# --- a pod's QoS class ------------------------------------------------------------------------

_SUFFIX = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
           "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
           "P": Fraction(10**15), "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
           "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60)}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


def quantity(text: Any) -> Fraction:
    """A Kubernetes quantity (``100m``, ``2``, ``16Gi``, ``1e3``) as an exact number."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise ValueError(f"{text!r} is not a quantity")
    number = Fraction(match[1])
    return number * (Fraction(10) ** int(match[2][1:]) if match[2] else _SUFFIX[match[3] or ""])


def qos_class(containers: Iterable[Mapping[str, Any]]) -> str:
    """The pod's QoS class from each container's ``resources`` (init containers included), as
    the kubelet works it out (GetPodQOS), after the API server's defaulting of an unset
    request to its limit."""
    requests: dict[str, Fraction] = {}
    limits: dict[str, Fraction] = {}
    guaranteed = True
    for resources in containers:
        own_limits = {k: quantity(v) for k, v in ((resources or {}).get("limits") or {}).items()
                      if k in ("cpu", "memory")}
        own_requests = {k: quantity(v) for k, v in ((resources or {}).get("requests") or {}).items()
                        if k in ("cpu", "memory")}
        own_requests = {**{k: v for k, v in own_limits.items() if k not in own_requests}, **own_requests}
        for total, own in ((requests, own_requests), (limits, own_limits)):
            for k, v in own.items():
                if v > 0:
                    total[k] = total.get(k, Fraction(0)) + v
        if not {"cpu", "memory"} <= {k for k, v in own_limits.items() if v > 0}:
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"


# --- the kubelet's own command line (kubelet_cpu_manager's check) -------------------------------


def config_dir(cmdline: str | bytes) -> str | None:
    """The drop-in folder a running kubelet reads (--config-dir), from its /proc/PID/cmdline
    (NUL-separated) or a shell-quoted command line; None when it reads none."""
    if isinstance(cmdline, bytes):
        args = [a.decode(errors="replace") for a in cmdline.split(b"\0") if a]
    else:
        args = cmdline.split("\0") if "\0" in cmdline else shlex.split(cmdline)
    found = None
    for i, arg in enumerate(args):
        match = re.match(r"^--?config-dir(?:=(.*))?$", arg)
        if match:
            found = match[1] if match[1] is not None else (args[i + 1] if i + 1 < len(args) else "")
    return str(Path(found)) if found else None
