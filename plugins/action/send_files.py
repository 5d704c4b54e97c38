"""Send files from a controller folder to a node folder in one task: each is streamed into
the task's temporary folder on the node, then one module run moves them all into place
(the send_files module). ansible.builtin.copy in a loop costs a task run per file and node,
and hashes each file on both sides again, where the caller has compared checksums already."""

import os

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.modules.send_files import OPTIONS
from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core

ARGS = {"src_dir": {"type": "path", "required": True}, **OPTIONS}


class ActionModule(ActionBase):
    TRANSFERS_FILES = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        bad = [n for n in args["files"] if not n or os.path.basename(n) != n or n in (".", "..")]
        if bad:
            return dict(result, failed=True, msg=f"files must be plain names in src_dir, not {bad}")
        missing = [n for n in args["files"] if not os.path.isfile(os.path.join(args["src_dir"], n))]
        if missing:
            return dict(result, failed=True, msg=f"{args['src_dir']} on the controller has no {', '.join(missing)}")
        if not args["files"] or self._task.check_mode:
            return dict(result, changed=bool(args["files"]), sent=args["files"])
        options = {k: args[k] for k in OPTIONS}
        result.update(core.run_with_files(
            self, task_vars, {n: os.path.join(args["src_dir"], n) for n in args["files"]},
            "torchfleet.cluster.send_files", lambda staged: dict(options, staged_dir=staged)))
        return result
