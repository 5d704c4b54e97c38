"""torchfleet: provision CPU clusters and run PyTorch DDP jobs on them with Ansible."""

from torchfleet.api import Cluster, Job, Plan, RunResult, local_down, local_up
from torchfleet.errors import HostUnreachable, InventoryError, JobFailed, TaskFailed, TorchfleetError

__version__ = "0.1.0"
__all__ = ["Cluster", "Job", "Plan", "RunResult", "local_up", "local_down", "TorchfleetError",
           "InventoryError", "TaskFailed", "HostUnreachable", "JobFailed"]
