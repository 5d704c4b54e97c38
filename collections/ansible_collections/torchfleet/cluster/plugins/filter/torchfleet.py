"""Filters that turn facts into cluster addresses, Gloo interfaces and rank environments."""

from ansible.errors import AnsibleFilterError

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core  # noqa: F401
from torchfleet import cpus, netif, ranks, redact
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
    default = host_vars.get("ansible_default_ipv4") or {}
    return ranks.cluster_address(
        host,
        explicit=host_vars.get(ranks.ADDRESS_VAR),
        network=host_vars.get(ranks.NETWORK_VAR),
        ansible_host=host_vars.get("ansible_host"),
        ipv4_addresses=host_vars.get("ansible_all_ipv4_addresses") or [],
        default_ipv4=default.get("address"),
    )["address"]


def gloo_interface(master_addr, ip_addr, ip_route, host):
    """The interface a node routes MASTER_ADDR through (``ip -j`` output as input)."""
    return netif.gloo_interface(host, master_addr, ip_addr, ip_route)


def address_network(address, ip_addr, host):
    """The CIDR of the node's network that holds ``address`` (``ip -j addr`` output as input)."""
    return netif.address_network(host, address, ip_addr)


def rank_env(row, table, interface, omp_threads, extra=None):
    """The environment of one rank, all values strings."""
    return ranks.rank_env(row, table, interface, omp_threads, extra)


def split_env(env, secret=None):
    """The rank environment's open part, secret part and what may be shown (torchfleet.redact)."""
    return redact.split_env(env, secret)


def check_env(env, secret=None, host=None):
    """True, or an error naming the host and the variable; names only, never a value."""
    redact.check_env(env, secret, host)
    return True


def redact_url(text):
    """``text`` with the credentials of every URL in it replaced by ***."""
    return redact.redact(text)


def cpu_plan(topology, host, ranks_on_node, cores_per_rank=0, use_hyperthreads=False, reserved="", cpusets=None):
    """Each local rank's cpuset, cpuset_mems and OMP_NUM_THREADS, from cpu_topology's result."""
    table = cpus.parse_lscpu(topology["lscpu"])
    if cpusets:
        return cpus.check_explicit(host, table, list(cpusets), int(ranks_on_node))
    return cpus.allocate(
        host,
        table,
        int(ranks_on_node),
        cores_per_rank=int(cores_per_rank) or None,
        use_hyperthreads=bool(use_hyperthreads),
        reserved=reserved,
        allowed=topology.get("allowed"),
    )


class FilterModule:
    def filters(self):
        return {
            "cluster_address": _wrap(cluster_address),
            "gloo_interface": _wrap(gloo_interface),
            "address_network": _wrap(address_network),
            "rank_env": _wrap(rank_env),
            "cpu_plan": _wrap(cpu_plan),
            "split_env": _wrap(split_env),
            "check_env": _wrap(check_env),
            "redact_url": redact_url,
        }
