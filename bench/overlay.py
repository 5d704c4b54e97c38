#!/usr/bin/env python3
"""Training steps/s and allreduce bandwidth over the WireGuard overlay against plain TCP.

Two docker hosts, one rank each, on one local cluster provisioned with the overlay. Each
round runs, per transport (tcp: the cluster network; wireguard: the overlay):
  - the training job (files/workloads/mnist.py): rank 0's steps per second between its
    first and last logged step;
  - files/workloads/collectives.py: rank 0's allreduce bandwidth (MiB of tensor per second).
The transports alternate over the rounds, and the median counts. Driven through
torchfleet's Python API.

Run from the repository root with the venv active:
  python bench/overlay.py [--name CLUSTER --subnet CIDR --rounds N]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
from pathlib import Path

import torchfleet
from torchfleet.report import parse_steps, parse_time

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".torchfleet"
ENV = {"TORCHFLEET_STATE_DIR": str(STATE)}
TRANSPORTS = ["tcp", "wireguard"]
TRAIN_ARGS = ["--epoch", "2", "--seed", "42", "--no-cuda", "--log-interval", "2"]
ALLREDUCE_MIB, ALLREDUCE_ITERS = 16, 10
BANDWIDTH = re.compile(r"allreduce: .* ([0-9.]+) MiB/s")


def train(cluster: torchfleet.Cluster, transport: str) -> tuple[float, bool]:
    run = cluster.launch(torchfleet.Job(args=TRAIN_ARGS, name=f"bench-train-{transport}",
                                        extra_vars={"launch_transport": transport}))
    steps = parse_steps(run.ranks[0].log())
    first, last = parse_time(steps[0]["time"]), parse_time(steps[-1]["time"])
    return (steps[-1]["step"] - steps[0]["step"]) / max((last - first).total_seconds(), 1e-9), run.checksums_equal


def allreduce(cluster: torchfleet.Cluster, transport: str) -> tuple[float, bool]:
    run = cluster.launch(torchfleet.Job(
        workload=ROOT / "files" / "workloads" / "collectives.py", name=f"bench-allreduce-{transport}",
        args=["--size-mib", str(ALLREDUCE_MIB), "--iters", str(ALLREDUCE_ITERS)],
        extra_vars={"launch_transport": transport}))
    found = BANDWIDTH.search(run.ranks[0].log())
    if not found:
        raise SystemExit(f"no allreduce bandwidth in rank 0's log of run {run.run_id}")
    return float(found.group(1)), run.checksums_equal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="torchfleet-bench-overlay", help="the local cluster's name")
    parser.add_argument("--subnet", default="172.29.9.0/24", help="its docker network")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    inventory = STATE / args.name / "inventory"
    print(f"local cluster {args.name}: 2 docker hosts on {args.subnet}", flush=True)
    cluster, _ = torchfleet.local_up(2, name=args.name, subnet=args.subnet, inventory_dir=inventory,
                                     runs_dir=STATE / args.name / "runs", env=ENV)
    results: dict[str, dict[str, list]] = {t: {"steps": [], "mib": [], "equal": []} for t in TRANSPORTS}
    try:
        # One provision serves both transports: the tcp runs ignore the overlay.
        cluster.provision(launch_transport="wireguard")
        for round_ in range(args.rounds):
            for transport in TRANSPORTS if round_ % 2 == 0 else reversed(TRANSPORTS):
                steps, equal_train = train(cluster, transport)
                mib, equal_reduce = allreduce(cluster, transport)
                results[transport]["steps"].append(steps)
                results[transport]["mib"].append(mib)
                results[transport]["equal"] += [equal_train, equal_reduce]
    finally:
        torchfleet.local_down(name=args.name, inventory_dir=inventory, env=ENV)

    med = {t: {k: statistics.median(r[k]) for k in ("steps", "mib")} for t, r in results.items()}
    tcp, wg = med["tcp"], med["wireguard"]
    print(f"\n{'':<28} {'tcp':>10} {'wireguard':>10} {'ratio':>7}")
    print(f"{'training steps/s':<28} {tcp['steps']:>10.2f} {wg['steps']:>10.2f} {wg['steps'] / tcp['steps']:>7.2f}")
    print(f"{f'allreduce {ALLREDUCE_MIB} MiB, MiB/s':<28} {tcp['mib']:>10.1f} {wg['mib']:>10.1f} "
          f"{wg['mib'] / tcp['mib']:>7.2f}")
    print(f"{'checksums equal on all ranks':<28} {str(all(results['tcp']['equal'])):>10} "
          f"{str(all(results['wireguard']['equal'])):>10}")
    ratio = wg["steps"] / tcp["steps"]
    print(f"\n(median of {args.rounds} runs per transport, 2 ranks on 2 docker hosts sharing this machine's "
          f"{os.cpu_count()} CPUs, wireguard-go in userspace.) Training step rate over the overlay: "
          f"{ratio:.2f} of plain TCP; the goal is at least 0.80: {'met' if ratio >= 0.8 else 'NOT met'}.")


if __name__ == "__main__":
    main()
