#!/usr/bin/env python3
"""CPU pinning on one node, measured in one run: torchfleet's pinning against none, against
PyTorch's own single-node launcher, and with each memory allocator.

Every variant runs the same --ranks processes at once, each training the FashionMNIST CNN of
files/workloads/mnist.py on random batches, over the same wall-clock window (after a warm-up,
from a common start time). Two measures: throughput, the samples per second of all of them
together, and samples per CPU-second the processes used; the second holds up better on a
machine that other work shares. Ratios are the median over rounds of the two variants'
ratio in the same round (the order of the variants flips every round).

  unpinned      no affinity, torch's default thread count (the node's cores) in every process;
  torchfleet    each process under `taskset` with the cpuset and OMP_NUM_THREADS that
                torchfleet.cpus.allocate() gives it from this node's lscpu, affinity and
                memory nodes, as the process mode launches it;
  run_cpu       `python -m torch.backends.xeon.run_cpu` with the same cores (--core-list, one
                instance per rank, its default numactl binding) and the default allocator;
  +jemalloc / +tcmalloc   torchfleet's pinning with the allocator preloaded as the launch
                preloads it (launch_malloc: the environment comes from torchfleet.settings.malloc_env,
                the function every launch mode uses), when installed (Debian's libjemalloc2,
                libgoogle-perftools4).

The variants alternate for --rounds rounds and the median counts. Needs torch in the venv
(`pip install torch==2.13.0`). Run from the repository root: python bench/pinning.py

With --launch, the allocators are measured once more through torchfleet's own launch: one local
docker host (made and removed by the bench) runs --ranks pinned rank containers of the same
worker, one launch per variant and round, with launch_malloc default, tcmalloc and jemalloc;
each rank's rate comes from its log. That needs no torch here, only the local cluster's images.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from torchfleet import cpus, settings
except ImportError:  # the worker, when a launch runs this file in the training image, needs neither
    cpus = settings = None

HERE = Path(__file__).resolve()
# --launch: a local docker host of the bench's own, apart from every test cluster.
LAUNCH_NAME, LAUNCH_SUBNET = "torchfleet-bench-malloc", "172.29.10.0/24"


def worker(args: argparse.Namespace) -> None:
    """One process: warm up, wait for the common start, train for --seconds, write the rate."""
    import importlib.util

    import torch
    import torch.nn.functional as F

    # The bundled workload's own CNN, loaded by path so the bench measures exactly that model.
    # Beside this file where a launch sent both, else the repository's.
    path = next(p for p in (HERE.parent / "mnist.py", HERE.parents[1] / "files" / "workloads" / "mnist.py")
                if p.exists())
    module_spec = importlib.util.spec_from_file_location("mnist", path)
    mnist = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(mnist)
    Net = mnist.Net

    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    data, target = torch.randn(args.batch, 1, 28, 28), torch.randint(0, 10, (args.batch,))

    def step():
        optimizer.zero_grad()
        F.nll_loss(model(data), target).backward()
        optimizer.step()

    for _ in range(5):
        step()
    time.sleep(max(0.0, args.start_at - time.time()))
    steps, t0, c0 = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < args.seconds:
        step()
        steps += 1
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    affinity = sorted(os.sched_getaffinity(0))
    result = {"samples": steps * args.batch, "rate": steps * args.batch / wall, "cpu_s": cpu,
              "affinity": cpus.format_cpulist(affinity) if cpus else ",".join(map(str, affinity)),
              "threads": torch.get_num_threads(), "preload": os.environ.get("LD_PRELOAD", "")}
    Path(args.out, f"{os.getpid()}.json").write_text(json.dumps(result))
    if os.environ.get("TORCHFLEET_RUN_ID"):
        # A launched worker's result reaches the bench through its rank's log.
        print(f"bench-result {json.dumps(result)}", flush=True)


def node_plan(ranks: int) -> list[dict]:
    """torchfleet's plan for this node, from the facts its cpu_topology module reads."""
    lscpu = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET,NODE,ONLINE", "--all"], check=True,
                           capture_output=True, text=True).stdout
    memory = None
    for name in ("has_memory", "online"):
        path = Path("/sys/devices/system/node", name)
        if path.exists():
            memory = path.read_text().strip()
            break
    return cpus.allocate("this node", cpus.parse_lscpu(lscpu), ranks, allowed=sorted(os.sched_getaffinity(0)),
                         memory_nodes=memory)


def run_variant(name: str, plan: list[dict], args: argparse.Namespace) -> tuple[float, float, list[dict]]:
    out = tempfile.mkdtemp(prefix="torchfleet-bench-pinning-")
    start_at = time.time() + args.warmup
    me = [sys.executable, "-u", str(HERE), "--worker", "--out", out, "--start-at", str(start_at),
          "--seconds", str(args.seconds), "--batch", str(args.batch)]
    base = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "LD_PRELOAD", "MALLOC_CONF")}
    procs = []
    # Each process in its own session, as rank_processes and run_cpu start them: with the
    # kernel's autogroup scheduling, processes sharing a session share one CPU share.
    if name == "unpinned":
        procs = [subprocess.Popen(me, env=base, start_new_session=True) for _ in plan]
    elif name == "run_cpu":
        # The same cores as torchfleet's plan, one instance per rank.
        cores = [c for p in plan for c in cpus.parse_cpulist(p["cpuset"])]
        cmd = [sys.executable, "-m", "torch.backends.xeon.run_cpu", "--ninstances", str(len(plan)),
               "--ncores-per-instance", str(len(cores) // len(plan)), "--core-list", ",".join(map(str, cores)),
               "--use-default-allocator", "--log-path", out, str(HERE)] + me[3:]
        procs = [subprocess.Popen(cmd, env=base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    else:
        env = dict(base)
        if name != "torchfleet":
            env.update(settings.malloc_env(name.lstrip("+"), env))
        for p in plan:
            procs.append(subprocess.Popen(["taskset", "--cpu-list", p["cpuset"]] + me, start_new_session=True,
                                          env=dict(env, OMP_NUM_THREADS=str(p["omp_num_threads"]))))
    for proc in procs:
        if proc.wait() != 0:
            sys.exit(f"{name}: a process exited with {proc.returncode}")
    results = [json.loads(Path(f).read_text()) for f in sorted(glob.glob(f"{out}/*.json"))]
    if len(results) != len(plan):
        sys.exit(f"{name}: {len(results)} of {len(plan)} processes reported")
    return sum(r["rate"] for r in results), sum(r["samples"] for r in results) / sum(r["cpu_s"] for r in results), results


def library(name: str) -> str:
    """Where the loader finds launch_malloc ``name``'s library on this machine, or ''."""
    soname = settings.ALLOCATORS[name]["library"]
    found = glob.glob(f"/usr/lib/*/{soname}") + glob.glob(f"/usr/lib/{soname}")
    return found[0] if found else ""


def launched(args: argparse.Namespace) -> dict[str, list[tuple[float, float]]]:
    """(samples/s, samples per CPU-s) of each launch_malloc, each round, through torchfleet's
    own launch: --ranks pinned rank containers of this worker on one local docker host."""
    import torchfleet

    state = HERE.parents[1] / ".torchfleet"
    folder = Path(tempfile.mkdtemp(prefix="torchfleet-bench-malloc-"))
    (folder / "pinning.py").write_text(HERE.read_text())
    (folder / "mnist.py").write_text((HERE.parents[1] / "files" / "workloads" / "mnist.py").read_text())
    inventory = state / "bench-malloc" / "inventory"
    env = {"TORCHFLEET_STATE_DIR": str(state)}
    print(f"\nthrough torchfleet's launch: local cluster {LAUNCH_NAME}, 1 docker host, {args.ranks} ranks", flush=True)
    cluster, _ = torchfleet.local_up(1, name=LAUNCH_NAME, subnet=LAUNCH_SUBNET, inventory_dir=inventory,
                                     runs_dir=state / "bench-malloc" / "runs", env=env)
    variants = ["default", *settings.ALLOCATORS]
    measured: dict[str, list[tuple[float, float]]] = {v: [] for v in variants}
    try:
        cluster.provision()
        for i in range(args.rounds):
            for malloc in variants if i % 2 == 0 else variants[::-1]:
                # The ranks start together (one node, one phase); each warms up, then measures.
                run = cluster.launch(torchfleet.Job(
                    workload=folder, entrypoint="pinning.py", name="bench-malloc",
                    args=["--worker", "--out", "{out_dir}", "--start-at", "0", "--seconds", str(args.seconds),
                          "--batch", str(args.batch)],
                    extra_vars={"launch_malloc": malloc, "torchfleet_procs_per_node": args.ranks,
                                "cpu_pinning": True}))
                results = [json.loads(line.split(" ", 1)[1]) for r in run.ranks for line in r.log().splitlines()
                           if line.startswith("bench-result ")]
                if len(results) != args.ranks:
                    sys.exit(f"launch_malloc={malloc}: {len(results)} of {args.ranks} ranks reported")
                rate = sum(r["rate"] for r in results)
                measured[malloc].append((rate, sum(r["samples"] for r in results) / sum(r["cpu_s"] for r in results)))
                print(f"  round {i + 1}  launch_malloc={malloc:<9} {rate:8.1f} samples/s  preload "
                      f"{results[0]['preload'] or '-'}", flush=True)
    finally:
        torchfleet.local_down(name=LAUNCH_NAME, inventory_dir=inventory, env=env)
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2, help="processes per variant")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="measured window per round")
    parser.add_argument("--warmup", type=float, default=12.0, help="seconds until the common start")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--launch", action="store_true",
                        help="also measure launch_malloc through torchfleet's own launch on a local docker host")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    plan = node_plan(args.ranks)
    variants = ["unpinned", "torchfleet", "run_cpu"]
    missing = [n for n in settings.ALLOCATORS if not library(n)]
    variants += [f"+{n}" for n in settings.ALLOCATORS if n not in missing]
    print(f"{args.ranks} ranks on {os.cpu_count()} CPUs; torchfleet's plan: "
          + ", ".join(f"{p['cpuset']} ({p['omp_num_threads']} threads, mems {p['cpuset_mems'] or '-'})" for p in plan))
    if missing:
        print(f"not installed, so not measured: {', '.join(missing)} (Debian: libjemalloc2, libgoogle-perftools4)")
    rates: dict[str, list[float]] = {v: [] for v in variants}
    per_cpu: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(args.rounds):
        for name in variants if i % 2 == 0 else variants[::-1]:
            rate, efficiency, results = run_variant(name, plan, args)
            rates[name].append(rate)
            per_cpu[name].append(efficiency)
            seen = " ".join(f"[{r['affinity']}:{r['threads']}t]" for r in results)
            print(f"  round {i + 1}  {name:<11} {rate:8.1f} samples/s {efficiency:8.1f} per CPU-s  "
                  f"affinity:threads {seen}  load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\n{'variant':<12}{'samples/s':>12}{'per CPU-s':>12}   (medians)")
    for name in variants:
        print(f"{name:<12}{statistics.median(rates[name]):>12.1f}{statistics.median(per_cpu[name]):>12.1f}")
    print(f"\n{'ratio':<40}{'samples/s':>10}{'per CPU-s':>11}")
    ratios = [("torchfleet / unpinned", "torchfleet", "unpinned"),
              ("torchfleet / run_cpu (goal >= 0.95)", "torchfleet", "run_cpu")]
    ratios += [(f"torchfleet {v} / default malloc", v, "torchfleet") for v in variants if v.startswith("+")]
    for label, a, b in ratios:
        wall = statistics.median(x / y for x, y in zip(rates[a], rates[b]))
        cpu = statistics.median(x / y for x, y in zip(per_cpu[a], per_cpu[b]))
        print(f"{label:<40}{wall:>10.2f}{cpu:>11.2f}")
    if args.launch:
        measured = launched(args)
        for malloc in settings.ALLOCATORS:
            wall = statistics.median(x[0] / y[0] for x, y in zip(measured[malloc], measured["default"]))
            cpu = statistics.median(x[1] / y[1] for x, y in zip(measured[malloc], measured["default"]))
            print(f"{'launch_malloc ' + malloc + ' / default':<40}{wall:>10.2f}{cpu:>11.2f}")


if __name__ == "__main__":
    main()
