#!/usr/bin/env python3
"""Compare the affinities a node's ranks reported from inside themselves with what this test
works out from the node itself, without torchfleet's allocator.

Usage: affinity_check.py [--hyperthreads] RANKS [REPORTED ...]
REPORTED are the ranks' CPU lists in local-rank order. The test's own rule: the node's online
CPUs (lscpu -p) that its affinity allows, grouped into physical cores, one CPU per core unless
--hyperthreads, in (NUMA node, CPU) order; each rank takes the next cores // RANKS of them.
Where NUMA nodes are equal in size, that is where the allocator must put them too. Prints
JSON (expected, reported, problems) and exits 1 when there is a problem.
"""

import json
import os
import subprocess
import sys


def cpulist(text):
    cpus = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def main(argv):
    hyperthreads = "--hyperthreads" in argv
    args = [a for a in argv if a != "--hyperthreads"]
    ranks, reported = int(args[0]), [cpulist(a) for a in args[1:]]
    allowed = os.sched_getaffinity(0)
    out = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET,NODE"], check=True, capture_output=True, text=True).stdout
    core_of, cores = {}, {}
    for line in out.splitlines():
        if line.startswith("#"):
            continue
        cpu, core, socket, node = line.split(",")[:4]
        if int(cpu) in allowed:
            key = (socket, core)
            core_of[int(cpu)] = key
            cores.setdefault(key, {"node": int(node or -1), "cpus": []})["cpus"].append(int(cpu))
    ordered = sorted(cores.values(), key=lambda c: (c["node"], min(c["cpus"])))
    per = len(ordered) // ranks
    expected = [sorted(c for core in ordered[i * per:(i + 1) * per]
                       for c in (core["cpus"] if hyperthreads else sorted(core["cpus"])[:1]))
                for i in range(ranks)]
    problems = []
    if reported != expected:
        problems.append(f"the ranks reported {reported}, the node's topology gives {expected}")
    owner = {}
    for index, cpus in enumerate(reported):
        keys = [core_of.get(c) for c in cpus]
        if None in keys:
            problems.append(f"local rank {index} runs on CPUs outside the node's online, allowed ones: {cpus}")
            continue
        if not hyperthreads and len(set(keys)) != len(keys):
            problems.append(f"local rank {index} has two threads of one core: {cpus}")
        for key in set(keys):
            if owner.setdefault(key, index) != index:
                problems.append(f"local ranks {owner[key]} and {index} share core {key}")
    print(json.dumps({"expected": expected, "reported": reported, "problems": problems}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
