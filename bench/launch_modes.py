#!/usr/bin/env python3
"""Compare the four launch modes on one local cluster, measured in one run.

Two docker hosts, two ranks each (WORLD_SIZE 4), the same job in every mode:
  - launch: from the call to rank 0's first training step, and the whole launch;
  - training: rank 0's steps per second between its first and last step.
Each mode runs twice, the modes alternating, and the median counts. Ratios are against
the container mode. Driven through torchfleet's Python API.

Run from the repository root with the venv active: python bench/launch_modes.py
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import torchfleet
from torchfleet.report import parse_steps, parse_time

ROOT = Path(__file__).resolve().parents[1]

NAME = "torchfleet-bench-modes"
STATE = ROOT / ".torchfleet"
ENV = {"TORCHFLEET_STATE_DIR": str(STATE)}
MODES = ["container", "torchrun", "mpirun", "process"]
ROUNDS = 2
ARGS = ["--epoch", "2", "--seed", "42", "--no-cuda", "--log-interval", "2"]


def measure(cluster: torchfleet.Cluster, mode: str) -> dict[str, float]:
    started = time.time()
    run = cluster.launch(torchfleet.Job(args=ARGS, name=f"bench-{mode}",
                                        extra_vars={"launch_mode": mode, "torchfleet_procs_per_node": 2}))
    whole = time.time() - started
    steps = parse_steps(run.ranks[0].log())
    first, last = parse_time(steps[0]["time"]), parse_time(steps[-1]["time"])
    return {
        "to_first_step": first.timestamp() - started,
        "launch": whole,
        "steps_per_s": (steps[-1]["step"] - steps[0]["step"]) / max((last - first).total_seconds(), 1e-9),
        "checksums_equal": run.checksums_equal,
    }


def main() -> None:
    print(f"local cluster {NAME}: 2 docker hosts", flush=True)
    cluster, _ = torchfleet.local_up(2, name=NAME, subnet="172.29.8.0/24", inventory_dir=STATE / "bench-modes" / "inventory",
                                     runs_dir=STATE / "bench-modes" / "runs", env=ENV)
    try:
        # One provision serves every mode: the image, the ssh mesh and the venv.
        cluster.provision(launch_mode="mpirun", torchfleet_python_env=True)
        results: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for round_ in range(ROUNDS):
            for mode in MODES if round_ % 2 == 0 else reversed(MODES):
                results[mode].append(measure(cluster, mode))
    finally:
        torchfleet.local_down(name=NAME, inventory_dir=STATE / "bench-modes" / "inventory", env=ENV)

    med = {m: {k: statistics.median(r[k] for r in rs) for k in ("to_first_step", "launch", "steps_per_s")}
           for m, rs in results.items()}
    base = med["container"]
    print(f"\n{'mode':<10} {'to first step':>14} {'ratio':>6} {'whole launch':>13} {'ratio':>6} "
          f"{'steps/s':>8} {'ratio':>6}  checksums equal")
    for mode in MODES:
        m = med[mode]
        print(f"{mode:<10} {m['to_first_step']:>13.1f}s {m['to_first_step'] / base['to_first_step']:>6.2f} "
              f"{m['launch']:>12.1f}s {m['launch'] / base['launch']:>6.2f} {m['steps_per_s']:>8.1f} "
              f"{m['steps_per_s'] / base['steps_per_s']:>6.2f}  "
              f"{all(r['checksums_equal'] for r in results[mode])}")
    print(f"\n(median of {ROUNDS} runs per mode, WORLD_SIZE 4 on 2 docker hosts sharing this machine's "
          f"{os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
