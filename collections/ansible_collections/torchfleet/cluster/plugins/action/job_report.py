"""Write a run's summary.json, print the per-rank table, and fail naming the culprit."""

from pathlib import Path

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet.vocab import run_vocab as vocab
from torchfleet import report

display = Display()

ARGS = {
    "run_id": {"type": "str", "required": True},
    "run_dir": {"type": "path", "required": True},
    "spec": {"type": "dict", "required": True},
    "finals": {"type": "list", "elements": "dict", "required": True},
    "reason": {"type": "str"},
    "abort": {"type": "dict"},
    "mpirun_log": {"type": "path"},
    "torchrun": {"type": "bool", "default": False},
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
        if args["mpirun_log"]:
            finals, reason = self._split_mpirun(args, finals, reason)
        elif args["torchrun"]:
            finals = self._split_torchrun(args, finals)
        # A node the controller lost: its ranks' ends as the cluster's supervision recorded them.
        finals = report.cluster_finals(args["spec"], finals, report.job_record(args["run_dir"]), args["lost"])
        summary = report.summarize(args["run_id"], args["spec"], finals, args["run_dir"],
                                   args["master_listened"], abort, args["lost"])
        # Each rank's row holds its own part; this is the rest (units, phases, warnings).
        summary["spec"] = {k: v for k, v in args["spec"].items() if k != "ranks"}
        summary["outputs"] = {o["host"]: o for o in args["outputs"]}
        path = report.write_summary(summary, args["run_dir"])
        plot = report.plot_losses(summary, args["run_dir"])
        table = report.format_table(summary)
        display.display("\n".join([f"torchfleet run {args['run_id']}  ({path})", *table]))
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

    @staticmethod
    def _split_mpirun(args, finals, reason):
        """mpirun mode: rank logs and states come from mpirun's tagged output and exit."""
        path = Path(args["mpirun_log"])
        log = path.read_text(errors="replace") if path.is_file() else ""
        world_size = int(args["spec"]["world_size"])
        for rank, text in report.split_mpirun_log(log, world_size).items():
            (Path(args["run_dir"]) / f"rank-{rank}.log").write_text(text)
        launcher = next((f for f in finals if f.get("role") == "mpirun"), {})
        if reason and log:
            reason = f"{reason}\n--- last lines of mpirun ---\n{report.tail(log)}"
        return report.mpirun_finals(launcher, log, world_size), reason

    @staticmethod
    def _split_torchrun(args, finals):
        """torchrun mode: each node's torchrun output holds its ranks' lines and failures."""
        run_dir = Path(args["run_dir"])
        by_first_rank = {int(f["rank"]): f for f in finals if f.get("role") == "torchrun"}
        per_rank = []
        hosts = dict.fromkeys(r["host"] for r in args["spec"]["ranks"])
        for host in hosts:
            ranks = [r["rank"] for r in sorted(args["spec"]["ranks"], key=lambda r: r["rank"]) if r["host"] == host]
            path = run_dir / f"torchrun-{host}.log"
            log = path.read_text(errors="replace") if path.is_file() else ""
            for local, text in report.split_torchrun_log(log, len(ranks)).items():
                (run_dir / f"rank-{ranks[local]}.log").write_text(text)
            per_rank += report.torchrun_finals(by_first_rank.get(ranks[0], {}), log, ranks)
        return per_rank
