"""run_state, with the job's workload sent in the same task when a start asks for it."""

from ansible_collections.torchfleet.cluster.plugins.plugin_utils.workload_send import WorkloadSendingAction

DOCUMENTATION = r"""
module: run_state
short_description: A node's runs (see the run_state module), and the workload a start sends
description:
  - Passes every option to the run_state module. With I(workload) (state=present), the
    tar workload_pack made on the controller goes along (plugin_utils.workload_send); up to
    C(inline_max) bytes inside the module's own call, a larger one ahead of it into the
    task's temporary folder. The module replaces the workload folder whole.
options:
  role:
    description:
      - The launch role's folder. The host's variables are checked against its argument spec
        first, as Ansible's own check would; the playbooks that pass it (run.yml, down.yml)
        include the role with C(rolespec_validate=false), since that check is a task per node.
    type: path
  workload:
    description: The workload to install before the run's folder is made.
    type: dict
    suboptions:
      archive: {description: The tar on the controller., type: path, required: true}
      dest: {description: The workload's folder on the node., type: path, required: true}
      keep: {description: Where the node keeps the tar (its checksum decides the next send)., type: path, required: true}
      inline_max: {description: The largest tar sent inside the call., type: int, default: 1048576}
"""


class ActionModule(WorkloadSendingAction):
    MODULE = "torchfleet.cluster.run_state"
