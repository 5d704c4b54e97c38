"""A run carries its own settings: stopped from a controller whose inventory says otherwise,
its ranks still get the grace the run was launched with."""

import json

import torchfleet
from torchfleet import Job

# Joins the group (the launch waits for MASTER_PORT), then ignores SIGTERM, so that only
# SIGKILL ends it: the guard's record shows how long the grace was.
DEAF = """
import signal, time
import torch.distributed as dist
dist.init_process_group("gloo")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("training, deaf to SIGTERM", flush=True)
time.sleep(600)
"""
GRACE = 15  # the run's; the inventory's launch_stop_grace is the role's default, 5


def test_a_stop_from_another_controller_gives_the_ranks_the_runs_own_grace(provisioned, tmp_path):
    cluster = provisioned[0]
    workload = tmp_path / "deaf.py"
    workload.write_text(DEAF)
    run = cluster.submit(Job(workload=workload, name="grace", args=[], extra_vars={"launch_stop_grace": GRACE}))
    # A second controller: the same inventory, with none of the launch's variables.
    other = torchfleet.Cluster(cluster.inventory, runs_dir=cluster.runs_dir, env=cluster.env, progress=False)
    result = other.run(run.run_id).stop()
    assert result.abort["kind"] == "stopped"
    graces = []
    for record in sorted((cluster.runs_dir / run.run_id).glob("guard-*.json")):
        state = json.loads(record.read_text())
        graces.append(state["sigkill_at"] - state["sigterm_at"])
    assert len(graces) == 2 and all(GRACE <= g < GRACE + 5 for g in graces), graces
