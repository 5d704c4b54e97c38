"""torchfleet: provision CPU clusters and run PyTorch DDP jobs on them with Ansible."""

from torchfleet.api import Cluster, Job, Plan, Run, RunResult, RunStatus, local_down, local_up
from torchfleet.errors import (HostUnreachable, Interrupted, InventoryError, JobFailed, JobRunning, TaskFailed,
                               TorchfleetError)

__version__ = "0.1.0"
__all__ = ["Cluster", "Job", "Plan", "Run", "RunResult", "RunStatus", "local_up", "local_down", "TorchfleetError",
           "InventoryError", "TaskFailed", "HostUnreachable", "JobFailed", "JobRunning", "Interrupted"]
