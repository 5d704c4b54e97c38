"""Fetch a file from a node atomically: streamed by the connection into a temporary file
beside the destination, then renamed over it. A reader of runs/<run>/ never sees half a
log or half a model, and a large model is never held in memory (ansible.builtin.fetch
reads through memory when it has to slurp)."""

import os
import tempfile

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core

DOCUMENTATION = r"""
module: fetch_atomic
short_description: Stream a node's file to the controller, replacing the destination whole
options:
  src: {description: The file on the node., type: path, required: true}
  dest: {description: The file on the controller., type: path, required: true}
  fail_on_missing: {description: Fail when the node has no such file., type: bool, default: false}
"""

ARGS = {
    "src": {"type": "path", "required": True},
    "dest": {"type": "path", "required": True},
    "fail_on_missing": {"type": "bool", "default": False},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        stat = self._execute_module(module_name="ansible.builtin.stat",
                                    module_args={"path": args["src"], "get_checksum": False}, task_vars=task_vars)
        if stat.get("failed") or not stat.get("stat", {}).get("exists"):
            if args["fail_on_missing"]:
                return dict(result, failed=True, msg=f"{args['src']} does not exist on the node")
            return dict(result, changed=False, missing=True)
        dest = args["dest"]
        os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
        fd, part = tempfile.mkstemp(prefix=".fetch-", dir=os.path.dirname(dest) or ".")
        os.close(fd)
        try:
            self._connection.fetch_file(args["src"], part)
            os.chmod(part, 0o644)
            os.replace(part, dest)
        except (AnsibleConnectionFailure, OSError):
            if os.path.exists(part):
                os.unlink(part)
            raise
        return dict(result, changed=True, dest=dest, size=stat["stat"].get("size"))
