"""Send the packed workload to a node and unpack it there, in one task."""

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core

DOCUMENTATION = r"""
module: workload_sync
short_description: Mirror workload_pack's tar into the workload's folder on a node
description:
  - Transfers I(src) into the task's temporary folder on the node, then runs
    workload_unpack, which replaces I(dest) whole and keeps the tar as I(keep). The copy
    module and the three handlers this replaces cost the controller a process and three
    module runs more per node.
  - Whether to send at all is the caller's: the launch compares node_probe's checksum of
    I(keep) with workload_pack's first.
options:
  src: {description: The tar on the controller., type: path, required: true}
  dest: {description: The workload's folder on the node., type: path, required: true}
  keep: {description: Where the node keeps the tar., type: path, required: true}
"""

ARGS = {"src": {"type": "path", "required": True}, "dest": {"type": "path", "required": True},
        "keep": {"type": "path", "required": True}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        shell = self._connection._shell
        try:
            if self._task.check_mode:
                result.update(changed=True)
                return result
            remote = self._transfer_file(args["src"], shell.join_path(shell.tmpdir, "workload.tar"))
            self._fixup_perms2((shell.tmpdir, remote))
            result.update(self._execute_module(
                "torchfleet.cluster.workload_unpack", task_vars=task_vars,
                module_args={"src": remote, "dest": args["dest"], "keep": args["keep"]}))
        finally:
            self._remove_tmp_path(shell.tmpdir)
        return result
