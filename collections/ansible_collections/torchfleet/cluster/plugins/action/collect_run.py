"""Bring a node's files of a run to the controller in one task: one module run finds which
of them exist (torchfleet.report.run_files says which to look for), then each is streamed
by the connection into a temporary file beside its destination and renamed over it. A
reader of runs/<run>/ never sees half a log or half a model, and a large model is never
held in memory (ansible.builtin.fetch reads through memory when it has to slurp)."""

import os
import tempfile

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import report

DOCUMENTATION = r"""
module: collect_run
short_description: Stream a node's logs, checksums, guard records, run state and model of a run to the controller
options:
  node_run_dir: {description: The run's folder on the node., type: path, required: true}
  run_dir: {description: The run's folder on the controller (made if missing)., type: path, required: true}
  spec: {description: The run's launch spec; it says which files this node holds., type: dict, required: true}
"""

ARGS = {
    "node_run_dir": {"type": "path", "required": True},
    "run_dir": {"type": "path", "required": True},
    "spec": {"type": "dict", "required": True},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        wanted = dict(report.run_files(args["spec"], task_vars["inventory_hostname"]))
        os.makedirs(args["run_dir"], exist_ok=True)
        if not wanted:
            return dict(result, changed=False, fetched=[])
        found = self._execute_module(
            module_name="ansible.builtin.find",
            module_args={"paths": [args["node_run_dir"]], "patterns": sorted(wanted), "file_type": "file"},
            task_vars=task_vars)
        if found.get("failed"):
            return dict(result, failed=True, msg=f"could not list {args['node_run_dir']}: {found.get('msg')}")
        fetched = []
        for name in sorted(os.path.basename(f["path"]) for f in found.get("files", [])):
            _fetch_atomic(self._connection, os.path.join(args["node_run_dir"], name),
                          os.path.join(args["run_dir"], wanted[name]))
            fetched.append(wanted[name])
        return dict(result, changed=bool(fetched), fetched=fetched)


def _fetch_atomic(connection, src: str, dest: str) -> None:
    fd, part = tempfile.mkstemp(prefix=".fetch-", dir=os.path.dirname(dest))
    os.close(fd)
    try:
        connection.fetch_file(src, part)
        os.chmod(part, 0o644)
        os.replace(part, dest)
    except (AnsibleConnectionFailure, OSError):
        if os.path.exists(part):
            os.unlink(part)
        raise
