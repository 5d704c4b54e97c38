"""run_state, with the job's workload sent in the same task when a start asks for it."""

import base64
import os

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

DOCUMENTATION = r"""
module: run_state
short_description: A node's runs (see the run_state module), and the workload a start sends
description:
  - Passes every option to the run_state module. With I(workload) (state=present), the
    tar workload_pack made on the controller goes along: up to I(inline_max) bytes inside
    the module's own call (one SSH round trip), a larger one first into the task's
    temporary folder on the node. The module then replaces the workload folder whole.
  - One task where sending and unpacking took one of their own: every task costs the
    controller a process per node.
options:
  workload:
    description: The workload to install before the run's folder is made.
    type: dict
    suboptions:
      archive: {description: The tar on the controller., type: path, required: true}
      dest: {description: The workload's folder on the node., type: path, required: true}
      keep: {description: Where the node keeps the tar (its checksum decides the next send)., type: path, required: true}
      inline_max: {description: The largest tar sent inside the call., type: int, default: 1048576}
"""

WORKLOAD = {
    "archive": {"type": "path", "required": True},
    "dest": {"type": "path", "required": True},
    "keep": {"type": "path", "required": True},
    "inline_max": {"type": "int", "default": 1 << 20},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        workload = args.pop("workload", None)
        made_tmp = False
        try:
            if workload and not self._task.check_mode:
                checked = ArgumentSpecValidator(WORKLOAD).validate(workload)
                if checked.error_messages:
                    return dict(result, failed=True, msg="run_state: workload: " + "; ".join(checked.error_messages))
                workload = checked.validated_parameters
                sent = {"dest": workload["dest"], "keep": workload["keep"]}
                if os.path.getsize(workload["archive"]) <= workload["inline_max"]:
                    with open(workload["archive"], "rb") as fh:
                        sent["data"] = base64.b64encode(fh.read()).decode()
                else:
                    shell = self._connection._shell
                    self._make_tmp_path()
                    made_tmp = True
                    sent["src"] = self._transfer_file(workload["archive"], shell.join_path(shell.tmpdir, "workload.tar"))
                    self._fixup_perms2((shell.tmpdir, sent["src"]))
                args["workload"] = sent
            elif workload:
                args["workload"] = {"dest": workload.get("dest"), "keep": workload.get("keep"), "data": ""}
            result.update(self._execute_module("torchfleet.cluster.run_state", module_args=args, task_vars=task_vars))
        finally:
            if made_tmp:
                self._remove_tmp_path(self._connection._shell.tmpdir)
        return result
