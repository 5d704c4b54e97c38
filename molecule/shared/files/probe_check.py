#!/usr/bin/env python3
"""Compare what every rank of a probe job saw (tests/fixtures/workloads/probe) twice: with
facts read independently from the nodes, and with a plan taken before the launch, key by
key. Exits 1 listing every mismatch.

    probe_check.py PLAN_JSON RUN_DIR FACTS_JSON

FACTS_JSON maps each node to {"ip_addr": `ip -j addr`, "route": `ip -j route get
MASTER_ADDR`, "allowed": the CPUs it may use, "cores": {cpu: core id}}.
"""

import json
import re
import sys
from pathlib import Path

LINE = re.compile(r"TORCHFLEET-PROBE (\{.*\})")


def cpus(text):
    out = set()
    for part in str(text).split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out.update(range(int(lo), int(hi) + 1))
        elif part.strip():
            out.add(int(part))
    return out


def main(plan_path, run_dir, facts_path):
    plan = json.loads(Path(plan_path).read_text())
    plan = plan.get("plan", plan)
    facts = json.loads(Path(facts_path).read_text())
    seen = {}
    errors = []
    for log in sorted(Path(run_dir).glob("rank-*.log")):
        for match in LINE.finditer(log.read_text(errors="replace")):
            try:
                report = json.loads(match[1])
            except ValueError as exc:
                errors.append(f"{log.name}: the probe's report is not whole JSON ({exc})")
                continue
            seen[report["rank"]] = report
    n = plan["world_size"]

    # Independent facts.
    if sorted(seen) != list(range(n)):
        errors.append(f"ranks reported {sorted(seen)}, not a permutation of 0..{n - 1}")
    for rank, r in seen.items():
        if r["rank_sum"] != n * (n - 1) // 2:
            errors.append(f"rank {rank}: allreduce of the ranks gave {r['rank_sum']}, not {n * (n - 1) // 2}")
        if int(r["env"].get("RANK", -1)) != rank or int(r["env"].get("WORLD_SIZE", -1)) != n:
            errors.append(f"rank {rank}: RANK/WORLD_SIZE in its environment are {r['env'].get('RANK')}/"
                          f"{r['env'].get('WORLD_SIZE')}")
    master = seen.get(0, {}).get("hostname")
    if master:
        master_addrs = {a["local"] for i in facts[master]["ip_addr"] for a in i.get("addr_info", [])}
        for rank, r in seen.items():
            addr = r["env"].get("MASTER_ADDR")
            if addr not in master_addrs:
                errors.append(f"rank {rank}: MASTER_ADDR={addr} is not an address of {master} ({sorted(master_addrs)})")
            route = facts[r["hostname"]]["route"]
            dev = route[0]["dev"] if route else None
            if dev == "lo":
                # The master routes its own address through lo; Gloo binds the device that holds it.
                dev = next((i["ifname"] for i in facts[r["hostname"]]["ip_addr"]
                            for a in i.get("addr_info", []) if a["local"] == addr), dev)
            if r["env"].get("GLOO_SOCKET_IFNAME") != dev:
                errors.append(f"rank {rank} on {r['hostname']}: GLOO_SOCKET_IFNAME={r['env'].get('GLOO_SOCKET_IFNAME')}"
                              f" but the node routes MASTER_ADDR through {dev}")
    by_node = {}
    for rank, r in seen.items():
        by_node.setdefault(r["hostname"], []).append(r)
    for node, ranks in by_node.items():
        allowed = cpus(facts[node]["allowed"])
        cores = {int(c): k for c, k in facts[node]["cores"].items()}
        taken = set()
        for r in sorted(ranks, key=lambda r: r["rank"]):
            mine = set(r["affinity"])
            if not mine <= allowed:
                errors.append(f"rank {r['rank']} on {node}: runs on {sorted(mine)}, outside the allowed {sorted(allowed)}")
            whole = {c for c in allowed if cores.get(c) in {cores.get(m) for m in mine}}
            if whole != mine:
                errors.append(f"rank {r['rank']} on {node}: {sorted(mine)} is not whole cores ({sorted(whole)})")
            if mine & taken:
                errors.append(f"rank {r['rank']} on {node}: shares CPUs {sorted(mine & taken)} with another rank")
            taken |= mine

    # The plan, key by key.
    for p in plan["ranks"]:
        r = seen.get(p["rank"])
        if r is None:
            continue
        where = f"rank {p['rank']}"
        if r["hostname"] != p["host"]:
            errors.append(f"{where}: ran on {r['hostname']}, planned on {p['host']}")
        for key, value in p["env"].items():
            if key in p["secret_env"]:
                continue
            if r["env"].get(key) != value:
                errors.append(f"{where}: {key}={r['env'].get(key)!r}, planned {value!r}")
        for key in p["runner_env"]:
            if key not in r["env"]:
                errors.append(f"{where}: {key} missing; the plan says {p['runner']} sets it")
        script = r["argv"][0]
        tail = next((p["argv"][i:] for i in range(len(p["argv"])) if p["argv"][i] == script), None)
        if tail != r["argv"]:
            errors.append(f"{where}: ran {r['argv']}, planned {p['argv']}")
        if r["cwd"] != p["workdir"]:
            errors.append(f"{where}: working directory {r['cwd']}, planned {p['workdir']}")
        if p["cpuset"] and cpus(p["cpuset"]) != set(r["affinity"]):
            errors.append(f"{where}: affinity {r['affinity']}, planned cpuset {p['cpuset']}")
        if p["runner"] == "container" and p["cpuset"] and cpus(r["cgroup_cpus"] or "") != cpus(p["cpuset"]):
            errors.append(f"{where}: its container's cgroup holds CPUs {r['cgroup_cpus']}, planned {p['cpuset']}")
        if str(p["threads"]) != r["env"].get("OMP_NUM_THREADS"):
            errors.append(f"{where}: OMP_NUM_THREADS={r['env'].get('OMP_NUM_THREADS')}, planned {p['threads']}")
        if p["user"] and int(str(p["user"]).split(":")[0]) != r["uid"]:
            errors.append(f"{where}: uid {r['uid']}, planned user {p['user']}")
        missing = [path for path, there in r["paths"].items() if not there]
        if missing:
            errors.append(f"{where}: does not see {missing}")

    for rank in sorted(seen):
        r = seen[rank]
        print(f"rank {rank} on {r['hostname']}: affinity {r['affinity']} MASTER_ADDR {r['env'].get('MASTER_ADDR')} "
              f"GLOO_SOCKET_IFNAME {r['env'].get('GLOO_SOCKET_IFNAME')} cwd {r['cwd']} uid {r['uid']}")
    for e in errors:
        print("MISMATCH " + e)
    return 1 if errors or not seen else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
