#!/usr/bin/env python3
"""How supervision scales: 3, 12 and 48 nodes, measured in one run.

The nodes are cheap enough that 48 fit this 2-core machine: containers of the training
image (its Python has torch, which the guards need) running only sshd, with no Docker
engine inside; the job runs in process mode; the workload is a few lines that import
nothing heavy. For each size it measures:

  - submit until every rank has started (Cluster.submit's wall time), and the controller's
    CPU seconds per node for it (this process and its children: ansible-playbook, its
    workers, ssh); then, from the same start, until every guard beats in the store (the
    master's job.json hears them all): the run is whole only then, as a worker's rank
    waits in its guard until the master listens and submit returns once it does;
  - a rank's crash until every rank has stopped: once every guard beats in the store (the
    master's job.json sees them all), the last rank is told to crash through a file on its
    node; the crash time is the one it printed, and each guard records when it learnt of
    the abort (crash->seen: the detection) and when its rank had ended (crash->stopped). A
    crash during the start is left out: there the guards' own start (torch's import) is
    measured, not detection, and submit's time already shows it;
  - a node lost (docker pause of the last node) until every other rank has stopped;
  - `status` (Run.status: the master's record of the running run), its wall time;
  - `stop` (Run.stop) until every rank has stopped, and the call's own wall time (until
    every guard is gone and the logs are collected);
  - the controller's floors for those, through the same runner as the API: a playbook that
    runs one bare command on the master only (what a status or a stop's first contact cannot
    go below), and one on every node (what a stop that collects from every node cannot); a
    stop's ranks cannot stop before the first floor plus the crash's own stop;
  - the machine's floor for a crash: one process on a node, torch imported as a guard has
    it, forks as many ranks as the crash stops, then sends each SIGTERM and reaps it. No
    store, no guard: what ending that many ranks costs these shared cores at the least.

The floor of "every guard beats" (submit's start until the store has heard every guard),
measured at each size before its submit: the nodes' own start, every node at once running
the guards' interpreter with what a guard imports (torch's TCPStore), with no Ansible, timed
until the last is done; plus the controller's minimum, a playbook of one bare module run per
node for each phase of a launch before its guards beat (the check, the start), through the
same runner as the API.

Last, at the largest size, Ansible's own floor on this machine: the CPU per node of a task
every node skips and of a bare module run, so that the submit's figure can be read in
module runs per node, whatever the machine's speed.

Its nodes and network are ${TORCHFLEET_TEST_PREFIX}-scale-node-N on
${TORCHFLEET_TEST_SUBNET_BASE}.12.0/24 when those are set (tfscale and 172.29 otherwise), so
that it can run beside the test suites.

Host keys are not pinned here (StrictHostKeyChecking=no): these throw-away nodes exist
for this run only. Run from the repository root with the venv active:

    python bench/scale.py            # 3, 12 and 48 nodes
    python bench/scale.py 3 12       # other sizes
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import torchfleet
from torchfleet import Job, JobFailed
from torchfleet import run_vocab

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "torchfleet/train:2.13.0-cpu"
PREFIX = f"{os.environ['TORCHFLEET_TEST_PREFIX']}-scale" if os.environ.get("TORCHFLEET_TEST_PREFIX") else "tfscale"
SUBNET = f"{os.environ.get('TORCHFLEET_TEST_SUBNET_BASE', '172.29')}.12"  # apart from every test cluster
PYTHON = "/opt/venv/bin/python3"
# launch_node_timeout's default, for the lost-node case. The crash and stop cases do not
# depend on it, and get a longer one: at 48 nodes on 2 shared cores, the guards' own start
# (48 torch imports) or the stop playbook's 50 forks can starve a guard for 10 s, which the
# others then report as a lost node that is not.
NODE_TIMEOUT = 10
QUIET_NODE_TIMEOUT = 30

# Rank 0 opens MASTER_PORT as init_process_group would (the launch starts the other ranks
# once it listens), without torch's import.
WORKLOAD = '''
import os, socket, sys, time
rank = int(os.environ["RANK"])
if rank == 0:
    listener = socket.socket()
    listener.bind((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
    listener.listen()
crash = int(sys.argv[1]) if len(sys.argv) > 1 else -1
print(f"rank {rank} of {os.environ['WORLD_SIZE']} started", flush=True)
if rank == crash:
    while not os.path.exists("/tmp/crash-now"):
        time.sleep(0.01)
    print(f"CRASH {time.time()}", flush=True)
    os._exit(3)
while True:
    time.sleep(1)
    print("step", flush=True)
'''


# The crash's floor (see the docstring): the seconds from the first SIGTERM to the last reap.
END_FLOOR = """
import os, signal, sys, time
from torch.distributed import TCPStore
pids = []
for _ in range(int(sys.argv[1])):
    pid = os.fork()
    if pid == 0:
        while True:
            time.sleep(1)
    pids.append(pid)
time.sleep(1)
t0 = time.monotonic()
for pid in pids:
    os.kill(pid, signal.SIGTERM)
for pid in pids:
    os.waitpid(pid, 0)
print(time.monotonic() - t0)
"""


def sh(*args: str, check: bool = True) -> str:
    done = subprocess.run(args, capture_output=True, text=True)
    if check and done.returncode != 0:
        sys.exit(f"{' '.join(args)}: {done.stderr}")
    return done.stdout


def node(i: int) -> str:
    return f"{PREFIX}-node-{i}"


def start_nodes(count: int, keys: Path) -> None:
    sh("docker", "network", "create", "--subnet", f"{SUBNET}.0/24", PREFIX, check=False)
    for i in range(1, count + 1):
        sh("docker", "run", "-d", "--name", node(i), "--hostname", f"node-{i}", "--network", PREFIX,
           "--ip", f"{SUBNET}.{i + 10}", "-v", f"{keys / 'id.pub'}:/root/.ssh/authorized_keys:ro",
           "--entrypoint", "sh", IMAGE, "-c",
           "mkdir -p /run/sshd /var/lib/torchfleet/datasets && ssh-keygen -A >/dev/null && "
           "exec /usr/sbin/sshd -D -e -o PermitRootLogin=prohibit-password")
    for i in range(1, count + 1):
        for _ in range(60):
            if subprocess.run(["ssh", *ssh_opts(keys), f"root@{SUBNET}.{i + 10}", "true"],
                              capture_output=True).returncode == 0:
                break
            time.sleep(0.5)
        else:
            sys.exit(f"{node(i)} never answered over ssh")


def remove_nodes(count: int) -> None:
    names = [node(i) for i in range(1, count + 1)]
    subprocess.run(["docker", "rm", "-f", *names], capture_output=True)
    subprocess.run(["docker", "network", "rm", PREFIX], capture_output=True)


def ssh_opts(keys: Path) -> list[str]:
    return ["-i", str(keys / "id"), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "BatchMode=yes"]


def inventory(count: int, keys: Path, folder: Path) -> Path:
    hosts = {f"node-{i}": {"ansible_host": f"{SUBNET}.{i + 10}"} for i in range(1, count + 1)}
    inv = {"all": {"children": {"torchfleet_nodes": {"hosts": hosts}}, "vars": {
        "ansible_user": "root", "ansible_ssh_private_key_file": str(keys / "id"),
        "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null",
        "ansible_python_interpreter": PYTHON, "launch_mode": "process", "launch_python": PYTHON,
        "launch_dataset_dir": "/var/lib/torchfleet/datasets", "cpu_pinning": False, "launch_omp_num_threads": 1,
        "launch_stop_grace": 2, "launch_poll_interval": 1}}}
    path = folder / f"hosts-{count}.json"
    path.write_text(json.dumps(inv))
    return path


def guard_states(count: int, run_id: str) -> list[dict]:
    """What every guard of the run recorded, read on the nodes themselves."""
    read = ("import glob, json; print(json.dumps([json.load(open(p)) for p in "
            f"glob.glob('/var/lib/torchfleet/runs/{run_id}/{run_vocab.GUARD_RECORDS}')]))")
    states = []
    for i in range(1, count + 1):
        out = subprocess.run(["docker", "exec", node(i), PYTHON, "-c", read], capture_output=True, text=True).stdout
        states += json.loads(out or "[]")
    return states


def supervised(count: int, run_id: str) -> bool:
    """Whether the store's host has heard every guard, from the master's job.json."""
    out = subprocess.run(["docker", "exec", node(1), "cat", f"/var/lib/torchfleet/runs/{run_id}/{run_vocab.JOB}"],
                         capture_output=True, text=True).stdout
    try:
        job = json.loads(out)
    except ValueError:
        return False
    if job["state"] != "running":
        sys.exit(f"{count} nodes: the run ended before it was measured: {(job.get('abort') or {}).get('reason')}")
    return len(job["units"]) == count and all(u["heartbeat_age_s"] is not None for u in job["units"])


def stopped_by(states: list[dict], skip_host: str | None = None, field: str = "stopped_at") -> float | None:
    """When the last rank was stopped (or, with field abort_seen_at, when the last guard
    learnt of the abort), from what each guard recorded."""
    times = [s[field] for s in states if s.get(field) and s["host"] != skip_host]
    return max(times) if times else None


def wait_until(check, timeout: float, what: str, every: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    sys.exit(f"timed out waiting for {what}")


def recorded(count: int, run_id: str, field: str) -> list[dict]:
    """The guards' records once ``count`` of them have ``field``. A docker exec per node costs
    CPU that the guards are measured on: the first look comes after they should be done,
    and later ones are sparse; their own records carry the times."""
    time.sleep(NODE_TIMEOUT + 3)
    return wait_until(lambda: (s := guard_states(count, run_id)) and len(
        [x for x in s if x.get(field)]) >= count and s, 120, f"{count} guards to record {field}", every=3)


# The controller's floors for a status and a stop (see the docstring): one bare command on
# the master, and on every node, in playbooks of nothing else. A command, not a module run:
# status and stop run the run folder's own scripts there, below a module run's cost.
CONTACT_PLAYBOOK = """
- name: a bare command on {what}
  hosts: torchfleet_nodes{pick}
  gather_facts: false
  tasks:
    - {{name: a command, ansible.builtin.raw: "true"}}
"""


def contact_floor(cluster: torchfleet.Cluster, folder: Path, pick: str) -> float:
    """Wall seconds of a playbook that runs one bare command on the nodes ``pick`` selects
    ("[0]": the master; "": every node), through the API's own runner; the median of three."""
    book = folder / f"contact{pick.strip('[]') or '-all'}.yml"
    book.write_text(CONTACT_PLAYBOOK.format(what="the master" if pick else "every node", pick=pick))
    times = []
    for _ in range(3):
        t0 = time.monotonic()
        result, _ = cluster._run(str(book), "floor", {})
        times.append(time.monotonic() - t0)
        if not result.ok:
            sys.exit(f"the contact floor's playbook failed: {result.failures}")
    return sorted(times)[1]


# What a guard imports before it beats (guard_child.import_torch): the store is torch's.
GUARD_IMPORT = "from torch.distributed import TCPStore"


def guards_start_floor(count: int) -> float:
    """Wall seconds until every node has run the guards' interpreter with what a guard
    imports, all nodes at once, with no Ansible; the quicker of two."""
    times = []
    for _ in range(2):
        t0 = time.monotonic()
        starts = [subprocess.Popen(["docker", "exec", node(i), PYTHON, "-c", GUARD_IMPORT],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for i in range(1, count + 1)]
        for start in starts:
            if start.wait() != 0:
                sys.exit(f"the guards' import failed on a node: {start.stderr.read()}")
        times.append(time.monotonic() - t0)
    return min(times)


# The controller's minimum for a launch until its guards beat: one bare module run per
# node for each of its phases before then (the check, the start).
LAUNCH_FLOOR_PLAYBOOK = """
- hosts: torchfleet_nodes
  gather_facts: false
  tasks:
    - {name: the check on every node, ansible.builtin.ping: {}}
    - {name: the start on every node, ansible.builtin.ping: {}}
"""


def launch_floor(count: int, keys: Path, folder: Path) -> float:
    """Wall seconds of that playbook, the median of three. Each run opens its own SSH
    connections, as a launch's first contact must, in a control folder of its own, so that
    the submit measured next finds none of them open."""
    book = folder / "launch_floor.yml"
    book.write_text(LAUNCH_FLOOR_PLAYBOOK)
    times = []
    for i in range(3):
        control = folder / f"cp-{count}-{i}"
        control.mkdir()
        env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_SSH_CONTROL_PATH_DIR=str(control),
                   ANSIBLE_STDOUT_CALLBACK="ansible.builtin.null")
        t0 = time.monotonic()
        done = subprocess.run(["ansible-playbook", "-i", str(inventory(count, keys, folder)), str(book)],
                              capture_output=True, text=True, env=env, cwd=ROOT, check=False)
        times.append(time.monotonic() - t0)
        if done.returncode != 0:
            sys.exit(f"the launch floor's playbook failed: {done.stdout[-500:]} {done.stderr[-500:]}")
    return sorted(times)[1]


def cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


# Ansible's own cost per node on this machine, for reading the launch's: one task that
# every node skips, and one module run over SSH (connections already open), in a playbook
# of nothing else. Machines differ: here a task's floor is what the launch cannot go below.
FLOOR_PLAYBOOK = """
- hosts: torchfleet_nodes
  gather_facts: false
  tasks:
    - {name: open the connections, ansible.builtin.ping: {}}
    - {name: a task every node skips, ansible.builtin.debug: {msg: x}, when: false}
    - {name: a module run on every node, ansible.builtin.ping: {}}
"""


def ansible_floor(count: int, keys: Path, folder: Path) -> dict[str, float]:
    """CPU seconds per node of a skipped task and of a module run, each timed by the
    playbook's own task boundaries (a callback that reads this process group's CPU)."""
    book = folder / "floor.yml"
    book.write_text(FLOOR_PLAYBOOK)
    (folder / "floor_cb").mkdir(exist_ok=True)
    (folder / "floor_cb" / "task_cpu.py").write_text(TASK_CPU_CALLBACK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CALLBACK_PLUGINS=str(folder / "floor_cb"),
               ANSIBLE_CALLBACKS_ENABLED="task_cpu", ANSIBLE_STDOUT_CALLBACK="ansible.builtin.null")
    done = subprocess.run(["ansible-playbook", "-i", str(inventory(count, keys, folder)), str(book)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    rows = dict(line.split("\t") for line in done.stdout.splitlines() if "\t" in line)
    if done.returncode != 0 or len(rows) < 3:
        sys.exit(f"the floor playbook failed: {done.stdout[-500:]} {done.stderr[-500:]}")
    return {"skip_s": float(rows["a task every node skips"]) / count,
            "module_s": float(rows["a module run on every node"]) / count}


TASK_CPU_CALLBACK = '''
import resource
from ansible.plugins.callback import CallbackBase


def _cpu():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


class CallbackModule(CallbackBase):
    CALLBACK_VERSION, CALLBACK_TYPE, CALLBACK_NAME, CALLBACK_NEEDS_ENABLED = 2.0, "aggregate", "task_cpu", True

    def __init__(self):
        super().__init__()
        self.task, self.start = None, 0.0

    def _close(self):
        if self.task:
            print(f"{self.task}\\t{_cpu() - self.start:.4f}", flush=True)

    def v2_playbook_on_task_start(self, task, is_conditional):
        self._close()
        self.task, self.start = task.get_name(), _cpu()

    def v2_playbook_on_stats(self, stats):
        self._close()
'''


def measure(count: int, keys: Path, folder: Path, workload: Path) -> dict[str, float]:
    cluster = torchfleet.Cluster(inventory(count, keys, folder), runs_dir=folder / "runs", progress=False)
    out: dict[str, float] = {}
    last = f"node-{count}"

    def submit(crash_rank: int, node_timeout: float) -> torchfleet.Run:
        return cluster.submit(Job(workload=workload, name=f"scale{count}", args=[str(crash_rank)],
                                  extra_vars={"launch_node_timeout": node_timeout}))

    # The floor first, while the nodes are idle; the median of three.
    out["end_floor_s"] = sorted(float(sh("docker", "exec", node(1), PYTHON, "-c", END_FLOOR, str(count - 1)))
                                for _ in range(3))[1]
    out["guards_start_floor_s"] = guards_start_floor(count)
    out["launch_floor_s"] = launch_floor(count, keys, folder)
    out["all_beat_floor_s"] = out["guards_start_floor_s"] + out["launch_floor_s"]

    # Submit, then a crash of the last rank once every guard is supervised.
    sh("docker", "exec", node(count), "rm", "-f", "/tmp/crash-now")
    c0, t0 = cpu(), time.monotonic()
    run = submit(count - 1, QUIET_NODE_TIMEOUT)
    out["submit_s"], out["cpu_s"] = time.monotonic() - t0, cpu() - c0
    out["cpu_per_node_s"] = out["cpu_s"] / count
    print(f"  {count} nodes: submitted in {out['submit_s']:.1f}s", flush=True)
    wait_until(lambda: supervised(count, run.run_id), 300, "every guard to beat in the store", every=0.2)
    out["running_s"] = time.monotonic() - t0
    sh("docker", "exec", node(count), "touch", "/tmp/crash-now")
    states = recorded(count, run.run_id, "ended_at")
    crashed = float(sh("docker", "exec", node(count), "sh", "-c",
                       f"sed -n 's/^CRASH //p' /var/lib/torchfleet/runs/{run.run_id}/rank-{count - 1}.log").strip())
    out["crash_to_stopped_s"] = stopped_by(states) - crashed
    out["crash_to_seen_s"] = stopped_by(states, field="abort_seen_at") - crashed
    print(f"  {count} nodes: crash to stopped {out['crash_to_stopped_s']:.2f}s", flush=True)
    try:
        run.collect()
    except JobFailed:
        pass

    # A node lost: the last one paused whole (its ranks are processes inside it).
    run = submit(-1, NODE_TIMEOUT)
    wait_until(lambda: supervised(count, run.run_id), 300, "every guard to beat in the store")
    lost_at = time.time()
    # The freezer can fail while the node is busy ("unable to freeze"); it is tried again.
    for _ in range(10):
        if subprocess.run(["docker", "pause", node(count)], capture_output=True).returncode == 0:
            break
        time.sleep(1)
    else:
        sys.exit(f"docker pause {node(count)} kept failing")
    states = recorded(count - 1, run.run_id, "stopped_at")
    # A guard starved on the shared cores can be reported lost before the paused node is.
    named = all(last in (s.get("stopped_because") or last) for s in states if s["host"] != last)
    out["lost_to_stopped_s"] = stopped_by(states, skip_host=last) - lost_at if named else float("nan")
    print(f"  {count} nodes: lost to stopped {out['lost_to_stopped_s']:.2f}s", flush=True)
    sh("docker", "unpause", node(count))
    try:
        run.collect()
    except JobFailed:
        pass

    # Status, from the master's record (what `torchfleet status` shows), then stop; the
    # controller's floors for them first, while the run runs.
    run = submit(-1, QUIET_NODE_TIMEOUT)
    wait_until(lambda: supervised(count, run.run_id), 300, "every guard to beat in the store")
    out["master_floor_s"] = contact_floor(cluster, folder, "[0]")
    out["all_floor_s"] = contact_floor(cluster, folder, "")
    t0 = time.monotonic()
    status = run.status()
    out["status_s"] = time.monotonic() - t0
    if status.state != "running" or len(status.nodes) != count or status.source != "record":
        sys.exit(f"{count} nodes: status saw {status.state} on {len(status.nodes)} nodes from {status.source} "
                 f"({status.note})")
    stop_at = time.time()
    try:
        run.stop()
    except JobFailed as exc:  # the run ended otherwise first: no stop to time
        print(f"  {count} nodes: the stop found the run ended otherwise: {exc.message[:200]}", flush=True)
    # What the user waits for: every guard gone, the logs collected.
    out["stop_call_s"] = time.time() - stop_at
    states = guard_states(count, run.run_id)
    requested = all("lost" not in (s.get("stopped_because") or "lost") for s in states)
    out["stop_to_stopped_s"] = stopped_by(states) - stop_at if requested else float("nan")
    cluster.down()
    return out


# The status and stop figures this bench gave before they read the master's record first
# (5fff6a8, issue 44), for the table that sets the new ones beside them.
BASELINE = {3: {"status_s": 1.2, "stop_call_s": 3.2, "stop_to_stopped_s": 1.2},
            48: {"status_s": 9.1, "stop_call_s": 27.1, "stop_to_stopped_s": 7.7}}


# The launch's figures before issue 60's work (bench/scale.py at cc9efe2).
LAUNCH_BASELINE = {3: {"submit_s": 9.1, "running_s": 10.9, "cpu_per_node_s": 1.46},
                   12: {"submit_s": 24.8, "running_s": 26.0, "cpu_per_node_s": 0.75},
                   48: {"submit_s": 89.8, "running_s": 91.5, "cpu_per_node_s": 0.68}}


def _was(baseline: dict[str, float], key: str) -> str:
    return f"{baseline[key]:.1f}" if key in baseline else "-"


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [3, 12, 48]
    biggest = max(sizes)
    with tempfile.TemporaryDirectory(prefix="tfscale-") as tmp:
        folder = Path(tmp)
        keys = folder / "keys"
        keys.mkdir()
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "id"))
        workload = folder / "tiny.py"
        workload.write_text(WORKLOAD)
        remove_nodes(biggest)
        print(f"starting {biggest} nodes ({IMAGE}, sshd only)", flush=True)
        t0 = time.monotonic()
        start_nodes(biggest, keys)
        print(f"  up in {time.monotonic() - t0:.0f}s", flush=True)
        results = {}
        try:
            for count in sizes:
                results[count] = measure(count, keys, folder, workload)
                print(f"  {count} nodes: " + ", ".join(f"{k} {v:.2f}" for k, v in results[count].items()), flush=True)
            floor = ansible_floor(biggest, keys, folder)
        finally:
            remove_nodes(biggest)
    base = results[min(sizes)]
    print(f"\nsupervision at scale ({datetime.now():%Y-%m-%d %H:%M}, node timeout {NODE_TIMEOUT}s for the loss, "
          f"{QUIET_NODE_TIMEOUT}s for the crash and the stop, "
          f"guard poll 0.5s, 2 shared cores)")
    # The launch's fixed cost (Ansible's own start, the plan) spread over few nodes weighs
    # more than over many; the CPU each node added beyond the smallest size is the slope.
    header = f"{'nodes':>5} {'submit s':>9} {'all beat s':>11} {'ctl CPU/node s':>15} {'per added node s':>17} " \
             f"{'crash->seen s':>14} {'crash->stopped s':>17} {'end floor s':>12} {'lost->stopped s':>16} " \
             f"{'status s':>9} {'stop->stopped s':>16} {'stop call s':>12}  {'crash vs ' + str(min(sizes)):>10} " \
             f"{'floor vs ' + str(min(sizes)):>10} {'lost vs ' + str(min(sizes)):>9}"
    print(header)
    print("-" * len(header))
    for count in sizes:
        r = results[count]
        added = "-" if count == min(sizes) else \
            f"{(r['cpu_s'] - base['cpu_s']) / (count - min(sizes)):.2f}"
        print(f"{count:>5} {r['submit_s']:>9.1f} {r['running_s']:>11.1f} {r['cpu_per_node_s']:>15.2f} {added:>17} {r['crash_to_seen_s']:>14.2f} "
              f"{r['crash_to_stopped_s']:>17.2f} {r['end_floor_s']:>12.3f} "
              f"{r['lost_to_stopped_s']:>16.1f} {r['status_s']:>9.1f} {r['stop_to_stopped_s']:>16.1f} "
              f"{r['stop_call_s']:>12.1f}  "
              f"{r['crash_to_stopped_s'] / base['crash_to_stopped_s']:>9.2f}x "
              f"{r['end_floor_s'] / base['end_floor_s']:>9.2f}x "
              f"{r['lost_to_stopped_s'] / base['lost_to_stopped_s']:>8.2f}x")
    print("goals: controller CPU per node per launch <= 0.25 s at 48 nodes; crash and loss at 48 nodes <= 1.5x the 3-node times; "
          "crash->stopped <= 5 s; lost->stopped <= 20 s")
    print("crash->seen: until the last guard learnt of the abort; crash->stopped adds its rank's end (SIGTERM, exit, "
          "reaped), which on shared cores waits its turn behind every other rank's")
    print("end floor: one process SIGTERMs and reaps as many ranks as the crash stops (forked after torch's import, "
          "as the guards fork them), with no supervision; on shared cores the crash's ratio cannot fall below the "
          "floor's")
    print("\nthe launch, against its baseline (bench/scale.py at cc9efe2, issue 60) and its floor, measured "
          "before each size's submit on idle nodes")
    header = f"{'nodes':>5} {'submit s':>9} {'was':>5}  {'all beat s':>11} {'was':>5} {'floor s':>8} " \
             f"{'guards s':>9} {'ctl s':>6} {'vs floor':>8}  {'ctl CPU/node s':>15} {'was':>5}"
    print(header)
    print("-" * len(header))
    for count in sizes:
        r, was = results[count], LAUNCH_BASELINE.get(count, {})
        print(f"{count:>5} {r['submit_s']:>9.1f} {_was(was, 'submit_s'):>5}  {r['running_s']:>11.1f} "
              f"{_was(was, 'running_s'):>5} {r['all_beat_floor_s']:>8.1f} {r['guards_start_floor_s']:>9.1f} "
              f"{r['launch_floor_s']:>6.1f} {r['running_s'] / r['all_beat_floor_s']:>7.2f}x  "
              f"{r['cpu_per_node_s']:>15.2f} {was['cpu_per_node_s'] if was else '-':>5}")
    print("goals (issue 60): controller CPU per node per launch <= 0.25 s at 48 nodes; every guard beats at 48 "
          "nodes within 1.5x of the floor")
    print("floor: the nodes' own start (every node at once runs the guards' python importing torch's TCPStore by "
          "docker exec, no Ansible, until the last is done; the quicker of two) plus the controller's minimum (a "
          "playbook of one bare module run per node for the check and for the start, on new SSH connections; the "
          "median of 3)")
    print("\nstatus and stop, against their baseline (bench/scale.py at 5fff6a8, issue 44) and the controller's floors "
          "(median of 3 through the API's runner)")
    header = f"{'nodes':>5} {'status s':>9} {'was':>5} {'vs ' + str(min(sizes)):>6} {'floor s':>8} {'vs floor':>8}  " \
             f"{'stop->stopped s':>16} {'was':>5} {'floor s':>8} {'vs floor':>8}  " \
             f"{'stop call s':>12} {'was':>5} {'floor s':>8} {'vs floor':>8}"
    print(header)
    print("-" * len(header))
    for count in sizes:
        r, was = results[count], BASELINE.get(count, {})
        # A stop's ranks cannot stop before its first contact with the master, and then take
        # as long as a crash's to stop.
        stop_floor = r["master_floor_s"] + r["crash_to_stopped_s"]
        print(f"{count:>5} {r['status_s']:>9.1f} {_was(was, 'status_s'):>5} "
              f"{r['status_s'] / base['status_s']:>5.2f}x {r['master_floor_s']:>8.1f} "
              f"{r['status_s'] / r['master_floor_s']:>7.2f}x  {r['stop_to_stopped_s']:>16.1f} "
              f"{_was(was, 'stop_to_stopped_s'):>5} {stop_floor:>8.1f} {r['stop_to_stopped_s'] / stop_floor:>7.2f}x  "
              f"{r['stop_call_s']:>12.1f} {_was(was, 'stop_call_s'):>5} {r['all_floor_s']:>8.1f} "
              f"{r['stop_call_s'] / r['all_floor_s']:>7.2f}x")
    print("goals: status at 48 nodes <= 2 s and <= 1.5x its 3-node time; every rank stopped within 1 s of the stop "
          "call's start; the stop call <= 10 s")
    print("floors: status, a bare command on the master alone; stop->stopped, that plus crash->stopped; the stop "
          "call, a bare command on every node (a stop collects from each)")
    top = results[biggest]
    print(f"\nAnsible's own floor here at {biggest} nodes, CPU per node: a skipped task {floor['skip_s'] * 1000:.0f} ms, "
          f"a module run {floor['module_s'] * 1000:.0f} ms; the submit costs "
          f"{top['cpu_per_node_s'] / floor['module_s']:.1f} module runs per node")


if __name__ == "__main__":
    main()
