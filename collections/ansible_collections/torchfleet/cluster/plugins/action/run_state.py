"""run_state, with the job's workload sent in the same task when a start asks for it."""

from ansible_collections.torchfleet.cluster.plugins.plugin_utils.workload_send import WorkloadSendingAction


class ActionModule(WorkloadSendingAction):
    MODULE = "torchfleet.cluster.run_state"
