"""Bring a node's files of a run to the controller in one task: one module run finds which
of them exist (torchfleet.report.run_files says which to look for) and packs the rest of
the ranks' out folder, within launch_collect_out_max_mb, into one archive in the task's
temporary folder (torchfleet.outputs says which files are torchfleet's own). Each file,
then the archive, is streamed by the connection into a temporary file beside its
destination and renamed over it; the archive is unpacked into a temporary folder that is
renamed over runs/<run>/out/<host>. A reader of runs/<run>/ never sees half a log, half a
model or half an out folder, and nothing large is held in memory (ansible.builtin.fetch
reads through memory when it has to slurp)."""

import os
import tempfile

from ansible.errors import AnsibleConnectionFailure
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import inputs, outputs, report
from torchfleet.errors import InventoryError

display = Display()

ARGS = {
    "node_run_dir": {"type": "path", "required": True},
    "run_dir": {"type": "path", "required": True},
    "spec": {"type": "dict", "required": True},
    "out_max_mb": {"type": "int", "default": 1024},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        host, run_spec, node_run_dir = task_vars["inventory_hostname"], args["spec"], args["node_run_dir"]
        bad = inputs.out_of_range([{"name": outputs.VARIABLE, "value": args["out_max_mb"], "min": 0,
                                  "max": outputs.MAX_MB, "why": " (0: bring no out folder back)"}])
        if bad:
            return core.fail_input(result, InventoryError(bad[0]["message"], host, outputs.VARIABLE))
        wanted = dict(report.run_files(run_spec, host))
        out_dir = os.path.join(args["run_dir"], "out", host)
        os.makedirs(os.path.dirname(out_dir), exist_ok=True)
        shell = self._connection._shell
        found = self._execute_module(
            module_name="torchfleet.cluster.run_outputs",
            module_args={"run_dir": node_run_dir, "wanted": sorted(wanted), "own": outputs.own_files(run_spec, host),
                         "max_bytes": args["out_max_mb"] * outputs.MB,
                         "archive": shell.join_path(shell.tmpdir, "out.tar.gz")},
            task_vars=task_vars)
        if found.get("failed"):
            return dict(result, failed=True, msg=f"could not read {node_run_dir}: {found.get('msg')}")
        fetched = []
        for name in found["found"]:
            _fetch_atomic(self._connection, os.path.join(node_run_dir, name), os.path.join(args["run_dir"], wanted[name]))
            fetched.append(wanted[name])
        if found["archive"]:
            archive = os.path.join(os.path.dirname(out_dir), f".{host}.tar.gz")
            _fetch_atomic(self._connection, found["archive"], archive)
            try:
                outputs.place(archive, out_dir)
            finally:
                os.unlink(archive)
        out = outputs.record(host, run_spec, node_run_dir, out_dir, found, args["out_max_mb"])
        if out["message"]:
            display.warning(out["message"])
        return dict(result, changed=bool(fetched or found["archive"]), fetched=fetched, out=out)


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
