"""Write a run's summary.json, print the per-rank table, and fail naming the culprit."""

from pathlib import Path

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import run_vocab as vocab
from torchfleet import modes, report

display = Display()

ARGS = {
    "run_id": {"type": "str", "required": True},
    "run_dir": {"type": "path", "required": True},
    "spec": {"type": "dict", "required": True},
    "finals": {"type": "list", "elements": "dict", "required": True},
    "reason": {"type": "str"},
    "abort": {"type": "dict"},
    "master_listened": {"type": "bool", "default": True},
    "outputs": {"type": "list", "elements": "dict", "default": []},
    "lost": {"type": "list", "elements": "str", "default": []},
    # A stop asked for: a run stopped by it is what was asked, not a failure of the task.
    "stop_asked": {"type": "bool", "default": False},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        finals, reason = args["finals"], args["reason"]
        guards, abort = report.guard_records(args["run_dir"])
        abort = args["abort"] or abort
        finals = report.apply_guards(finals, guards)
        # Where a mode's launcher ran several ranks, its own output says how each ended.
        mode = modes.get(args["spec"]["mode"])
        finals, reason = mode.finals(args["spec"], Path(args["run_dir"]), finals, reason)
        # A node the controller lost: its ranks' ends as the cluster's supervision recorded them.
        finals = report.cluster_finals(args["spec"], finals, report.job_record(args["run_dir"]), args["lost"])
        summary = report.summarize(args["run_id"], args["spec"], finals, args["run_dir"],
                                   args["master_listened"], abort, args["lost"])
        # Each rank's row holds its own part; this is the rest (units, phases, warnings).
        summary["spec"] = {k: v for k, v in args["spec"].items() if k != "ranks"}
        summary["outputs"] = {o["host"]: o for o in args["outputs"]}
        added = mode.summary(Path(args["run_dir"]))
        note = "\n".join(n for n in (summary.get("note"), added.pop("note", None)) if n)
        summary.update(added, note=note or None)
        path = report.write_summary(summary, args["run_dir"])
        plot = report.plot_losses(summary, args["run_dir"])
        table = report.format_table(summary)
        display.display("\n".join([f"torchfleet run {args['run_id']}  ({path})", *table]))
        if summary["ok"] and report.result_line(summary):
            display.display(report.result_line(summary))
        stopped_as_asked = args["stop_asked"] and (abort or {}).get("kind") == vocab.AbortKind.STOPPED.value
        if not summary["ok"] and not stopped_as_asked:
            # Keep the failure short: the message, and where the rest is.
            result.update(failed=True, msg=report.failure_message(summary, reason),
                          failed_rank=summary["failed_rank"]["rank"] if summary["failed_rank"] else None,
                          summary_file=str(path), abort=abort,
                          torchfleet_error={"kind": (abort or {}).get("kind", vocab.AbortKind.RANK_FAILED.value),
                                            "host": (abort or {}).get("host"), "variable": None})
            return result
        if summary["note"]:
            display.warning(summary["note"])
        result.update(changed=False, summary=summary, table=table, summary_file=str(path), plot=plot)
        return result
