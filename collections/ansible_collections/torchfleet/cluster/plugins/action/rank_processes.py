"""rank_processes, with the run's folder made (and a changed workload sent) in the same task."""

from ansible_collections.torchfleet.cluster.plugins.plugin_utils.workload_send import WorkloadSendingAction

DOCUMENTATION = r"""
module: rank_processes
short_description: Bare-process ranks (see the rank_processes module), started in their run's new folder
description:
  - Passes every option to the rank_processes module. With I(run.workload), the tar
    workload_pack made on the controller goes along as run_state's action sends it
    (plugin_utils.workload_send), so a process-mode node's whole start is one task.
options:
  role:
    description: The launch role's folder; the host's variables are checked against its argument spec first, as run_state's I(role).
    type: path
  run:
    description: The run's folder to make first (run_state's state=present options).
    type: dict
    suboptions:
      workload:
        description: The workload to install first (C(archive), C(dest), C(keep), C(inline_max), as run_state's).
        type: dict
"""


class ActionModule(WorkloadSendingAction):
    MODULE = "torchfleet.cluster.rank_processes"
    WORKLOAD_AT = ("run", "workload")
