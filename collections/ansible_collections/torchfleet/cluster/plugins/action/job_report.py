"""Write a run's summary.json, print the per-rank table, and fail naming the culprit."""

from pathlib import Path

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core  # noqa: F401
from torchfleet import report

display = Display()

DOCUMENTATION = r"""
module: job_report
short_description: Summarise a finished run on the controller
options:
  run_id:
    description: The run's id.
    type: str
    required: true
  run_dir:
    description: The run's folder on the controller, holding the fetched logs.
    type: path
    required: true
  spec:
    description: The launch spec (launch_spec); each rank's part is recorded in summary.json.
    type: dict
    required: true
  finals:
    description: Each rank container's final state, as rank_containers reported it.
    type: list
    elements: dict
    required: true
  reason:
    description: Why the run was stopped, when no guard said (a start that failed).
    type: str
  abort:
    description: Why the guards stopped the run (kind, host, reason), as the controller saw it; else job.json's.
    type: dict
  mpirun_log:
    description: mpirun's tagged output on the controller (mpirun mode); split into rank logs.
    type: path
  torchrun:
    description: torchrun mode; each node's torchrun-<host>.log is split into rank logs.
    type: bool
    default: false
  master_listened:
    description: Whether MASTER_PORT opened; when not, the other ranks were never started.
    type: bool
    default: true
"""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        finals, reason = args["finals"], args.get("reason")
        guards, abort = report.guard_records(args["run_dir"])
        abort = args.get("abort") or abort
        finals = report.apply_guards(finals, guards)
        if args.get("mpirun_log"):
            finals, reason = self._split_mpirun(args, finals, reason)
        elif args.get("torchrun"):
            finals = self._split_torchrun(args, finals)
        summary = report.summarize(args["run_id"], args["spec"], finals, args["run_dir"],
                                   bool(args.get("master_listened", True)), abort)
        # Each rank's row holds its own part; this is the rest (units, phases, warnings).
        summary["spec"] = {k: v for k, v in args["spec"].items() if k != "ranks"}
        path = report.write_summary(summary, args["run_dir"])
        plot = report.plot_losses(summary, args["run_dir"])
        table = report.format_table(summary)
        display.display("\n".join([f"torchfleet run {args['run_id']}  ({path})", *table]))
        if not summary["ok"]:
            # Keep the failure short: the message, and where the rest is.
            result.update(failed=True, msg=report.failure_message(summary, reason),
                          failed_rank=summary["failed_rank"]["rank"] if summary["failed_rank"] else None,
                          summary_file=str(path), abort=abort,
                          torchfleet_error={"kind": (abort or {}).get("kind", "rank_failed"),
                                            "host": (abort or {}).get("host"), "variable": None})
            return result
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
