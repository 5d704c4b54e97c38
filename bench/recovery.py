#!/usr/bin/env python3
"""How fast a run recovers: 3 and 12 nodes, measured in one run.

The nodes are those of bench/scale.py: containers of the training image running only sshd
(no Docker engine inside), the job in process mode, so that 12 fit this 2-core machine. The
job is the bundled workload (files/workloads/mnist.py) with restarts on (launch_max_restarts
1, launch_min_nodes one less than the nodes, the other restart settings at their defaults),
logging every step and saving a checkpoint every CHECKPOINT_EVERY steps. For each size:

  - a crash: the last rank kills itself after step CRASH_STEP (--crash-at-step), from the
    time it logged that, until the next attempt's first training step on rank 0;
  - a lost worker: the last node frozen whole (docker pause) once rank 0 has saved a
    checkpoint, from the pause until the next attempt's first step on rank 0 (node-1);
  - a lost master: the same with node-1, until the first step of the new rank 0 (node-2);
  - for each, the work lost: the steps the run had done before the fault, less the step the
    next attempt resumed from, both as the ranks logged them (rank 0, or the new rank 0);
  - the floor: the workload's own start, as many fresh ranks as the size, one per node at
    once, each alone (world size 1), from their start to the last one's first step. A
    restart cannot go below it: it starts that many ranks on the same cores.

Every time here is the ranks' own (their log lines' timestamps) or this machine's clock,
which the node containers share. A case that does not recover within its bound is
printed as such, and the bench goes on. Run from the repository root with the venv active:

    python bench/recovery.py            # 3 and 12 nodes
    python bench/recovery.py 3          # other sizes
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import torchfleet
from torchfleet import Job
from torchfleet.idx import make_dataset
from torchfleet import run_vocab

# Run as a script, this folder is on the path: scale.py's ways into its bench nodes serve here too.
from scale import sh, ssh_opts

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "torchfleet/train:2.13.0-cpu"
PYTHON = "/opt/venv/bin/python3"
WORKLOAD = ROOT / "files" / "workloads" / "mnist.py"
# One cluster per size, each on a subnet apart from every test cluster's and the other benches'.
SUBNETS = {3: "172.29.17", 12: "172.29.18"}
RUNS = "/var/lib/torchfleet/runs"
DATA = "/var/lib/torchfleet/datasets"
# The loss cases use launch_node_timeout's default, which their goal counts; the crash case
# a longer one, so that a guard starved on the shared cores is not taken for a lost node.
NODE_TIMEOUT = 10
QUIET_NODE_TIMEOUT = 30
CHECKPOINT_EVERY = 10
CRASH_STEP = 25
# Past this, a case is reported as not recovered.
BOUND = 300
# Every step logged, and an endless run: each case is stopped once it has recovered.
MNIST = ["--batch-size", "16", "--seed", "42", "--log-interval", "1", "--epoch", "100000",
         "--checkpoint-every", str(CHECKPOINT_EVERY)]

STAMP = r"^(\S+Z) "
TRAINED = re.compile(STAMP + r".*\] Train Epoch: (\d+) \[(\d+)/(\d+) ", re.M)
RESUMED = re.compile(r"\] (?:resumed from step (\d+) |starting from step (0): )")
CRASHED = re.compile(STAMP + r".*\] crashing at step (\d+)", re.M)
SAVED = re.compile(r"\[rank 0\] Saved checkpoint at step (\d+)")


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


class Nodes:
    """``count`` sshd-only nodes of the training image (bench/scale.py's), with the dataset."""

    def __init__(self, count: int, keys: Path, data: Path):
        self.count, self.prefix, self.subnet = count, f"tfrecovery{count}", SUBNETS.get(count, "172.29.17")
        self.keys, self.data = keys, data

    def name(self, i: int) -> str:
        return f"{self.prefix}-node-{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 10}"

    def start(self) -> None:
        self.remove()
        sh("docker", "network", "create", "--subnet", f"{self.subnet}.0/24", self.prefix)
        for i in range(1, self.count + 1):
            sh("docker", "run", "-d", "--name", self.name(i), "--hostname", f"node-{i}", "--network", self.prefix,
               "--ip", self.address(i), "-v", f"{self.keys / 'id.pub'}:/root/.ssh/authorized_keys:ro",
               "-v", f"{self.data}:{DATA}:ro", "--entrypoint", "sh", IMAGE, "-c",
               "mkdir -p /run/sshd && ssh-keygen -A >/dev/null && "
               "exec /usr/sbin/sshd -D -e -o PermitRootLogin=prohibit-password")
        for i in range(1, self.count + 1):
            for _ in range(60):
                if subprocess.run(["ssh", *ssh_opts(self.keys), f"root@{self.address(i)}", "true"],
                                  capture_output=True).returncode == 0:
                    break
                time.sleep(0.5)
            else:
                sys.exit(f"{self.name(i)} never answered over ssh")

    def remove(self) -> None:
        names = [self.name(i) for i in range(1, self.count + 1)]
        subprocess.run(["docker", "unpause", *names], capture_output=True)
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True)
        subprocess.run(["docker", "network", "rm", self.prefix], capture_output=True)

    def inventory(self, folder: Path) -> Path:
        hosts = {f"node-{i}": {"ansible_host": self.address(i)} for i in range(1, self.count + 1)}
        inv = {"all": {"children": {"torchfleet_nodes": {"hosts": hosts}}, "vars": {
            "ansible_user": "root", "ansible_ssh_private_key_file": str(self.keys / "id"),
            "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
            "ansible_python_interpreter": PYTHON, "launch_mode": "process", "launch_python": PYTHON,
            "launch_dataset_dir": f"{DATA}/fashion-mnist", "cpu_pinning": False, "launch_omp_num_threads": 1,
            "launch_stop_grace": 2, "launch_poll_interval": 1,
            "launch_max_restarts": 1, "launch_min_nodes": self.count - 1}}}
        path = folder / f"hosts-{self.count}.json"
        path.write_text(json.dumps(inv))
        return path

    def log(self, i: int, run_id: str, rank: int) -> str:
        """A unit log on node ``i`` (every attempt, each after the guard's banner)."""
        return subprocess.run(["docker", "exec", self.name(i), "cat", f"{RUNS}/{run_id}/{run_vocab.rank_log(rank)}"],
                              capture_output=True, text=True).stdout

    def pause(self, i: int) -> float:
        """Node ``i`` frozen whole (its ranks are processes inside it): the time it began."""
        at = time.time()
        # The freezer can fail while the node is busy ("unable to freeze"); it is tried again.
        for _ in range(10):
            if subprocess.run(["docker", "pause", self.name(i)], capture_output=True).returncode == 0:
                return at
            time.sleep(1)
        sys.exit(f"docker pause {self.name(i)} kept failing")

    def floor(self) -> float:
        """The workload's own start at this size: one fresh rank per node, all at once, each
        alone; from their start to the last one's first step."""
        argv = [PYTHON, "/tmp/mnist.py", "--data-dir", f"{DATA}/fashion-mnist", "--out-dir", "/tmp/floor",
                "--batch-size", "16", "--log-interval", "1", "--epoch", "1"]
        for i in range(1, self.count + 1):
            sh("docker", "cp", str(WORKLOAD), f"{self.name(i)}:/tmp/mnist.py")
        t0 = time.time()
        started = [subprocess.Popen(["docker", "exec", "-e", "OMP_NUM_THREADS=1", self.name(i), *argv],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                   for i in range(1, self.count + 1)]
        firsts = []
        for process in started:
            out, _ = process.communicate(timeout=BOUND)
            found = TRAINED.search(out)
            if not found:
                sys.exit(f"the floor's rank never trained: {out[-1000:]}")
            firsts.append(seconds(found[1]))
        return max(firsts) - t0


def attempts(log: str) -> list[str]:
    """A unit log cut at the guard's attempt banners: attempt 1's lines, then each later one's."""
    return re.split(r"^.*" + re.escape(run_vocab.ATTEMPT_BANNER) + r"\d+ of \d+.*$", log, flags=re.M)


def steps(part: str) -> list[tuple[float, int]]:
    """(time, global step) of each training step logged in one attempt's lines."""
    return [(seconds(stamp), (int(epoch) - 1) * int(per_epoch) + int(batch) + 1)
            for stamp, epoch, batch, per_epoch in TRAINED.findall(part)]


def wait_for(check, what: str, every: float = 1.0):
    """``check()`` until it gives something; None after BOUND seconds."""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    print(f"    gave up after {BOUND}s waiting for {what}", flush=True)
    return None


def recovered(nodes: Nodes, run_id: str, i: int, rank: int):
    """Once node ``i``'s unit of rank ``rank`` (its first attempt's) has trained in a second
    attempt: (first step's time, step resumed from, the steps done before the fault)."""
    parts = attempts(nodes.log(i, run_id, rank))
    if len(parts) < 2 or not steps(parts[1]):
        return None
    resumed = RESUMED.search(parts[1])
    done = steps(parts[0])
    return (steps(parts[1])[0][0], int(resumed[1] or resumed[2]) if resumed else None,
            done[-1][1] if done else 0)


def measure(nodes: Nodes, folder: Path) -> dict[str, float]:
    cluster = torchfleet.Cluster(str(nodes.inventory(folder)), runs_dir=folder / "runs", progress=False)
    count, out = nodes.count, {}

    def submit(case: str, node_timeout: int, *args: str) -> str:
        run = cluster.submit(Job(workload=WORKLOAD, name=f"recovery{count}", run_id=f"{case}-{count}",
                                 args=[*MNIST, *args], extra_vars={"launch_node_timeout": node_timeout}))
        return run.run_id

    def saved(run_id: str):
        return SAVED.search(nodes.log(1, run_id, 0))

    def record(case: str, fault_at: float | None, got) -> None:
        if fault_at is None or not got:
            out[f"{case}_s"], out[f"{case}_lost"] = float("nan"), float("nan")
        else:
            first, resumed, done = got
            out[f"{case}_s"] = first - fault_at
            out[f"{case}_lost"] = float("nan") if resumed is None else done - resumed
            print(f"  {count} nodes, {case}: step {done} done before the fault, resumed from {resumed}", flush=True)
        print(f"  {count} nodes, {case}: back to training in {out[f'{case}_s']:.1f}s, "
              f"{out[f'{case}_lost']:.0f} steps redone", flush=True)

    out["floor_s"] = nodes.floor()
    print(f"  {count} nodes: the workload's own start {out['floor_s']:.1f}s", flush=True)

    # A crash: the last rank, after CRASH_STEP; the next attempt runs on the same nodes.
    run_id = submit("crash", QUIET_NODE_TIMEOUT, "--crash-rank", str(count - 1), "--crash-at-step", str(CRASH_STEP))
    got = wait_for(lambda: recovered(nodes, run_id, 1, 0), "the crash's next attempt")
    crash = CRASHED.search(nodes.log(count, run_id, count - 1))
    record("crash", seconds(crash[1]) if crash else None, got)
    cluster.down()

    # A lost worker, then a lost master: frozen once rank 0 has saved a checkpoint. The next
    # attempt's rank 0 is node-1's unit of rank 0, then node-2's of rank 1.
    for case, frozen, watch, rank in (("worker", count, 1, 0), ("master", 1, 2, 1)):
        run_id = submit(case, NODE_TIMEOUT)
        lost_at = nodes.pause(frozen) if wait_for(lambda: saved(run_id), "a checkpoint") else None
        got = wait_for(lambda: recovered(nodes, run_id, watch, rank), f"the lost {case}'s next attempt") \
            if lost_at else None
        record(case, lost_at, got)
        sh("docker", "unpause", nodes.name(frozen), check=False)
        cluster.down()
    return out


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [3, 12]
    results = {}
    with tempfile.TemporaryDirectory(prefix="tfrecovery-") as tmp:
        folder = Path(tmp)
        keys = folder / "keys"
        keys.mkdir()
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "id"))
        data = folder / "data"
        make_dataset(data / "fashion-mnist")
        for count in sizes:
            nodes = Nodes(count, keys, data)
            print(f"starting {count} nodes ({IMAGE}, sshd only)", flush=True)
            try:
                nodes.start()
                results[count] = measure(nodes, folder)
            finally:
                nodes.remove()
    print(f"\nrecovery ({datetime.now():%Y-%m-%d %H:%M}, process mode, launch_max_restarts 1, launch_min_nodes "
          f"nodes-1, restart backoff and rejoin timeout at their defaults; node timeout {NODE_TIMEOUT}s for the "
          f"losses, {QUIET_NODE_TIMEOUT}s for the crash; a checkpoint every {CHECKPOINT_EVERY} steps; "
          f"2 shared cores)")
    header = f"{'nodes':>5} {'start floor s':>14} {'crash s':>8} {'goal s':>7} {'lost worker s':>14} " \
             f"{'lost master s':>14} {'goal s':>7}  {'redone: crash':>13} {'worker':>7} {'master':>7} {'goal':>5}"
    print(header)
    print("-" * len(header))
    for count in sizes:
        r = results[count]
        print(f"{count:>5} {r['floor_s']:>14.1f} {r['crash_s']:>8.1f} {10 + r['floor_s']:>7.1f} "
              f"{r['worker_s']:>14.1f} {r['master_s']:>14.1f} {NODE_TIMEOUT + 10 + r['floor_s']:>7.1f}  "
              f"{r['crash_lost']:>13.0f} {r['worker_lost']:>7.0f} {r['master_lost']:>7.0f} {CHECKPOINT_EVERY:>5}")
    print("goals: a crash back to training within 10 s plus the workload's own start (the floor); a lost node "
          f"within launch_node_timeout ({NODE_TIMEOUT} s) + 10 s plus that start; no more steps redone than one "
          "checkpoint interval")
    print("crash: from the crashing rank's last line to the next attempt's first step; lost: from the docker pause; "
          "redone: the steps done before the fault less the step resumed from (nan: it did not recover)")


if __name__ == "__main__":
    main()
