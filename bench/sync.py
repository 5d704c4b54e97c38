#!/usr/bin/env python3
"""What the live sync (torchfleet tensorboard) costs per node and round: 3 and 12 nodes,
measured in one run.

The nodes are bench/scale.py's (containers of the training image running only sshd, the job
in process mode), so that 12 fit this 2-core machine. Each runs one rank of a workload that
writes a scalar RATE times a second with torch's SummaryWriter into its out folder, as a
user's script would, and does nothing else. Once every rank has written, ROUNDS rounds of
the sync run back to back, INTERVAL seconds apart, as `torchfleet tensorboard --interval`
makes them; for each size it prints the medians of:

  - a round's wall time, and the controller's CPU seconds for it (this process and its
    children: ansible-playbook, its workers, ssh), in all and per node;
  - each node's own task (Ansible's duration of out_sync on that node: the module's start
    and its read of the run folder);
  - the bytes a round brought, in all and per node: what the ranks wrote in the interval;
  - the floor: a playbook of one bare command on every node, through the same runner, which
    no round can go below (bench/scale.py's contact floor).

Run from the repository root with the venv active:

    python bench/sync.py            # 3 and 12 nodes
    python bench/sync.py 3          # other sizes
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torchfleet
from torchfleet import Job, livesync
from torchfleet.idx import make_dataset

# Run as a script, this folder is on the path: the other benches' nodes and floors serve here too.
from recovery import Nodes
from scale import contact_floor, cpu, sh

ROUNDS, INTERVAL, RATE = 12, 5.0, 20
# Its own nodes' names and subnets, apart from the tests' and the other benches' (the tests' base, as they take it).
BASE = os.environ.get("TORCHFLEET_TEST_SUBNET_BASE", "172.29")
WORKLOAD = f"""
import os, time
from torch.utils.tensorboard import SummaryWriter
writer = SummaryWriter(os.path.join(os.environ["TORCHFLEET_OUT_DIR"], "tensorboard", "rank-" + os.environ["RANK"]),
                       flush_secs=1)
step = 0
while True:
    step += 1
    writer.add_scalar("train/loss", 1.0 / step, step)
    time.sleep({1 / RATE})
"""


def measure(count: int, folder: Path, keys: Path, data: Path) -> dict[str, float]:
    nodes = Nodes(count, keys, data)
    nodes.prefix, nodes.subnet = f"tfsync{count}", f"{BASE}.{21 if count <= 3 else 22}"
    nodes.start()
    try:
        cluster = torchfleet.Cluster(nodes.inventory(folder), runs_dir=folder / "runs", progress=False)
        floor = contact_floor(cluster, folder, "")
        workload = folder / "writer.py"
        workload.write_text(WORKLOAD)
        run = cluster.submit(Job(workload=workload, run_id=f"sync{count}",
                                 extra_vars={"launch_wait_master_listen": False, "launch_max_restarts": 0}))
        durations: list[float] = []
        plain = cluster._run

        def timed(*args, hook=None, **kwargs):
            def seen(event):
                data_ = event.get("event_data") or {}
                if event.get("event") == "runner_on_ok" and str(data_.get("task_action", "")).endswith("out_sync"):
                    durations.append(float(data_.get("duration") or 0))
                hook(event)
            return plain(*args, hook=seen, **kwargs)

        cluster._run = timed
        sync = livesync.LiveSync(cluster, run.run_id, folder / f"view{count}")
        done, deadline = sync.start(), time.monotonic() + 300
        while len(done.brought) < count or not all(done.brought.values()):
            if time.monotonic() > deadline:
                sys.exit(f"{count} nodes: the ranks never wrote ({done})")
            time.sleep(2)
            done = sync.step()
        durations.clear()
        walls, cpus, sizes = [], [], []
        for _ in range(ROUNDS):
            time.sleep(INTERVAL)
            before, t0 = cpu(), time.monotonic()
            done = sync.step()
            sync.relink()
            walls.append(time.monotonic() - t0)
            cpus.append(cpu() - before)
            sizes.append(sum(done.brought.values()))
        cluster._run = plain
        run.stop()
        m = statistics.median
        return {"nodes": count, "wall": m(walls), "cpu": m(cpus), "cpu_node": m(cpus) / count, "task": m(durations),
                "bytes": m(sizes), "bytes_node": m(sizes) / count, "floor": floor}
    finally:
        nodes.remove()


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [3, 12]
    print(f"{ROUNDS} rounds {INTERVAL:g} s apart, each rank writing {RATE} scalars a second", flush=True)
    print(f"{'nodes':>5} {'round':>7} {'floor':>7} {'ctl CPU':>8} {'/node':>7} {'node task':>9} {'bytes':>8} {'/node':>7}")
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        folder = Path(tmp)
        keys = folder / "keys"
        keys.mkdir()
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "id"))
        data = folder / "data"
        # The nodes mount it where the launch's dataset is; the writer reads none of it.
        make_dataset(data / "fashion-mnist", 64, 16)
        for count in sizes:
            r = measure(count, folder, keys, data)
            print(f"{r['nodes']:>5} {r['wall']:>6.2f}s {r['floor']:>6.2f}s {r['cpu']:>7.2f}s {r['cpu_node']:>6.3f}s "
                  f"{r['task']:>8.2f}s {r['bytes']:>8.0f} {r['bytes_node']:>7.0f}", flush=True)


if __name__ == "__main__":
    main()
