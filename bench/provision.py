#!/usr/bin/env python3
"""Time torchfleet's steps on a fresh local cluster and print them as ratios.

Measured in one run, on a cluster of its own (torchfleet-bench):
  - local cluster creation (images cached), and its re-run;
  - site.yml on fresh nodes (engine, 1.1 GB image load, dataset), and its re-run;
  - launch: from `ansible-playbook launch.yml` to rank 0's first training step, against
    the same job started by hand, one `docker run` per node, rank 0 first; with the
    default start (the other nodes' ranks once MASTER_PORT listens) and with every rank
    at once (launch_wait_master_listen: false). ROUNDS rounds, the three alternating, and
    the median counts: one launch varies by half a second here. The slowest tasks of the
    first default launch say where its time goes;
  - the launch's floor on this machine: the hand-typed loop plus a playbook that does
    nothing but what a launch cannot do without, one bare module run per node for each
    of its controller's phases (the check, the start), through the same ansible-playbook.
    On 2 shared cores Ansible's own start and its module runs cost more than the goal's
    half of the hand-typed time, so the launch is also given as a ratio to that floor.
    A second floor starts through community.docker's docker_container, as a launch must
    (the role uses the field library, not a shell `docker run`): a bare module run per
    node for the check, then one container per node, started detached, running `true`.

Its cluster is ${TORCHFLEET_TEST_PREFIX}-bench on ${TORCHFLEET_TEST_SUBNET_BASE}.3.0/24 when
those are set (torchfleet-bench and 172.29 otherwise), so that it can run beside the tests.

Run from the repository root with the venv active: python bench/provision.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from torchfleet.report import parse_steps, parse_time
from torchfleet import run_vocab

ROOT = Path(__file__).resolve().parents[1]

NAME = f"{os.environ['TORCHFLEET_TEST_PREFIX']}-bench" if os.environ.get("TORCHFLEET_TEST_PREFIX") \
    else "torchfleet-bench"
STATE = ROOT / ".torchfleet"
BENCH = STATE / "bench" / NAME
INV_DIR = BENCH / "inventory"
ENV = dict(os.environ, TORCHFLEET_STATE_DIR=str(STATE), TORCHFLEET_RUNS_DIR=str(BENCH / "runs"))
CLUSTER_VARS = [
    "-e", f"local_cluster_name={NAME}",
    "-e", f"local_cluster_subnet={os.environ.get('TORCHFLEET_TEST_SUBNET_BASE', '172.29')}.3.0/24",
    "-e", f"local_cluster_inventory={INV_DIR / 'hosts.yml'}",
]


LAST_OUTPUT = [""]


def run(*args: str, quiet: bool = True, env: dict[str, str] | None = None) -> float:
    t0 = time.monotonic()
    print("  $", " ".join(args), flush=True)
    out = subprocess.run(args, cwd=ROOT, env={**ENV, **(env or {})}, capture_output=quiet, text=True)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}):\n{(out.stdout or '')[-3000:]}")
    LAST_OUTPUT[0] = out.stdout or ""
    return time.monotonic() - t0


def playbook(*args: str, env: dict[str, str] | None = None) -> float:
    return run("ansible-playbook", *args, env=env)


def launch_to_first_step(inv: list[str], *extra: str) -> tuple[float, float]:
    """The launch's wall time, and from its start to rank 0's first step."""
    start = datetime.now(timezone.utc)
    total = playbook("playbooks/launch.yml", *inv, "-e", '{"launch_args": ["--epoch", "1"]}', *extra,
                     env={"ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.profile_tasks", "ANSIBLE_NOCOLOR": "1"})
    runs = sorted((BENCH / "runs").iterdir(), key=lambda p: p.stat().st_mtime)
    return total, (first_step((runs[-1] / run_vocab.rank_log(0)).read_text()) - start).total_seconds()


def slowest_tasks(output: str, count: int = 8) -> list[str]:
    """profile_tasks' recap: 'role : task ---- 1.23s', slowest first."""
    recap = output.split("TASKS RECAP", 1)[-1].splitlines()
    return [line.strip() for line in recap if line.rstrip().endswith("s") and " --" in line][:count]


# The check: one bare module run per node; then the start, bare or through docker_container.
FLOOR_CHECK = """
- hosts: torchfleet_nodes
  gather_facts: false
  tasks:
    - name: the check on every node
      ansible.builtin.ping: {}
"""
FLOOR_PLAYBOOK = FLOOR_CHECK + """
    - name: the start on every node
      ansible.builtin.ping: {}
"""
FLOOR_CONTAINER_PLAYBOOK = FLOOR_CHECK + """
    - name: the start on every node, through docker_container
      community.docker.docker_container:
        name: tf-floor
        image: torchfleet/train:2.13.0-cpu
        command: ["true"]
        network_mode: host
        detach: true
        state: started
        container_default_behavior: no_defaults
"""


def launch_floor(inv: list[str], text: str = FLOOR_PLAYBOOK, name: str = "launch_floor") -> float:
    """Wall seconds of a floor playbook (the median of three)."""
    book = BENCH / f"{name}.yml"
    book.write_text(text)
    walls = []
    for _ in range(3):
        walls.append(playbook(str(book), *inv))
        for i in (1, 2, 3):
            subprocess.run(["docker", "exec", f"{NAME}-node-{i}", "docker", "rm", "-f", "tf-floor"], capture_output=True)
    return sorted(walls)[1]


ROUNDS = 3
# The figures before issue 60's work (bench/provision.py at cc9efe2), and the ratios before
# issue 44's (at 5fff6a8).
SECONDS_BASELINE = {"site.yml first": 62.8, "site.yml again": 17.2, "launch to first step": 12.6,
                    "docker run by hand to first step": 5.5, "launch floor, docker_container start": 8.7}
BASELINE = {"site.yml again / site.yml first": (0.27, 0.15),
            "launch to first step / docker run by hand": (2.29, 2.91),
            "  without the MASTER_PORT wait / docker run by hand": (None, 2.18),
            "launch to first step / docker_container floor": (1.46, None)}


def first_step(log: str) -> datetime:
    return parse_time(parse_steps(log)[0]["time"])


def by_hand() -> float:
    """The guides' way: one docker run per node, rank 0 first, then the others."""
    hosts = json.loads(subprocess.run(
        ["ansible-inventory", "-i", str(INV_DIR), "--list"], cwd=ROOT, env=ENV, capture_output=True, text=True,
        check=True).stdout)
    addrs = [hosts["_meta"]["hostvars"][f"node-{i}"]["ansible_host"] for i in (1, 2, 3)]
    start = datetime.now(timezone.utc)
    for rank, addr in enumerate(addrs):
        subprocess.run([
            "docker", "exec", f"{NAME}-node-{rank + 1}", "docker", "run", "-d", "--name", "byhand", "--network", "host",
            "-v", "/var/lib/torchfleet/datasets/fashion-mnist:/data:ro",
            "-v", "/var/lib/torchfleet/workloads/mnist:/workload:ro",
            "-e", f"MASTER_ADDR={addrs[0]}", "-e", "MASTER_PORT=29500", "-e", "WORLD_SIZE=3", "-e", f"RANK={rank}",
            "-e", "OMP_NUM_THREADS=1", "-e", "GLOO_SOCKET_IFNAME=eth0",
            "torchfleet/train:2.13.0-cpu", "python3", "/workload/mnist.py", "--epoch", "1", "--data-dir", "/data",
            "--out-dir", "/tmp",
        ], check=True, capture_output=True)
    for rank in range(3):
        subprocess.run(["docker", "exec", f"{NAME}-node-{rank + 1}", "docker", "wait", "byhand"], check=True,
                       capture_output=True)
    log = subprocess.run(["docker", "exec", f"{NAME}-node-1", "docker", "logs", "byhand"], capture_output=True,
                         text=True).stdout
    for rank in range(3):
        subprocess.run(["docker", "exec", f"{NAME}-node-{rank + 1}", "docker", "rm", "byhand"], capture_output=True)
    return (first_step(log) - start).total_seconds()


def main() -> None:
    INV_DIR.mkdir(parents=True, exist_ok=True)
    link = INV_DIR / "group_vars"
    if not link.exists():
        link.symlink_to(ROOT / "inventory" / "local" / "group_vars")
    inv = ["-i", str(INV_DIR)]
    print("==> removing any earlier bench cluster")
    playbook("playbooks/local_cluster.yml", *CLUSTER_VARS, "-e", "local_cluster_state=absent")
    t = {}
    print("==> timing")
    t["cluster up"] = playbook("playbooks/local_cluster.yml", *CLUSTER_VARS)
    t["cluster up again"] = playbook("playbooks/local_cluster.yml", *CLUSTER_VARS)
    t["site.yml first"] = playbook("site.yml", *inv)
    t["site.yml again"] = playbook("site.yml", *inv)
    rounds: dict[str, list[float]] = {}
    slow: list[str] = []
    for i in range(ROUNDS):
        print(f"==> launch round {i + 1} of {ROUNDS}")
        total, first = launch_to_first_step(inv)
        slow = slow or slowest_tasks(LAST_OUTPUT[0])
        rounds.setdefault("launch total", []).append(total)
        rounds.setdefault("launch to first step", []).append(first)
        rounds.setdefault("launch, no MASTER_PORT wait, to first step", []).append(
            launch_to_first_step(inv, "-e", "launch_wait_master_listen=false")[1])
        rounds.setdefault("docker run by hand to first step", []).append(by_hand())
    for key, values in rounds.items():
        t[key] = statistics.median(values)
        print(f"  {key}: {', '.join(f'{v:.2f}' for v in values)}")
    t["ansible floor of a launch"] = launch_floor(inv)
    t["launch floor (by hand + ansible floor)"] = t["docker run by hand to first step"] + t["ansible floor of a launch"]
    t["ansible floor, docker_container start"] = launch_floor(inv, FLOOR_CONTAINER_PLAYBOOK, "launch_floor_container")
    t["launch floor, docker_container start"] = t["docker run by hand to first step"] + \
        t["ansible floor, docker_container start"]
    playbook("playbooks/local_cluster.yml", *CLUSTER_VARS, "-e", "local_cluster_state=absent")

    print(f"\n{'step':<40}{'seconds':>9}{'cc9efe2':>9}")
    for key, value in t.items():
        was = SECONDS_BASELINE.get(key)
        print(f"{key:<40}{value:>9.1f}{was if was else '-':>9}")
    print(f"\n{'ratio':<52}{'value':>7}{'cc9efe2':>9}{'5fff6a8':>9}")
    for label, a, b in [
        ("cluster up again / cluster up", "cluster up again", "cluster up"),
        ("site.yml again / site.yml first", "site.yml again", "site.yml first"),
        ("launch to first step / docker run by hand", "launch to first step", "docker run by hand to first step"),
        ("  without the MASTER_PORT wait / docker run by hand", "launch, no MASTER_PORT wait, to first step",
         "docker run by hand to first step"),
        ("launch to first step / launch floor", "launch to first step", "launch floor (by hand + ansible floor)"),
        ("launch floor / docker run by hand", "launch floor (by hand + ansible floor)",
         "docker run by hand to first step"),
        ("docker_container floor / docker run by hand", "launch floor, docker_container start",
         "docker run by hand to first step"),
        ("launch to first step / docker_container floor", "launch to first step",
         "launch floor, docker_container start"),
    ]:
        was, before = BASELINE.get(label, (None, None))
        print(f"{label:<52}{t[a] / t[b]:>7.2f}{was if was else '-':>9}{before if before else '-':>9}")
    print(f"goals (issue 60): launch to first step <= 1.5x the hand-typed loop; a site.yml that changes nothing "
          f"<= 0.15 of the first. The floor is what Ansible alone adds to that "
          f"loop here (one bare module run per node per phase), the docker_container floor what it adds with the "
          f"start through community.docker; launches and the loop: median of {ROUNDS} rounds")
    print("\nwhere the default launch's time goes (profile_tasks):")
    for line in slow:
        print("  " + line)


if __name__ == "__main__":
    main()
