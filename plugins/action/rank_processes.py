"""rank_processes, with the run's folder made (and a changed workload sent) in the same task."""

from ansible_collections.torchfleet.cluster.plugins.plugin_utils.workload_send import WorkloadSendingAction


class ActionModule(WorkloadSendingAction):
    MODULE = "torchfleet.cluster.rank_processes"
    WORKLOAD_AT = ("run", "workload")
