"""The `torchfleet` command: plan, up, launch, logs, down, and the local docker-host cluster.

Exit codes: 0 done; 1 the job ran and a rank failed; 2 bad input (inventory, variables,
usage); 3 a task failed on a node or a node was unreachable; 4 anything else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from torchfleet import api
from torchfleet.errors import InventoryError, JobFailed, TaskFailed, TorchfleetError

# Piped output (CI logs, files) gets wide tables rather than truncated cells.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
EXIT_OK, EXIT_JOB_FAILED, EXIT_BAD_INPUT, EXIT_TASK_FAILED, EXIT_OTHER = 0, 1, 2, 3, 4


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        payload = args.func(args)
        code = EXIT_OK
    except JobFailed as exc:
        payload, code = _error(exc, run=exc.run.to_dict() if exc.run else None), EXIT_JOB_FAILED
        if not args.json and exc.run:
            _print_run(exc.run)
    except InventoryError as exc:
        payload, code = _error(exc, variable=exc.variable), EXIT_BAD_INPUT
    except TaskFailed as exc:
        payload, code = _error(exc), EXIT_TASK_FAILED
    except TorchfleetError as exc:
        payload, code = _error(exc), EXIT_OTHER
    if args.json:
        print(json.dumps(payload, indent=2, default=str))
    elif code != EXIT_OK:
        err = payload["error"]
        where = ", ".join(f"{k} {err[k]}" for k in ("host", "variable", "task") if err.get(k))
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"[bold red]error[/] ({err['type']}{': ' + escape(where) if where else ''})\n{escape(err['message'])}")
    return code


def _error(exc: TorchfleetError, **more: Any) -> dict[str, Any]:
    error = {"type": type(exc).__name__, "message": exc.message, "host": exc.host, "task": exc.task, **more}
    run = error.pop("run", None)
    return {"ok": False, "error": error, **({"run": run} if run else {})}


# --- commands ----------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    plan = _cluster(args).plan(_job(args))
    if not args.json:
        out.print(f"[bold]MASTER_ADDR:MASTER_PORT[/] {plan.master}   world size {plan.world_size} on "
                  f"{plan.num_nodes} node(s)   mode {plan.launch_mode}   transport {plan.transport}   "
                  f"image {escape(str(plan.image or '-'))}")
        table = Table("rank", "host", "address", "interface", "local", "cpuset", "mems", "threads", "runs as",
                      "runtime")
        for r in plan.ranks:
            table.add_row(str(r.rank), r.host, r.address, r.interface, f"{r.local_rank}/{r.local_world_size}",
                          r.cpuset or "unpinned", r.cpuset_mems or "-", str(r.threads), r.runner,
                          "ready" if r.runtime_ready else "[yellow]missing (run up)[/]")
        out.print(table)
        if args.env:
            for r in plan.ranks:
                out.print(f"[bold]rank {r.rank}[/] argv {escape(' '.join(r.argv))}   cwd {escape(r.workdir)}")
                out.print("  " + " ".join(f"{k}={escape(v)}" for k, v in r.env.items()))
        else:
            out.print("Each rank's command and environment: torchfleet plan --env (or --json). Nothing was changed.")
        for w in plan.warnings:
            Console(stderr=True, highlight=False, soft_wrap=True).print(f"[yellow]warning[/] {escape(w['message'])}")
    return {"ok": True, "plan": plan.to_dict()}


def cmd_up(args: argparse.Namespace) -> dict[str, Any]:
    return _hosts_result(args, _cluster(args).provision())


def cmd_launch(args: argparse.Namespace) -> dict[str, Any]:
    run = _cluster(args).launch(_job(args))
    if not args.json:
        _print_run(run)
    return {"ok": True, "run": run.to_dict()}


def cmd_logs(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _cluster(args)
    run = cluster.report(args.run_id)
    logs = cluster.logs(run.run_id, args.rank)
    if args.tail:
        logs = {rank: "\n".join(text.splitlines()[-args.tail:]) for rank, text in logs.items()}
    if not args.json:
        hosts = {r.rank: r.host for r in run.ranks}
        for rank, text in logs.items():
            out.print(f"[bold]── rank {rank} on {hosts[rank]} ──[/]")
            out.print(escape(text.rstrip()) or "(empty log)")
    return {"ok": True, "run_id": run.run_id,
            "logs": {str(r.rank): {"host": r.host, "path": r.log_path, "text": logs[r.rank]}
                     for r in run.ranks if r.rank in logs}}


def cmd_down(args: argparse.Namespace) -> dict[str, Any]:
    return _hosts_result(args, _cluster(args).down())


def cmd_local_up(args: argparse.Namespace) -> dict[str, Any]:
    cluster, result = api.local_up(args.nodes, name=args.name, subnet=args.subnet,
                                   inventory_dir=args.inventory_dir, progress=not args.quiet)
    if not args.json:
        out.print(f"{args.nodes} docker host(s) up; inventory {cluster.inventory[0]}. Next: torchfleet up")
    return {"ok": True, "inventory": str(cluster.inventory[0]), "result": result.to_dict()}


def cmd_local_down(args: argparse.Namespace) -> dict[str, Any]:
    result = api.local_down(name=args.name, inventory_dir=args.inventory_dir, progress=not args.quiet)
    if not args.json:
        out.print(f"local cluster {args.name} removed")
    return {"ok": True, "result": result.to_dict()}


# --- helpers -----------------------------------------------------------------------------------


def _cluster(args: argparse.Namespace) -> api.Cluster:
    extra: dict[str, Any] = {}
    for item in args.extra_vars or []:
        if item.startswith("@"):
            extra.update(yaml.safe_load(Path(item[1:]).read_text()) or {})
        elif "=" in item:
            key, _, value = item.partition("=")
            extra[key] = yaml.safe_load(value)
        else:
            raise InventoryError(f"-e {item!r}: expected KEY=VALUE or @FILE", variable=item)
    return api.Cluster(args.inventory or None, extra_vars=extra, progress=not args.quiet)


def _job(args: argparse.Namespace) -> api.Job:
    env = {}
    for item in getattr(args, "env_vars", None) or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise InventoryError(f"--env {item!r}: expected KEY=VALUE", variable="launch_extra_env")
        env[key] = value
    secret_env = {}
    for name in getattr(args, "secret_env", None) or []:
        # The value comes from this process's environment, never from its command line.
        if name not in os.environ:
            raise InventoryError(f"--secret-env {name}: {name} is not set in this environment",
                                 variable="launch_secret_env")
        secret_env[name] = os.environ[name]
    script_args = list(getattr(args, "script_args", None) or [])
    if script_args[:1] == ["--"]:
        script_args = script_args[1:]
    return api.Job(args=script_args or None, workload=getattr(args, "workload", None),
                   entrypoint=getattr(args, "entrypoint", None),
                   name=getattr(args, "job", None), env=env or None, secret_env=secret_env or None,
                   timeout=getattr(args, "timeout", None),
                   run_id=getattr(args, "run_id", None), master_port=getattr(args, "master_port", None))


def _hosts_result(args: argparse.Namespace, result: api.PlaybookResult) -> dict[str, Any]:
    """Per-host counts of a playbook run: a table, or the JSON document."""
    if not args.json:
        _print_hosts(result)
    return {"ok": True, "result": result.to_dict()}


def _print_hosts(result: api.PlaybookResult) -> None:
    table = Table("host", "ok", "changed", "failed", "unreachable", title=f"{result.playbook} ({result.duration_s:.0f}s)")
    for h in result.hosts.values():
        table.add_row(h.host, str(h.ok), str(h.changed), str(h.failed), str(h.unreachable))
    out.print(table)


def _print_run(run: api.RunResult) -> None:
    table = Table("rank", "host", "exit", "outcome", "duration", "steps", "last loss", "cpuset", "mems",
                  title=f"run {run.run_id}  (master {run.master})")
    colour = {"ok": "green", "failed": "red", "missing": "red", "stopped": "yellow"}
    for r in run.ranks:
        table.add_row(str(r.rank), r.host, "-" if r.exit_code is None else str(r.exit_code),
                      f"[{colour.get(r.outcome, 'white')}]{r.outcome}[/]",
                      "-" if r.duration_s is None else f"{r.duration_s:.1f}s", str(r.steps),
                      "-" if r.last_loss is None else f"{r.last_loss:.4f}", r.cpuset or "-", r.cpuset_mems or "-")
    out.print(table)
    if run.ok:
        if run.checksums_equal is not None:
            out.print(f"checksums equal on every rank: {'yes' if run.checksums_equal else '[red]no[/]'}")
    for label, path in (("logs, summary", run.run_dir), ("loss plot", run.loss_plot), ("model", run.model)):
        if path:
            out.print(f"{label}: {escape(path)}")


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-i", "--inventory", action="append",
                        help="inventory file or folder (repeatable); default: the local cluster's")
    common.add_argument("-e", "--extra-vars", action="append", metavar="KEY=VALUE|@FILE",
                        help="a variable for every node, as in ansible-playbook (repeatable)")
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress display")

    parser = argparse.ArgumentParser(prog="torchfleet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    job = argparse.ArgumentParser(add_help=False)
    job.add_argument("--workload", help="training script or folder on this machine (default: launch_workload)")
    job.add_argument("--entrypoint", help="script in the workload folder, or '-m package.module' (launch_entrypoint)")
    job.add_argument("--job", help="job name (containers of an earlier crashed run of it are removed first)")
    job.add_argument("--master-port", type=int, help="MASTER_PORT")
    job.add_argument("--run-id", help="the run's id (default: time plus a random suffix); a plan with the same id "
                                      "shows exactly what that launch runs")

    p = sub.add_parser("plan", parents=[common, job],
                       help="show the launch spec: each rank's command, environment and pinning; changes nothing")
    p.add_argument("--env", action="store_true", help="print every rank's command and environment")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then the script's arguments")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("up", parents=[common], help="provision the nodes (site.yml)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("launch", parents=[common, job], help="run a training job; arguments after -- go to the script")
    p.add_argument("--env", dest="env_vars", action="append", metavar="KEY=VALUE", help="more rank environment")
    p.add_argument("--secret-env", action="append", metavar="NAME",
                   help="pass this environment variable's value to the ranks as a secret (never shown)")
    p.add_argument("--timeout", type=int, help="seconds before a hung job is stopped")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then the script's arguments")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("logs", parents=[common], help="print a run's per-rank logs (default: the latest run)")
    p.add_argument("run_id", nargs="?", help="run id (see runs/)")
    p.add_argument("--rank", type=int, help="only this rank")
    p.add_argument("--tail", type=int, help="only the last N lines of each log")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("down", parents=[common], help="stop and remove every rank on the nodes")
    p.set_defaults(func=cmd_down)

    p = sub.add_parser("local", help="the local docker-host cluster")
    local = p.add_subparsers(dest="local_command", required=True, metavar="up|down")
    for name, func, text in (("up", cmd_local_up, "create N docker hosts on this machine"),
                             ("down", cmd_local_down, "remove them")):
        q = local.add_parser(name, parents=[common], help=text)
        q.add_argument("--name", default="torchfleet", help="cluster name (prefix of its containers)")
        q.add_argument("--inventory-dir", help="where its inventory goes (default: inventory/local)")
        if name == "up":
            q.add_argument("--nodes", type=int, default=3, help="how many docker hosts")
            q.add_argument("--subnet", help="the nodes' docker network (default 172.29.0.0/24)")
        q.set_defaults(func=func)
    return parser


if __name__ == "__main__":
    sys.exit(main())
