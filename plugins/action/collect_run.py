"""End a run on a node and bring its files to the controller in one task: one module run
(run_outputs) asks the guards to stop the run where that is asked, ends its units once they
have had the run's own wait (torchfleet.report.run_end), then packs the node's files of the
run (torchfleet.report.run_files says which) and the rest of the ranks' out folder, within
launch_collect_out_max_mb, into one archive (torchfleet.outputs says which files are
torchfleet's own). What it needs of the run's spec comes as the node's own part
(torchfleet.outputs.collect_plan), computed once for the play. An archive up to INLINE_MAX
comes back in the result; a larger one is streamed by the connection into a temporary file
and then deleted on the node. Each file is renamed into place whole, the out folder renamed
over runs/<run>/out/<host>: a reader of runs/<run>/ never sees half a log, half a model or
half an out folder.

The node's part runs as the script that the run's folder carries (module_utils/run_end.py),
its options on stdin, where the folder has it and the connection pipelines: at 48 nodes on 2
cores, the module wrapper's own imports made most of a stop's time. Elsewhere (an older run's
folder, a node without the run) the module run_outputs runs the same code."""

import base64
import os
import posixpath
import shlex
import tempfile

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core, node_script
from torchfleet import inputs, outputs
from torchfleet.errors import InventoryError

display = Display()

ARGS = {
    "node_run_dir": {"type": "path", "required": True},
    "run_dir": {"type": "path", "required": True},
    "plan": {"type": "dict", "required": True},
    "out_max_mb": {"type": "int", "default": 1024},
    "end_units": {"type": "bool", "default": False},
    "stop_reason": {"type": "str"},
}

# A module's result passes through the connection and JSON whole: logs and metrics fit in
# it, a model or checkpoints come back as a file.
INLINE_MAX = 4 << 20


class ActionModule(ActionBase):
    # Nothing is sent: the node's temporary folder would cost two more commands per node.
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        host, plan, node_run_dir = task_vars["inventory_hostname"], args["plan"], args["node_run_dir"]
        bad = inputs.out_of_range([{"name": outputs.VARIABLE, "value": args["out_max_mb"], "min": 0,
                                  "max": outputs.MAX_MB, "why": " (0: bring no out folder back)"}])
        if bad:
            return core.fail_input(result, InventoryError(bad[0]["message"], host, outputs.VARIABLE))
        wanted = plan["wanted"]
        out_dir = os.path.join(args["run_dir"], "out", host)
        os.makedirs(os.path.dirname(out_dir), exist_ok=True)
        module_args = {"run_dir": node_run_dir, "wanted": sorted(wanted), "own": plan["own"],
                       "max_bytes": args["out_max_mb"] * outputs.MB, "inline_max": INLINE_MAX}
        if args["end_units"]:
            module_args.update(units=plan["end"]["units"],
                               remove=[posixpath.join(node_run_dir, name) for name in plan["end"]["remove"]])
        if args["stop_reason"] is not None:
            module_args["stop_reason"] = args["stop_reason"]
        found = node_script.run(self, task_vars, node_run_dir, vocab.END_SOURCE, module_args) or self._execute_module(
            module_name="torchfleet.cluster.run_outputs", module_args=module_args, task_vars=task_vars)
        if found.get("failed"):
            return dict(result, failed=True, msg=f"could not end or read {node_run_dir}: {found.get('msg')}",
                        containers=found.get("containers") or [])
        fetched, placed_out = [], None
        if found["archive_b64"] or found["archive"]:
            fd, local = tempfile.mkstemp(prefix=f".{host}.", suffix=".tar.gz", dir=os.path.dirname(out_dir))
            try:
                if found["archive_b64"]:
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(base64.b64decode(found["archive_b64"]))
                else:
                    os.close(fd)
                    try:
                        self._connection.fetch_file(found["archive"], local)
                    finally:
                        self._low_level_execute_command(f"rm -f {shlex.quote(found['archive'])}")
                fetched, placed_out = outputs.unpack(local, args["run_dir"], wanted, out_dir)
            finally:
                os.unlink(local)
        out = outputs.record(host, plan, node_run_dir, out_dir, found, args["out_max_mb"])
        if out["message"]:
            display.warning(out["message"])
        # Changed where the node changed (its units ended), or something new came back.
        return dict(result, changed=bool(found["changed"] or fetched or placed_out), fetched=fetched, out=out,
                    containers=found["containers"])
