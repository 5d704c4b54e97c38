"""Filters that turn facts into cluster addresses, Gloo interfaces, rank environments and overlay addresses."""

from ansible.errors import AnsibleFilterError

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core  # noqa: F401
from torchfleet import cpus, netif, overlay, ranks, redact
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
    limits = {"allowed": topology.get("allowed"), "memory_nodes": topology.get("memory_nodes"),
              "mems_allowed": topology.get("mems_allowed")}
    if cpusets:
        return cpus.check_explicit(host, table, list(cpusets), int(ranks_on_node), reserved=reserved, **limits)
    # 0 in the role splits the cores evenly; any other count is checked by allocate().
    count = int(cores_per_rank)
    return cpus.allocate(host, table, int(ranks_on_node), cores_per_rank=count if count else None,
                         use_hyperthreads=bool(use_hyperthreads), reserved=reserved, **limits)


def overlay_allocate(network, hosts, explicit=None, previous=None):
    """The overlay's state ``{network, addresses}``: explicit addresses, then kept ones, then new ones."""
    return overlay.allocate(network, hosts, explicit, previous)


def overlay_check_endpoints(network, endpoints):
    """The overlay network, once no node's endpoint (cluster address) is found inside it."""
    return overlay.check_endpoints(network, endpoints)


def overlay_state(text):
    """The overlay state file's content (empty when there is none yet)."""
    return overlay.load_state(text)


def overlay_interface_address(ip_addr, interface, host):
    """The node's overlay address from ``ip -j addr show``; fails naming the node when the overlay is down."""
    return overlay.interface_address(host, interface, ip_addr)


def overlay_unreachable(results, max_age):
    """The node pairs that cannot talk over the overlay, from every node's overlay_probe result."""
    return overlay.unreachable_pairs(results, int(max_age))


class FilterModule:
    def filters(self):
        return {
            "cluster_address": _wrap(cluster_address),
            "gloo_interface": _wrap(gloo_interface),
            "address_network": _wrap(address_network),
            "rank_env": _wrap(rank_env),
            "cpu_plan": _wrap(cpu_plan),
            "overlay_allocate": _wrap(overlay_allocate),
            "overlay_check_endpoints": _wrap(overlay_check_endpoints),
            "overlay_state": _wrap(overlay_state),
            "overlay_interface_address": _wrap(overlay_interface_address),
            "overlay_unreachable": _wrap(overlay_unreachable),
            "split_env": _wrap(split_env),
            "check_env": _wrap(check_env),
            "redact_url": redact_url,
        }
