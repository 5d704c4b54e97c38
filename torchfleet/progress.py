"""Show ansible-runner's events as they come: the task, hosts done of total, failures."""

from __future__ import annotations

import time
from typing import Any, Mapping

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn

# Progress goes to stderr, so `--json` output on stdout stays clean.
console = Console(stderr=True, highlight=False, soft_wrap=True)


class RichProgress:
    """One bar per playbook run: its current task and how many hosts have finished it.

    In a terminal the bar redraws in place; elsewhere (CI logs) each play and each
    failure is one line. Bad input is left to the error, which says it once for every
    node; ``verbose`` shows it here too, each node's failed task as Ansible names it.
    """

    def __init__(self, title: str, verbose: bool = False):
        self.title = title
        self.verbose = verbose
        self.live = console.is_terminal
        self.hosts: set[str] = set()
        self.done: set[str] = set()
        self.task = ""
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("[bold]{task.fields[title]}[/]"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TextColumn("hosts  {task.fields[elapsed]:>4}  {task.description}"),
            console=console,
            transient=True,
        )
        self.started = time.monotonic()
        self.bar = self.progress.add_task("starting", total=None, title=title, elapsed="0s")
        if self.live:
            self.progress.start()

    def __call__(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "playbook_on_play_start":
            self.hosts, self.done = set(), set()
            if not self.live:
                console.print(escape(f"[{self.title}] play: {data.get('play', '')}"))
        elif kind == "playbook_on_task_start":
            self.task, self.done = data.get("task", ""), set()
        elif kind == "runner_on_start":
            self.hosts.add(data.get("host", ""))
        elif kind in ("runner_on_ok", "runner_on_skipped", "runner_on_failed", "runner_on_unreachable"):
            self.done.add(data.get("host", ""))
            failed = kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors")
            if failed and (self.verbose or (event.get("torchfleet_failure") or {}).get("kind") != "input"):
                console.print(failure_line(kind, data))
        elif kind == "verbose":
            # The launch's own progress lines: each rank's state and last log line.
            line = (event.get("stdout") or "").strip()
            if line.startswith("[") and "rank" in line:
                console.print(escape(line) if self.live else escape(f"[{self.title}] {line}"))
        if self.live:
            self.progress.update(self.bar, description=self.task[:90], completed=len(self.done),
                                 total=max(len(self.hosts), 1), elapsed=f"{time.monotonic() - self.started:.0f}s")

    def close(self, result: Any) -> None:
        if self.live:
            self.progress.stop()
        console.print(summary_line(self.title, result))


def failure_line(kind: str, data: Mapping[str, Any]) -> str:
    """A failed task's line as it comes. A node that stopped answering is yellow: a run can
    still succeed without it (a lost master's run goes on elsewhere), and the command's
    verdict, which comes last, says whether it did."""
    res = data.get("res") or {}
    message = str(res.get("msg") or res.get("stderr") or "failed").strip().splitlines()
    what = escape(f"{data.get('task')}: {message[0] if message else 'failed'}")
    if kind == "runner_on_unreachable":
        return f"[yellow]! {escape(str(data.get('host')))} did not answer[/]: {what}"
    return f"[red]✗ {escape(str(data.get('host')))}[/]: {what}"


def summary_line(title: str, result: Any) -> str:
    """A playbook run's closing line: green for done, yellow for interrupted (Ctrl-C
    detaches an attach, and stops an attached launch) and for nodes that only stopped
    answering (the run's verdict, which follows, says whether that failed it), red and the
    failures only where a task failed."""
    hosts = result.hosts.values()
    changed = sum(h.changed for h in hosts)
    took = f"({result.duration_s:.0f}s)"
    if result.interrupted:
        return f"[yellow]■[/] {escape(f'{title}: interrupted {took}')}"
    if result.ok:
        return f"[green]✓[/] {escape(f'{title}: {len(hosts)} host(s), {changed} changed {took}')}"
    failed = sum(h.failed for h in hosts)
    unreachable = sum(h.unreachable for h in hosts)
    if unreachable and not failed:
        return f"[yellow]![/] {escape(f'{title}: {len(hosts)} host(s), {changed} changed, {unreachable} not answering')} {took}"
    line = f"{title}: {len(hosts)} host(s), {changed} changed, {failed} failed" \
        + (f", {unreachable} unreachable" if unreachable else "")
    return f"[red]✗[/] {escape(line)} {took}"
