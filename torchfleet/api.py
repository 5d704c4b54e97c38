"""torchfleet from Python: plan, provision, launch, read logs and stop, on ansible-runner.

    from torchfleet import Cluster, Job
    cluster = Cluster("inventory/mycluster")
    print(cluster.plan().table())
    cluster.provision()
    run = cluster.launch(Job(args=["--epoch", "3", "--no-cuda", "--save-model"]))
    print(run.ok, [r.last_loss for r in run.ranks])
"""

from __future__ import annotations

# The API's names, from the modules that hold them; ``from torchfleet.api import ...`` stays as it was.
from torchfleet.cluster import Cluster, Job, Run
from torchfleet.events import EventHook, input_error, lost_only
from torchfleet.local import local_down, local_up
from torchfleet.results import Failure, HostResult, Plan, PlaybookResult, RankPlan, RankResult, RunResult, RunStatus
from torchfleet.runner import find_project, remove_stale_private_folders

__all__ = [
    "Cluster", "Job", "Run", "Plan", "RankPlan", "RunResult", "RankResult", "RunStatus", "PlaybookResult", "HostResult",
    "Failure", "EventHook", "find_project", "local_up", "local_down", "remove_stale_private_folders", "input_error",
    "lost_only",
]
