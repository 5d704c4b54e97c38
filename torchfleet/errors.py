"""Errors that name the host, the variable or the task a user has to look at."""

from __future__ import annotations

from typing import Any


class TorchfleetError(Exception):
    """Base of every error torchfleet raises."""

    def __init__(self, message: str, host: str | None = None, task: str | None = None):
        self.message = message
        self.host = host
        self.task = task
        super().__init__(message)


class InventoryError(TorchfleetError, ValueError):
    """Bad inventory input, found before any node is touched."""

    def __init__(self, message: str, host: str | None = None, variable: str | None = None,
                 task: str | None = None, hosts: list[str] | None = None):
        self.variable = variable
        # Every host the message is about (a check every node failed names them all).
        self.hosts = list(hosts) if hosts else [host] if host else []
        # A message may name its hosts already: "host h: ..." or, shared by several, "hosts h, g: ...".
        named = host and (message.startswith(f"host {host}:") or message.startswith(f"hosts {host}, "))
        prefix = f"host {host}: " if host and not named else ""
        super().__init__(f"{prefix}{message}", host, task)


class WorkloadError(InventoryError):
    """A workload (the user's training file or folder) that cannot be shipped or started."""

    def __init__(self, message: str, *, variable: str = "launch_workload"):
        super().__init__(message, variable=variable)


class TaskFailed(TorchfleetError):
    """A task failed on a host; ``failures`` lists every failure of the playbook run."""

    def __init__(self, message: str, host: str | None = None, task: str | None = None,
                 playbook: str | None = None, failures: list[Any] | None = None):
        self.playbook = playbook
        self.failures = failures or []
        super().__init__(message, host, task)

    def __str__(self) -> str:
        where = f"host {self.host}, task '{self.task}'" if self.task else f"host {self.host}"
        return f"{where}: {self.message}"


class HostUnreachable(TaskFailed):
    """Ansible could not reach a host."""


class JobFailed(TaskFailed):
    """The training job failed; ``run`` is its report and ``rank`` the rank that broke it."""

    def __init__(self, message: str, run: Any, host: str | None = None, task: str | None = None,
                 playbook: str | None = None, failures: list[Any] | None = None):
        self.run = run
        self.rank = run.failed_rank if run is not None else None
        super().__init__(message, host, task, playbook, failures)


class JobRunning(TorchfleetError):
    """A launch refused because its job still runs (the cluster's state is the lock)."""


class Interrupted(TorchfleetError):
    """SIGINT or SIGTERM ended what the controller was doing. An attached launch stopped
    the run first; ``detached`` says the run goes on (attach, logs -f)."""

    def __init__(self, message: str, signum: int, run_id: str | None = None, detached: bool = False):
        self.signum, self.run_id, self.detached = signum, run_id, detached
        super().__init__(message)
