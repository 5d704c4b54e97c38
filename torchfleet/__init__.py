"""torchfleet: provision CPU clusters and run PyTorch DDP jobs on them with Ansible."""

from torchfleet.errors import (HostUnreachable, Interrupted, InventoryError, JobFailed, JobRunning, TaskFailed,
                               TorchfleetError)

__version__ = "0.1.0"
__all__ = ["Cluster", "Job", "Plan", "Run", "RunResult", "RunStatus", "local_up", "local_down", "TorchfleetError",
           "InventoryError", "TaskFailed", "HostUnreachable", "JobFailed", "JobRunning", "Interrupted"]

_API = frozenset(__all__[:8])


def __getattr__(name):
    # The API loads on first use: Ansible's plugins import torchfleet.spec and the like in a
    # new worker process for every task and node, and the API's import cost each of them more
    # than the modules they use.
    if name in _API:
        from torchfleet import api

        return getattr(api, name)
    raise AttributeError(f"module 'torchfleet' has no attribute {name!r}")
