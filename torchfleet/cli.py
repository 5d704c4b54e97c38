"""The `torchfleet` command: plan, up, launch, the runs on the cluster (runs, status,
attach, logs, stop, collect), down, and the local docker-host cluster.

Exit codes: 0 done; 1 the job ran and a rank failed (or it was stopped on request); 2 bad
input (inventory, variables, usage); 3 a task failed on a node or a node was unreachable
before the job ran, or the run's supervision never came up; 4 anything else; 5 a node was lost while the job ran; 6 a rank stalled
(launch_stall_timeout) or the job ran past launch_timeout; 7 the launch was refused because
its job still runs; 130 an attached launch was interrupted (Ctrl-C, SIGTERM): every rank was
stopped and the logs collected. Ctrl-C on attach or logs -f only detaches (exit 0).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from torchfleet import api, attempts, livesync, progress
from torchfleet.errors import Interrupted, InventoryError, JobFailed, JobRunning, TaskFailed, TorchfleetError
from torchfleet.inputs import check_run_id
from torchfleet import run_vocab as vocab

# Piped output (CI logs, files) gets wide tables rather than truncated cells.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
EXIT_OK, EXIT_JOB_FAILED, EXIT_BAD_INPUT, EXIT_TASK_FAILED, EXIT_OTHER = 0, 1, 2, 3, 4
EXIT_NODE_LOST, EXIT_STALLED, EXIT_RUNNING, EXIT_INTERRUPTED = 5, 6, 7, 130
# launch's flags that plan leaves out: how the controller follows the run, and what it does
# with an earlier run of the job. Every other launch flag shapes the run, and plan takes it.
LAUNCH_ONLY = ("--detach", "--replace")
# How the guards' reason for stopping a run maps to an exit code.
# (torchfleet.run_vocab: the kinds of abort). A run whose store never came up never got going:
# that is a failed start, as a task that failed before the job ran.
EXIT_BY_ABORT = {vocab.AbortKind.NODE_LOST: EXIT_NODE_LOST, vocab.AbortKind.STALLED: EXIT_STALLED,
                 vocab.AbortKind.TIMEOUT: EXIT_STALLED, vocab.AbortKind.NOT_STARTED: EXIT_TASK_FAILED}


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        payload = args.func(args)
        code = EXIT_OK
    except JobFailed as exc:
        abort = (exc.run.abort or {}) if exc.run else {}
        payload = _error(exc, run=exc.run.to_dict() if exc.run else None, abort=abort or None)
        code = EXIT_BY_ABORT.get(abort.get("kind"), EXIT_JOB_FAILED)
        if not args.json and exc.run:
            _print_run(exc.run)
    except Interrupted as exc:
        payload = _error(exc, run_id=exc.run_id, detached=exc.detached)
        code = EXIT_OK if exc.detached else EXIT_INTERRUPTED
        if exc.detached and not args.json:
            out.print(escape(exc.message))
            payload = {"ok": True, "detached": True, "run_id": exc.run_id}
    except JobRunning as exc:
        payload, code = _error(exc, variable="launch_job"), EXIT_RUNNING
    except InventoryError as exc:
        payload, code = _error(exc, variable=exc.variable, hosts=exc.hosts), EXIT_BAD_INPUT
    except TaskFailed as exc:
        payload, code = _error(exc), EXIT_TASK_FAILED
    except TorchfleetError as exc:
        payload, code = _error(exc), EXIT_OTHER
    if getattr(args, "cluster", None) is not None:
        payload["warnings"] = args.cluster.warnings
    if args.json:
        print(json.dumps(payload, indent=2, default=str))
    elif code != EXIT_OK:
        err = payload["error"]
        # Bad input is said once: the host or hosts in its sentence, the variable, and Ansible's
        # task only with -v.
        named = err["message"].startswith(("host ", "hosts "))
        where = ", ".join(f"{k} {err[k]}" for k in ("host", "variable", "task") if err.get(k)
                          and not (k == "host" and named) and (k != "task" or args.verbose or code != EXIT_BAD_INPUT))
        Console(stderr=True, highlight=False, soft_wrap=True).print(
            f"[bold red]error[/] ({err['type']}{': ' + escape(where) if where else ''})\n{escape(err['message'])}")
    return code


def _error(exc: TorchfleetError, **more: Any) -> dict[str, Any]:
    error = {"type": type(exc).__name__, "message": exc.message, "host": exc.host, "task": exc.task, **more}
    run = error.pop("run", None)
    return {"ok": False, "error": error, **({"run": run} if run else {})}


# --- commands ----------------------------------------------------------------------------------


def cmd_plan(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _cluster(args)
    if args.format:
        return _plan_manifest(args, cluster)
    plan = cluster.plan(_job(args))
    if args.file:
        return _plan_file(args, plan)
    if not args.json:
        out.print(f"[bold]MASTER_ADDR:MASTER_PORT[/] {plan.master}   world size {plan.world_size} on "
                  f"{plan.num_nodes} node(s)   mode {plan.launch_mode}   transport {plan.transport}   "
                  f"image {escape(str(plan.image or '-'))}")
        table = Table("rank", "host", "address", "interface", "local", "cpuset", "mems", "threads", "preload",
                      "runs as", "runtime")
        for r in plan.ranks:
            table.add_row(str(r.rank), r.host, r.address, r.interface, f"{r.local_rank}/{r.local_world_size}",
                          r.cpuset or "unpinned", r.cpuset_mems or "-", str(r.threads),
                          escape(r.env.get("LD_PRELOAD") or "-"), r.runner,
                          "ready" if r.runtime_ready else "[yellow]missing (run up)[/]")
        out.print(table)
        if args.show_env:
            for r in plan.ranks:
                out.print(f"[bold]rank {r.rank}[/] argv {escape(' '.join(r.argv))}   cwd {escape(r.workdir)}")
                out.print("  " + " ".join(f"{k}={escape(v)}" for k, v in r.env.items()))
        else:
            out.print("Each rank's command and environment: torchfleet plan --show-env (or --json). "
                      "Nothing was changed.")
    return {"ok": True, "plan": plan.to_dict()}


def _plan_file(args: argparse.Namespace, plan: api.Plan) -> dict[str, Any]:
    """plan --file NAME: a file the start writes into the master's run folder, exactly as it
    will be written there (with --run-id, the very file of that run; launch_mode slurm: sbatch.sh)."""
    files = (plan.files or {}).get(plan.master_host) or {}
    if args.file not in files:
        raise InventoryError(f"the plan writes no {args.file} on the master {plan.master_host} under launch_mode="
                             f"{plan.launch_mode} (it writes {', '.join(sorted(files)) or 'nothing'})", None, "launch_mode")
    if not args.json:
        sys.stdout.write(files[args.file])
    return {"ok": True, "host": plan.master_host, "file": args.file, "content": files[args.file]}


def _plan_manifest(args: argparse.Namespace, cluster: api.Cluster) -> dict[str, Any]:
    """plan --format: the job as a manifest for a Kubernetes cluster, from the inventory's and
    -e's variables alone: no playbook runs and no node is contacted (torchfleet.k8s.offline).
    The YAML alone goes to stdout, for kubectl apply -f -; what must exist first to stderr."""
    # Imported here: Ansible's inventory, jsonschema and the CRDs cost every other command nothing.
    from torchfleet import k8s
    from torchfleet.k8s import offline

    rendered = offline.manifest(args.format, cluster.inventory, {**cluster.extra_vars, **_job(args).to_vars()},
                                cluster.project_dir)
    for message in rendered.warnings:
        cluster.warnings.append({"message": message})
        _print_warning({"message": message})
    if not args.json:
        if not args.quiet:
            progress.console.print(escape(k8s.needs_text(rendered)))
        print(k8s.to_yaml(rendered.manifest), end="")
    return {"ok": True, "format": args.format, "manifest": rendered.manifest, "needs": rendered.needs}


def cmd_up(args: argparse.Namespace) -> dict[str, Any]:
    return _hosts_result(args, _cluster(args).provision())


def cmd_launch(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _cluster(args)
    if args.detach:
        handle = cluster.submit(_job(args))
        if not args.json:
            out.print(f"run {handle.run_id} started; the cluster supervises it. Follow it: torchfleet attach "
                      f"{handle.run_id}   stop it: torchfleet stop {handle.run_id}")
        return {"ok": True, "run_id": handle.run_id, "detached": True}
    run = cluster.launch(_job(args))
    if not args.json:
        _print_run(run)
    return {"ok": True, "run": run.to_dict()}


def cmd_runs(args: argparse.Namespace) -> dict[str, Any]:
    runs = _cluster(args).cluster_runs()
    if not args.json:
        # The attempt column only where a run has restarts (launch_max_restarts).
        restarts = any((r.get("max_attempts") or 1) > 1 for r in runs)
        table = Table("run", "job", "state", *(["attempt"] if restarts else []), "on nodes", "collected")
        for r in runs:
            attempt = [f"{r.get('attempt') or 1} of {r.get('max_attempts') or 1}"] if restarts else []
            table.add_row(r["run_id"], r.get("job") or "-", r.get("state") or "-", *attempt,
                          ",".join(r["nodes"]) or "-", "yes" if r["local"] else "no")
        out.print(table)
        if runs and runs[0]["unreachable"]:
            out.print(f"[yellow]not answering:[/] {', '.join(runs[0]['unreachable'])}")
    return {"ok": True, "runs": runs}


def cmd_status(args: argparse.Namespace) -> dict[str, Any]:
    status = _cluster(args).run(args.run_id).status()
    if not args.json:
        out.print(f"[bold]run {status.run_id}[/] ({status.job or '-'}): {status.state}"
                  + "".join(f", {escape(w)}" for w in [attempts.running_words(status.to_dict())] if w)
                  + (f" - {escape(status.abort['reason'])}" if status.abort else ""))
        for line in attempts.ended_lines(status.attempts):
            out.print(f"  {escape(line)}")
        table = Table("host", "unit", "state", "exit", "why stopped")
        for host, node in status.nodes.items():
            for u in node.get("units", []):
                table.add_row(host, u["name"], u["state"], "-" if u.get("exit_code") is None else str(u["exit_code"]),
                              escape(u.get("stopped_because") or ""))
        out.print(table)
        if status.note:
            out.print(f"[yellow]{escape(status.note)}[/]")
        if status.unreachable:
            out.print(f"[yellow]not answering:[/] {', '.join(status.unreachable)}")
    return {"ok": True, "status": status.to_dict()}


def cmd_run_action(args: argparse.Namespace) -> dict[str, Any]:
    """attach, stop or collect: the Run handle's method of that name, then the run's table."""
    run = getattr(_cluster(args).run(args.run_id), args.action)()
    if not args.json:
        _print_run(run)
    return {"ok": True, "run": run.to_dict()}


def _follow(cluster: api.Cluster, run_id: str, interval: float, lines: int) -> dict[str, Any]:
    """Print new log lines as they come, until the run ends; Ctrl-C only stops following."""
    seen: dict[tuple[str, str], list[str]] = {}
    handle = cluster.run(run_id)
    try:
        while True:
            status = handle.status(log_lines=lines)
            for host, node in sorted(status.nodes.items()):
                for name, text in sorted((node.get("logs") or {}).items()):
                    if attempts.is_attempt_log(name):
                        continue  # its lines are in the main log too
                    for line in _new_lines(seen.get((host, name), []), text):
                        out.print(f"[dim]{host} {name}:[/] {escape(line)}")
                    seen[(host, name)] = text
            if status.state != "running":
                out.print(f"run {run_id}: {status.state}" + (f" - {escape(status.abort['reason'])}"
                                                              if status.abort else ""))
                return {"ok": True, "run_id": run_id, "state": status.state}
            time.sleep(interval)
    except KeyboardInterrupt:
        out.print(f"stopped following run {run_id}, which goes on")
        return {"ok": True, "run_id": run_id, "detached": True}


def _new_lines(old: list[str], new: list[str]) -> list[str]:
    """The lines of ``new`` (a log's latest lines) after what ``old`` already showed."""
    for k in range(min(len(old), len(new)), 0, -1):
        if new[:k] == old[-k:]:
            return new[k:]
    return new


def cmd_logs(args: argparse.Namespace) -> dict[str, Any]:
    cluster = _cluster(args)
    if args.follow:
        if not args.run_id:
            raise InventoryError("logs -f needs a run id (torchfleet runs lists them)", variable="run_id")
        return _follow(cluster, args.run_id, args.interval, max(args.tail or 20, 20))
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


def cmd_tensorboard(args: argparse.Namespace) -> dict[str, Any]:
    """Keep the run's out folders in step on this machine while it runs and serve their event
    files with TensorBoard, until Ctrl-C (torchfleet.livesync)."""
    cluster = _cluster(args)
    # Its lines go beside --json's document, which comes at the end.
    say = progress.console.print if args.json else out.print
    run_id = check_run_id(args.run_id or _running_run(cluster))
    # SIGTERM ends it as Ctrl-C does: TensorBoard stopped, the layout removed.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    folder = Path(tempfile.mkdtemp(prefix="torchfleet-tensorboard-"))
    sync = livesync.LiveSync(cluster, run_id, folder / "logdir")
    last: livesync.Round | None = None
    try:
        last = sync.start()
        livesync.require_run(last, sync)
        sync.relink()
        with livesync.serve(sync.view, args.host, args.port, reload_s=min(args.interval, 5.0)) as url:
            say(f"TensorBoard at {url} : run {run_id}, its out folders brought into {escape(str(sync.out_root))} "
                f"every {args.interval:g} s while it runs. Ctrl-C stops.")
            if last.running:
                news = livesync.News(last)
                last = sync.follow(args.interval, on_round=lambda done: [
                    say(f"[yellow]warning:[/] {escape(text)}" if warn else escape(text)) for warn, text in news(done)])
            say(f"run {run_id} is {last.state}: nothing more to bring. TensorBoard goes on serving; Ctrl-C stops.")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        say(f"stopped TensorBoard and the sync of run {run_id} ({sync.rounds} rounds, "
            f"{sync.bytes / 1e6:.1f} MB brought)")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        shutil.rmtree(folder, ignore_errors=True)
    return {"ok": True, "run_id": run_id, "state": last.state if last else None, "rounds": sync.rounds,
            "bytes": sync.bytes, "out": str(sync.out_root)}


def _running_run(cluster: api.Cluster) -> str:
    """The newest run that runs on the cluster."""
    running = [r["run_id"] for r in cluster.cluster_runs() if r.get("state") == vocab.RunState.RUNNING]
    if not running:
        raise InventoryError("no run runs on the cluster; name one (torchfleet runs lists them)", variable="run_id")
    return running[-1]


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
    for n, item in enumerate(args.extra_vars or [], 1):
        # A mapping, as ansible-playbook takes it (-e '{"launch_secret_env": {...}}').
        try:
            inline = yaml.safe_load(item) if item.lstrip().startswith("{") else None
        except yaml.YAMLError:
            inline = None
        if item.startswith("@"):
            extra.update(yaml.safe_load(Path(item[1:]).read_text()) or {})
        elif isinstance(inline, dict):
            extra.update(inline)
        elif "=" in item and not item.lstrip().startswith("{"):
            key, _, value = item.partition("=")
            extra[key] = yaml.safe_load(value)
        else:
            # Never echoed: it may hold a secret.
            raise InventoryError(f"-e number {n} is not KEY=VALUE, @FILE or a {{...}} mapping", variable="extra_vars")
    # Kept on args: main() reports its warnings whatever the command raised.
    args.cluster = api.Cluster(args.inventory or None, extra_vars=extra, progress=not args.quiet,
                               on_warning=_print_warning, verbose=args.verbose)
    return args.cluster


def _print_warning(warning: dict[str, Any]) -> None:
    """A lookalike warning, as soon as the inventory check makes it: before any check that can fail."""
    progress.console.print(f"[yellow]warning[/] {escape(warning['message'])}")


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
                   run_id=getattr(args, "run_id", None), master_port=getattr(args, "master_port", None),
                   replace=getattr(args, "replace", False))


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
    colour = {vocab.RankOutcome.OK: "green", vocab.RankOutcome.FAILED: "red", vocab.RankOutcome.MISSING: "red",
              vocab.RankOutcome.STOPPED: "yellow", vocab.RankOutcome.LEFT_OUT: "dim"}
    for r in run.ranks:
        table.add_row(str(r.rank), r.host, "-" if r.exit_code is None else str(r.exit_code),
                      f"[{colour.get(r.outcome, 'white')}]{r.outcome}[/]",
                      "-" if r.duration_s is None else f"{r.duration_s:.1f}s", str(r.steps),
                      "-" if r.last_loss is None else f"{r.last_loss:.4f}", r.cpuset or "-", r.cpuset_mems or "-")
    out.print(table)
    for line in attempts.ended_lines(run.attempts):
        out.print(escape(line))
    for label, path in (("logs, summary", run.run_dir), ("loss plot", run.loss_plot), ("model", run.model)):
        if path:
            out.print(f"{label}: {escape(path)}")
    brought = sorted(h for h, o in run.outputs.items() if o.get("dir"))
    if brought:
        out.print(f"out folders: {escape(str(Path(run.run_dir) / 'out'))} ({', '.join(brought)})")
    for line in run_warnings(run):
        out.print(f"[yellow]warning:[/] {escape(line)}")
    verdict = run_verdict(run)
    if verdict:
        out.print(verdict)


def run_warnings(run: api.RunResult) -> list[str]:
    """What a run's report says beside its verdict: files its limit left on a node, nodes
    the controller could not reach (with the collect command that fetches their logs), and
    ranks whose checksums differ. Warnings, never the verdict: a run is judged by its ranks."""
    lines = [f"left on the node: {run.outputs[host]['message']}" for host in sorted(run.outputs)
             if run.outputs[host].get("message")]
    if run.note:
        lines.append(run.note)
    if run.ok and run.checksums_equal is False:
        lines.append("the ranks' checksums differ: their parameters did not end the same")
    return lines


def run_verdict(run: api.RunResult) -> str | None:
    """The run's last line, in the colour of the command's exit code: green for a run that
    succeeded (and in which attempt), yellow for one stopped on request; None for a failed
    run, whose error follows in red."""
    if run.ok:
        succeeded = attempts.succeeded_words(run.attempts, run.max_attempts) or "succeeded"
        same = "; checksums equal on every rank" if run.checksums_equal else ""
        return f"[green]✓[/] run {run.run_id} {escape(succeeded)}{same}"
    if (run.abort or {}).get("kind") == vocab.AbortKind.STOPPED:
        return f"[yellow]■[/] run {run.run_id} stopped: {escape(run.abort.get('reason') or 'on request')}"
    return None


def version() -> str:
    """The installed package's version, as pip knows it."""
    try:
        return importlib.metadata.version("torchfleet")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed: no version)"


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-i", "--inventory", action="append",
                        help="inventory file or folder (repeatable); default: the local cluster's")
    common.add_argument("-e", "--extra-vars", action="append", metavar="KEY=VALUE|@FILE",
                        help="a variable for every node, as in ansible-playbook (repeatable)")
    common.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress display")
    common.add_argument("-v", "--verbose", action="store_true",
                        help="show every failed task as Ansible names it, on each node, bad input included")

    parser = argparse.ArgumentParser(prog="torchfleet", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"torchfleet {version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # Every flag that shapes the run, the same on plan and launch: the plan is what that launch runs.
    job = argparse.ArgumentParser(add_help=False)
    job.add_argument("--workload", help="training script or folder on this machine (default: launch_workload)")
    job.add_argument("--entrypoint", help="script in the workload folder, or '-m package.module' (launch_entrypoint)")
    job.add_argument("--job", help="job name (default: launch_job, else the workload's script or folder name; "
                                   "containers of an earlier crashed run of it are removed first)")
    job.add_argument("--master-port", type=int, help="MASTER_PORT")
    job.add_argument("--run-id", help="the run's id (default: time plus a random suffix); a plan with the same id "
                                      "shows exactly what that launch runs")
    job.add_argument("--env", dest="env_vars", action="append", metavar="KEY=VALUE", help="more rank environment")
    job.add_argument("--secret-env", action="append", metavar="NAME",
                     help="pass this environment variable's value to the ranks as a secret (never shown)")
    job.add_argument("--timeout", type=int, help="seconds before the guards stop the job (launch_timeout)")
    job.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then the script's arguments")

    p = sub.add_parser("plan", parents=[common, job],
                       help="show the launch spec: each rank's command, environment and pinning; changes nothing. "
                            f"It takes launch's command line; {' and '.join(LAUNCH_ONLY)} are launch's alone")
    p.add_argument("--show-env", action="store_true", help="print every rank's command and environment")
    p.add_argument("--file", metavar="NAME", help="print only the file NAME that the start writes into the master's "
                                                  "run folder, e.g. sbatch.sh under launch_mode slurm (docs/slurm.md)")
    p.add_argument("--format", choices=("trainjob", "pytorchjob"),
                   help="print the plan as a Kubernetes manifest, a Kubeflow TrainJob or PyTorchJob, checked against "
                        "its CRD; the k8s_* variables come from -e (docs/kubernetes.md)")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("up", parents=[common], help="provision the nodes (site.yml)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("launch", parents=[common, job], help="run a training job; arguments after -- go to the script")
    p.add_argument("--detach", action="store_true",
                   help="return once every rank has started; the cluster supervises the run (see attach, stop)")
    p.add_argument("--replace", action="store_true",
                   help="stop a still-running run of the same job first (its logs are kept) instead of refusing")
    p.set_defaults(func=cmd_launch)

    p = sub.add_parser("runs", parents=[common], help="list the runs on the cluster and in runs/, with their state")
    p.set_defaults(func=cmd_runs)
    for name, func, text in (
            ("status", cmd_status, "a run's state on the cluster, unit by unit"),
            ("attach", cmd_run_action, "follow a run until it ends, then collect it (Ctrl-C only detaches)"),
            ("stop", cmd_run_action, "stop every rank of a run on every node, and collect it"),
            ("collect", cmd_run_action, "bring a run's logs, checksums and model into runs/RUN/")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("run_id", help="the run's id (torchfleet runs lists them)")
        p.set_defaults(func=func, action=name)

    p = sub.add_parser("logs", parents=[common], help="print a run's per-rank logs (default: the latest run)")
    p.add_argument("run_id", nargs="?", help="run id (see runs/)")
    p.add_argument("--rank", type=int, help="only this rank")
    p.add_argument("--tail", type=int, help="only the last N lines of each log")
    p.add_argument("-f", "--follow", action="store_true",
                   help="follow the logs on the cluster as they grow (Ctrl-C stops following; the run goes on)")
    p.add_argument("--interval", type=float, default=3, help="seconds between reads with -f")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("tensorboard", parents=[common],
                       help="serve a run's curves with TensorBoard, its out folders brought from the nodes at an "
                            "interval while it runs (default: the newest running run); Ctrl-C stops")
    p.add_argument("run_id", nargs="?", help="the run's id (torchfleet runs lists them)")
    p.add_argument("--interval", type=float, default=livesync.INTERVAL, help="seconds between syncs")
    p.add_argument("--port", type=int, default=6006, help="TensorBoard's port (0: any free one)")
    p.add_argument("--host", default="localhost", help="the address TensorBoard listens on")
    p.set_defaults(func=cmd_tensorboard)

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
