"""The action behind run_state and rank_processes: a start's module call that also brings
the job's workload, when it changed, so that sending it costs no task of its own (every
task costs the controller a process per node), and the run's store key as a secret file."""

import base64
import copy
import os

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core

# What the task gives: the tar on the controller, where it goes on the node.
WORKLOAD = {
    "archive": {"type": "path", "required": True},
    "dest": {"type": "path", "required": True},
    "keep": {"type": "path", "required": True},
    "inline_max": {"type": "int", "default": 1 << 20},
}


class WorkloadSendingAction(ActionBase):
    """Runs ``MODULE`` with the task's arguments. The workload at ``WORKLOAD_AT`` (a path of
    keys into them) goes along: up to ``inline_max`` bytes as base64 inside the call (one
    SSH round trip), a larger tar first into the task's temporary folder on the node. With
    ``role`` (a role's folder), the host's variables are first checked against that role's
    argument spec (core.check_role_arguments), and nothing runs on the node if they fail."""

    TRANSFERS_FILES = False
    MODULE = ""
    WORKLOAD_AT: tuple = ("workload",)

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = copy.deepcopy(dict(self._task.args))
        role = args.pop("role", None)
        if role:
            failed = core.check_role_arguments(self, task_vars, role)
            if failed:
                return dict(result, **failed)
        holder = args
        for key in self.WORKLOAD_AT[:-1]:
            holder = holder.get(key) or {}
        workload = holder.pop(self.WORKLOAD_AT[-1], None) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and vocab.STORE_KEY in (holder.get("files") or {}):
            # The run's store key (launch_spec makes it among the folder's files) goes as a secret
            # file, in the module's no_log option: a module logs its other options on the node.
            files = dict(holder["files"])
            args["secret_files"] = dict(args.get("secret_files") or {}, **{vocab.STORE_KEY: files.pop(vocab.STORE_KEY)})
            holder["files"] = files
        made_tmp = False
        try:
            if workload:
                checked = ArgumentSpecValidator(WORKLOAD).validate(workload)
                if checked.error_messages:
                    return dict(result, failed=True,
                                msg=f"{self._task.action}: {'.'.join(self.WORKLOAD_AT)}: " + "; ".join(checked.error_messages))
                workload = checked.validated_parameters
                sent = {"dest": workload["dest"], "keep": workload["keep"]}
                if self._task.check_mode:
                    sent["data"] = ""
                elif os.path.getsize(workload["archive"]) <= workload["inline_max"]:
                    with open(workload["archive"], "rb") as fh:
                        sent["data"] = base64.b64encode(fh.read()).decode()
                else:
                    shell = self._connection._shell
                    self._make_tmp_path()
                    made_tmp = True
                    sent["src"] = self._transfer_file(workload["archive"], shell.join_path(shell.tmpdir, "workload.tar"))
                    self._fixup_perms2((shell.tmpdir, sent["src"]))
                holder[self.WORKLOAD_AT[-1]] = sent
            answer = None if workload else self._answer_on_node(args, task_vars)
            result.update(answer or self._execute_module(self.MODULE, module_args=args, task_vars=task_vars))
        finally:
            if made_tmp:
                self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _answer_on_node(self, args, task_vars):  # pylint: disable=unused-argument
        """An answer in place of ``MODULE``'s from a script that the run's folder carries
        (plugin_utils.node_script), or None: the module runs."""
        return None
