#!/usr/bin/env python3
"""Pinned against unpinned: the same 2-rank job on one docker host of the local cluster.

  pinned:   cpu_pinning on, one core and one thread per rank (what torchfleet plans);
  unpinned: no cpuset, OMP_NUM_THREADS = the node's CPUs, torch's own default, so two
            ranks run four threads on two cores.

Each variant runs --rounds times, alternating; throughput is rank 0's training steps per
second between its first and last logged step. Run from the repository root with the
venv active, after ./scripts/demo.sh (or playbooks/local_cluster.yml and site.yml).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from torchfleet.report import parse_steps, parse_time  # noqa: E402

RUNS = ROOT / ".torchfleet" / "bench" / "pinning-runs"


def launch(name: str, pinned: bool, epochs: int) -> float:
    extra = {
        "launch_job": "bench-pinning",
        "launch_run_id": name,
        "torchfleet_procs_per_node": 2,
        "cpu_pinning": pinned,
        "launch_omp_num_threads": 0 if pinned else os.cpu_count(),
        "launch_args": ["--epoch", str(epochs), "--log-interval", "1"],
    }
    out = subprocess.run(
        ["ansible-playbook", "playbooks/launch.yml", "--limit", "node-1", "-e", json.dumps(extra)],
        cwd=ROOT, env=dict(os.environ, TORCHFLEET_RUNS_DIR=str(RUNS)), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(out.stdout[-3000:] + out.stderr[-2000:])
    steps = parse_steps((RUNS / name / "rank-0.log").read_text())
    seconds = (parse_time(steps[-1]["time"]) - parse_time(steps[0]["time"])).total_seconds()
    return (len(steps) - 1) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    results: dict[str, list[float]] = {"pinned": [], "unpinned": []}
    for i in range(args.rounds):
        for variant in ("pinned", "unpinned"):
            rate = launch(f"{variant}-{i}", variant == "pinned", args.epochs)
            results[variant].append(rate)
            print(f"  round {i + 1} {variant:<9} {rate:6.2f} steps/s", flush=True)
    pinned, unpinned = (statistics.median(results[k]) for k in ("pinned", "unpinned"))
    print(f"\n{'variant':<12}{'median steps/s':>16}")
    print(f"{'pinned':<12}{pinned:>16.2f}\n{'unpinned':<12}{unpinned:>16.2f}")
    print(f"\nthroughput ratio pinned / unpinned: {pinned / unpinned:.2f}")


if __name__ == "__main__":
    main()
