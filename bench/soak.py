#!/usr/bin/env python3
"""A chaos soak: the bundled workload runs with restarts on three docker hosts for a set time,
faults come from a seeded schedule, and the run is then checked against an uninterrupted one.

Every 1 to 3 minutes after the run last trained again, one fault: a killed rank (its process
inside its container, SIGKILL), a frozen worker or a frozen master (the node frozen whole,
thawed after a hold), a cut link (a worker's docker network endpoint removed, then put back
with its address) or a full disk in the checkpoint folder (each node's folder is a small
tmpfs of the soak's own; one is filled, and freed once the attempt it broke has ended). The
first faults are every kind once, in a seeded order; then kinds are drawn at random.

At the end it checks: the run finished (exit 0); its ranks' parameter checksums equal an
uninterrupted run's with the same seed and arguments (run first on the same cluster, kept
for the next soak with the same arguments); every attempt is on the record (summary.json)
with the cause the fault that ended it should have; and no rank container, guard or
workload process, unfinished guard record or held guard lock is left on any node. It prints
a table of the faults: when, which node, how the attempt ended, how long the run did not
train, the steps redone, and whether it survived. docs/recovery.md#the-chaos-soak has more.

Run from the repository root with the venv active (not part of scripts/test.sh):

    python bench/soak.py --minutes 30 --seed 58         # a soak (20 to 60 minutes)
    python bench/soak.py --minutes 6 --faults 3         # a short one while developing
    python bench/soak.py --plan --minutes 30            # only print the schedule
    python bench/soak.py --down                         # remove its cluster

Its cluster is ${TORCHFLEET_TEST_PREFIX:-molecule}-soak on
${TORCHFLEET_TEST_SUBNET_BASE:-172.29}.19.0/24, made and provisioned on the first run and
kept for the next; its inventory, runs and reference checksums are in .torchfleet/<cluster>/
($TORCHFLEET_STATE_DIR/<cluster>/ where that is set, as when a copy of a commit is soaked with
the checkout's state).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import torchfleet
from torchfleet import run_vocab

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "files" / "workloads" / "mnist.py"
PREFIX = os.environ.get("TORCHFLEET_TEST_PREFIX", "molecule")
NAME = f"{PREFIX}-soak"
# Apart from every molecule scenario's, the test clusters' and the other benches' subnets.
SUBNET = f"{os.environ.get('TORCHFLEET_TEST_SUBNET_BASE', '172.29')}.19.0/24"
STATE = Path(os.environ.get("TORCHFLEET_STATE_DIR") or ROOT / ".torchfleet")
FOLDER = STATE / NAME
ENV = {"TORCHFLEET_STATE_DIR": str(STATE), "TORCHFLEET_ENGINE_SEED": f"{PREFIX}-engine-seed"}
CLI = str(Path(sys.executable).parent / "torchfleet")
NODES = ("node-1", "node-2", "node-3")
RUNS = "/var/lib/torchfleet/runs"
# Every rank's log on a node (a shell pattern), and one of them (a name in a listing).
RANK_LOGS = run_vocab.rank_log("*")  # type: ignore[arg-type]
RANK_LOG = re.compile(re.escape(run_vocab.rank_log(0)).replace("0", r"\d+"))
CHECKPOINTS = "/var/lib/torchfleet/soak"
# Four checkpoints of 0.9 MB fit (two kept, one being written, one arriving in a sync).
TMPFS = "8m"
FILL = ".soak-fill"

KINDS = ("kill", "worker", "master", "cut", "disk")
# A fault that has not trained again by then did not recover.
BOUND = 420
# A disk filled this long without breaking an attempt is freed and said to have had no effect.
DISK_MOST = 120
# Every step logged, so the logs say exactly where each attempt was.
BATCH = 16
LOG_INTERVAL = 1
CALIBRATION_EPOCHS = 40
# The share of the soak that training takes at the calibrated pace; the rest goes to the faults.
# Less, and a machine that got faster than it was at the calibration ends the run early.
TRAIN_SHARE = 0.9

BANNER = re.compile(r"^\[torchfleet guard\] attempt (\d+) of \d+", re.M)
TRAINED = re.compile(r"^(\S+Z) .*\] Train Epoch: (\d+) \[(\d+)/(\d+) ", re.M)
RESUMED = re.compile(r"\] (?:resumed from step (\d+) |starting from step (0): )")
LEFTOVER = re.compile(r"/out/guard\.py|run_reap\.py|mnist\.py")


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def clock(t: float | None, t0: float) -> str:
    if t is None:
        return "-"
    s = int(t - t0)
    return f"{s // 60:02d}:{s % 60:02d}"


# --- the schedule ---------------------------------------------------------------------------------


@dataclass
class Fault:
    kind: str
    gap: float  # seconds after the run last trained again
    hold: float  # frozen or cut this long (freeze, cut)
    pick: float  # which node, among those the kind may hit
    target: str | None = None
    injected: float | None = None
    restored: float | None = None
    attempt: int | None = None  # the attempt it hit
    after: int | None = None  # the attempt that trained after it
    back: float | None = None  # that attempt's first step
    note: str = ""
    extra: dict = field(default_factory=dict)


def schedule(seed: int, count: int, kinds=KINDS, gap=(60.0, 180.0), hold=(20.0, 30.0)) -> list[Fault]:
    """``count`` faults: every kind once in a seeded order, then kinds drawn at random."""
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    while len(order) < count:
        order.append(rng.choice(kinds))
    return [Fault(kind, round(rng.uniform(*gap), 1), round(rng.uniform(*hold), 1), rng.random())
            for kind in order[:count]]


def candidates(kind: str, nodes: list[str]) -> list[str]:
    """The nodes of the running attempt a fault may hit: a worker's faults need a worker, and a
    frozen master a node to take over."""
    if kind in ("worker", "cut"):
        return nodes[1:]
    if kind == "master":
        return nodes[:1] if len(nodes) > 1 else []
    return list(nodes)


def expected(kind: str, target: str, cause: dict | None) -> bool:
    """Whether the record's cause of the attempt a fault ended is the one it should have."""
    if not cause:
        return False
    if kind in ("kill", "disk"):
        code = "code 137" if kind == "kill" else "code 1"
        return cause.get("kind") == "rank_failed" and cause.get("host") == target and code in cause.get("reason", "")
    return cause.get("kind") == "node_lost" and target in (cause.get("hosts") or [cause.get("host")])


# --- what the ranks logged ----------------------------------------------------------------------


def attempt_parts(log: str) -> dict[int, str]:
    """A unit log cut at its guard's attempt banners (attempt 1 has none)."""
    parts, attempt, start = {}, 1, 0
    for found in BANNER.finditer(log):
        parts[attempt] = parts.get(attempt, "") + log[start:found.start()]
        attempt, start = int(found[1]), found.end()
    parts[attempt] = parts.get(attempt, "") + log[start:]
    return parts


def trained(text: str) -> list[tuple[float, int]]:
    """(time, steps done) of each training step logged, numbered as the workload counts them."""
    return [(seconds(stamp), (int(epoch) - 1) * int(per) + int(batch) + 1)
            for stamp, epoch, batch, per in TRAINED.findall(text)]


def per_attempt(logs: list[tuple[str, str]], attempts: list[dict] | None = None) -> dict[int, dict]:
    """For each attempt, over the unit logs (host, text) of its nodes as the record names them
    (every node's where no record is given): its last step and when, its first step's time,
    and the step it resumed from."""
    out: dict[int, dict] = {}
    for host, log in logs:
        for attempt, text in attempt_parts(log).items():
            if attempts is not None and (attempt > len(attempts) or host not in attempts[attempt - 1]["nodes"]):
                continue
            row = out.setdefault(attempt, {"reached": None, "last_at": None, "first_at": None, "resumed": None})
            steps = trained(text)
            if steps:
                if row["reached"] is None or steps[-1][1] > row["reached"]:
                    row["reached"], row["last_at"] = steps[-1][1], steps[-1][0]
                if row["first_at"] is None or steps[0][0] < row["first_at"]:
                    row["first_at"] = steps[0][0]
            resumed = RESUMED.search(text)
            if resumed and row["resumed"] is None:
                row["resumed"] = int(resumed[1] or resumed[2])
    return out


def outside(logs: list[tuple[str, str]], attempts: list[dict]) -> list[str]:
    """Training that the run's record does not have: a node whose guard went on with an attempt
    of its own (a split brain), or trained in an attempt that the record runs without it."""
    found = []
    for host, log in logs:
        for attempt, text in attempt_parts(log).items():
            steps = trained(text)
            if steps and (attempt > len(attempts) or host not in attempts[attempt - 1]["nodes"]):
                found.append(f"{host} trained {len(steps)} steps in an attempt {attempt} that the record "
                             + ("does not have" if attempt > len(attempts) else
                                f"runs on {', '.join(attempts[attempt - 1]['nodes'])}"))
    return found


# --- the nodes ------------------------------------------------------------------------------------


def container(host: str) -> str:
    return f"{NAME}-{host}"


def run(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    done = subprocess.run(args, check=False, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {done.stderr.strip()}")
    return done


def on_node(host: str, command: str, check: bool = False, timeout: float = 60) -> str:
    return run("docker", "exec", container(host), "sh", "-c", command, check=check, timeout=timeout).stdout


def paused(host: str) -> bool:
    return run("docker", "inspect", "-f", "{{.State.Paused}}", container(host), check=False).stdout.strip() == "true"


def retried(*args: str) -> None:
    """docker pause can fail on a busy machine ("unable to freeze"): tried again, as the tests do."""
    for _ in range(10):
        if run(*args, check=False).returncode == 0:
            return
        time.sleep(1)
    run(*args)


class Nodes:
    """The soak's ways into its three docker hosts, and what it changed there, to undo."""

    def __init__(self):
        self.frozen: dict[str, list[str]] = {}
        self.cut: set[str] = set()
        self.full: dict[str, str] = {}
        networks = {h: json.loads(run("docker", "inspect", "-f", "{{json .NetworkSettings.Networks}}",
                                      container(h)).stdout) for h in NODES}
        self.address = {h: networks[h][NAME]["IPAddress"] for h in NODES}

    def ranks(self, host: str) -> list[str]:
        return on_node(host, "docker ps -q --filter label=torchfleet.run").split()

    def freeze(self, host: str) -> None:
        """The whole node: its rank containers first (siblings of it in cgroup v1), then itself."""
        inner = self.ranks(host)
        self.frozen[host] = inner
        for name in inner:
            retried("docker", "exec", container(host), "docker", "pause", name)
        retried("docker", "pause", container(host))

    def thaw(self, host: str) -> None:
        inner = self.frozen.pop(host, [])
        run("docker", "unpause", container(host), check=False)
        if inner:
            on_node(host, "docker unpause " + " ".join(inner))

    def disconnect(self, host: str) -> None:
        self.cut.add(host)
        run("docker", "network", "disconnect", NAME, container(host))

    def reconnect(self, host: str) -> None:
        self.cut.discard(host)
        run("docker", "network", "connect", "--ip", self.address[host], "--alias", host, NAME, container(host))

    def kill_rank(self, host: str) -> str:
        """SIGKILL to the rank's own process: under the guard that docker-init started in the
        rank container (forked by it, or by its fork server in a later attempt), the one that
        leads a process group of its own."""
        table = [line.split(None, 3) for line in on_node(host, "ps -eo pid=,ppid=,pgid=,args=").splitlines()]
        init = {pid for pid, _, _, args in table if args.startswith("/sbin/docker-init") and "/out/guard.py" in args}
        guards = {pid for pid, ppid, _, args in table if ppid in init and "/out/guard.py" in args}
        under, grew = set(guards), True
        while grew:
            more = {pid for pid, ppid, _, _ in table if ppid in under} - under
            under, grew = under | more, bool(more)
        ranks = [pid for pid, _, pgid, _ in table if pid in under - guards and pgid == pid]
        if len(ranks) != 1:
            raise RuntimeError(f"{host}: no single rank process under a guard: {table}")
        on_node(host, f"kill -9 {ranks[0]}", check=True)
        return ranks[0]

    def mount(self, folder: str) -> None:
        for host in NODES:
            on_node(host, f"mkdir -p {folder} && mount -t tmpfs -o size={TMPFS},mode=0755 soak {folder}", check=True)

    def fill(self, host: str, folder: str) -> None:
        self.full[host] = folder
        # dd ends at ENOSPC, which is the point.
        on_node(host, f"dd if=/dev/zero of={folder}/{FILL} bs=64k 2>/dev/null; true")

    def free(self, host: str) -> None:
        folder = self.full.pop(host, None)
        if folder:
            on_node(host, f"rm -f {folder}/{FILL}")

    def undo(self) -> None:
        """Whatever fault is still in place, ended."""
        for host in list(self.frozen):
            self.thaw(host)
        for host in list(self.cut):
            self.reconnect(host)
        for host in list(self.full):
            self.free(host)

    def unmount(self, folder: str) -> None:
        for host in NODES:
            on_node(host, f"umount {folder} 2>/dev/null; rmdir {folder} 2>/dev/null; true")

    def record(self, run_id: str) -> dict | None:
        """The run's record as its master keeps it: the newest job.json on a node that answers
        and that the run did not move away from."""
        best = None
        for host in NODES:
            if paused(host):
                continue
            text = on_node(host, f"cat {RUNS}/{run_id}/{run_vocab.JOB} 2>/dev/null", timeout=20)
            try:
                job = json.loads(text)
            except ValueError:
                continue
            if job.get("moved_to"):
                continue
            if best is None or job.get("updated_at", "") > best.get("updated_at", ""):
                best = job
        return best

    def first_step(self, run_id: str, host: str, attempt: int) -> float | None:
        """When the unit on ``host`` first trained in ``attempt`` (its own copy of that
        attempt's lines, from attempt 2 on)."""
        name = RANK_LOGS if attempt == 1 else run_vocab.attempt_log(RANK_LOGS, attempt)
        text = on_node(host, f"grep -h -m1 'Train Epoch' {RUNS}/{run_id}/{name} 2>/dev/null", timeout=20)
        found = TRAINED.search(text)
        return seconds(found[1]) if found else None

    def logs(self, run_id: str) -> list[tuple[str, str]]:
        """Every unit log of the run, read on the nodes (every attempt, after its banner), with its host."""
        logs = []
        for host in NODES:
            listing = on_node(host, f"ls {RUNS}/{run_id} 2>/dev/null", timeout=30).split()
            for name in listing:
                if RANK_LOG.fullmatch(name):
                    logs.append((host, on_node(host, f"cat {RUNS}/{run_id}/{name}", timeout=120)))
        return logs

    def leftovers(self, run_id: str) -> list[str]:
        """What the run left on any node: rank containers, guard or workload processes, guard
        records not ended, guard locks still held."""
        found = []
        for host in NODES:
            names = on_node(host, "docker ps -a --filter label=torchfleet.run --format '{{.Names}} {{.Status}}'")
            found += [f"{host}: container {line}" for line in names.splitlines()]
            procs = on_node(host, "ps -eo pid=,args=").splitlines()
            found += [f"{host}: process {line.strip()[:120]}" for line in procs if LEFTOVER.search(line)]
            states = on_node(host, f"cd {RUNS}/{run_id} 2>/dev/null && for f in {run_vocab.GUARD_RECORDS}; do "
                                   "printf '%s ' $f; python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))"
                                   "[\"state\"])' $f; done")
            found += [f"{host}: record {line}" for line in states.splitlines()
                      if line.split()[-1] not in ("exited", "stopped", "left_out")]
            locks = on_node(host, f"cd {RUNS}/{run_id} 2>/dev/null && for f in {run_vocab.GUARD_LOCKS}; do "
                                  "flock -n -x $f true || echo $f; done")
            found += [f"{host}: lock {line} held" for line in locks.split()]
        return found


# --- the cluster and its runs -------------------------------------------------------------------


def cluster_up() -> None:
    """The three hosts, made and provisioned once; kept for the next soak."""
    marker = FOLDER / "provisioned"
    running = [h for h in NODES if run("docker", "inspect", "-f", "{{.State.Running}}", container(h),
                                       check=False).stdout.strip() == "true"]
    if marker.exists() and len(running) == len(NODES):
        return
    print(f"making {NAME} (3 docker hosts on {SUBNET}) and provisioning it", flush=True)
    (FOLDER / "runs").mkdir(parents=True, exist_ok=True)
    cluster, _ = torchfleet.local_up(len(NODES), name=NAME, subnet=SUBNET, inventory_dir=FOLDER / "inventory",
                                     runs_dir=FOLDER / "runs", env=ENV, extra_vars={"image_archive_on_node": True},
                                     progress=False)
    cluster.provision()
    marker.write_text(datetime.now(timezone.utc).isoformat())


def cluster_down() -> None:
    for host in NODES:
        run("docker", "unpause", container(host), check=False)
    torchfleet.local_down(name=NAME, inventory_dir=FOLDER / "inventory", env=ENV, progress=False)
    (FOLDER / "provisioned").unlink(missing_ok=True)


def launch(run_id: str, opts, epochs: int, restarts: int, checkpoint_dir: str) -> subprocess.Popen:
    """An attached launch of the bundled workload with restarts on, in a session of its own."""
    env = dict(os.environ, **ENV, TORCHFLEET_RUNS_DIR=str(FOLDER / "runs"))
    command = [CLI, "launch", "-q", "--json", "-i", str(FOLDER / "inventory"), "--workload", str(WORKLOAD),
               "--job", "soak", "--run-id", run_id,
               "-e", f"launch_max_restarts={restarts}", "-e", f"launch_min_nodes={opts.min_nodes}",
               "-e", f"launch_node_timeout={opts.node_timeout}", "-e", f"launch_rejoin_timeout={opts.rejoin_timeout}",
               "-e", f"launch_checkpoint_dir={checkpoint_dir}", "--",
               *workload_args(opts, epochs)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)


def workload_args(opts, epochs: int) -> list[str]:
    return ["--batch-size", str(BATCH), "--seed", str(opts.seed), "--log-interval", str(LOG_INTERVAL),
            "--epoch", str(epochs), "--checkpoint-every", str(opts.checkpoint_every)]


def finish(process: subprocess.Popen, timeout: float | None = None) -> tuple[int, dict]:
    out, err = process.communicate(timeout=timeout)
    try:
        return process.returncode, json.loads(out)
    except ValueError:
        return process.returncode, {"error": {"message": f"no JSON: {out[-1500:]} {err[-1500:]}"}}


def stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def checksums(run_id: str) -> set[str]:
    """Every checksum that a rank wrote, as collected (beside the logs, or in a node's out folder)."""
    return {p.read_text().strip() for p in (FOLDER / "runs" / run_id).rglob(run_vocab.checksum_file("*"))}


def clean_run(nodes: Nodes, opts, run_id: str, epochs: int, restarts: int) -> tuple[int, dict, dict]:
    """A launch with no fault, to its end: (exit, its JSON, its attempt: the steps it took
    and seconds per step). Its checkpoint folder goes after it."""
    folder = f"{CHECKPOINTS}/{run_id}"
    process = launch(run_id, opts, epochs, restarts, folder)
    try:
        code, out = finish(process, timeout=4 * 3600)
    except BaseException:
        # As Ctrl-C would: the launch stops every rank and collects (SIGINT may be ignored here).
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=300)
        raise
    for host in NODES:
        on_node(host, f"rm -rf {folder}")
    first = per_attempt(nodes.logs(run_id)).get(1, {})
    span = (first.get("last_at") or 0) - (first.get("first_at") or 0)
    steps = first.get("reached") or 0
    return code, out, {"steps": steps, "step_s": span / max(1, steps - 1)}


def calibrate(nodes: Nodes, opts) -> int:
    """Epochs that train for TRAIN_SHARE of the soak, from a short run's pace."""
    run_id = f"soak-calibrate-{stamp()}"
    print(f"calibrating: {CALIBRATION_EPOCHS} epochs ({run_id})", flush=True)
    code, out, pace = clean_run(nodes, opts, run_id, CALIBRATION_EPOCHS, 1)
    if code != 0 or not pace["steps"]:
        sys.exit(f"the calibration run failed (exit {code}): {out.get('error')}")
    per_epoch = pace["steps"] / CALIBRATION_EPOCHS
    epochs = max(1, math.ceil(opts.minutes * 60 * TRAIN_SHARE / (pace["step_s"] * per_epoch)))
    print(f"  {pace['step_s'] * 1000:.1f} ms a step, {per_epoch:.0f} steps an epoch: {epochs} epochs", flush=True)
    return epochs


def reference(nodes: Nodes, opts, epochs: int, restarts: int) -> dict:
    """The uninterrupted run's checksum for these arguments: run once on this cluster, then kept."""
    path = FOLDER / "references.json"
    known = json.loads(path.read_text()) if path.exists() else {}
    digest = hashlib.sha256(WORKLOAD.read_bytes()).hexdigest()[:12]
    key = f"{WORKLOAD.name}@{digest} " + " ".join(workload_args(opts, epochs))
    if key in known:
        print(f"reference: {known[key]['run_id']} ({key})", flush=True)
        return known[key]
    run_id = f"soak-reference-{stamp()}"
    print(f"reference: {run_id}, no faults ({key})", flush=True)
    started = time.time()
    code, out, pace = clean_run(nodes, opts, run_id, epochs, restarts)
    attempts = (out.get("run") or {}).get("attempts") or []
    sums = checksums(run_id)
    if code != 0 or len(attempts) != 1 or len(sums) != 1:
        sys.exit(f"the reference run {run_id} is no reference: exit {code}, {len(attempts)} attempts, "
                 f"checksums {sums}: {out.get('error')}")
    known[key] = {"run_id": run_id, "checksum": sums.pop(), "seconds": round(time.time() - started, 1), **pace}
    path.write_text(json.dumps(known, indent=1))
    print(f"  {pace['steps']} steps in {known[key]['seconds']:.0f}s", flush=True)
    return known[key]


# --- the soak -------------------------------------------------------------------------------------


class Soak:
    """One run under faults: injects them on schedule and waits for each to be survived."""

    def __init__(self, nodes: Nodes, opts, run_id: str, process: subprocess.Popen, folder: str, epochs: int,
                 train_s: float):
        self.nodes, self.opts, self.run_id, self.process, self.folder = nodes, opts, run_id, process, folder
        self.epochs, self.train_s = epochs, train_s
        self.t0 = time.time()

    def say(self, text: str) -> None:
        print(f"  [{clock(time.time(), self.t0)}] {text}", flush=True)

    def running(self) -> bool:
        return self.process.poll() is None

    def trained(self, attempt: int, master: str) -> float | None:
        return self.nodes.first_step(self.run_id, master, attempt)

    def wait_training(self, bound: float = BOUND) -> tuple[dict, float] | None:
        """Until the record's attempt trains: (the record, its first step's time)."""
        deadline = time.time() + bound
        while self.running() and time.time() < deadline:
            job = self.nodes.record(self.run_id)
            if job and job.get("state") == "running" and not job.get("restarting"):
                first = self.trained(job["attempt"], job["master"])
                if first:
                    return job, first
            time.sleep(1)
        return None

    def done(self, master: str) -> float:
        """The share of the run's training done, as the master's rank last logged it."""
        tail = on_node(master, f"cd {RUNS}/{self.run_id} && for f in {RANK_LOGS}; do case $f in *.attempt-*) ;; "
                               "*) tail -n 3 $f;; esac; done", timeout=20)
        found = TRAINED.findall(tail)
        if not found:
            return 0.0
        _, epoch, batch, per = found[-1]
        return ((int(epoch) - 1) * int(per) + int(batch) + 1) / (self.epochs * int(per))

    def inject_all(self, faults: list[Fault]) -> list[Fault]:
        deadline = self.t0 + self.opts.minutes * 60
        got = self.wait_training()
        if not got:
            self.say("the run never trained")
            return []
        since, done = got[1], []
        for fault in faults:
            at = since + fault.gap
            if at > deadline:
                break
            while self.running() and time.time() < at:
                time.sleep(1)
            got = self.wait_training()
            if not got:
                break
            job = got[0]
            left = (1 - self.done(job["master"])) * self.train_s
            if left < 90:
                self.say(f"{left:.0f}s of training left: no more faults")
                break
            nodes = job["attempts"][-1]["nodes"]
            hit = candidates(fault.kind, nodes)
            if not hit:
                fault.note = f"skipped: the attempt runs on {', '.join(nodes)} only"
                self.say(f"{fault.kind}: {fault.note}")
                done.append(fault)
                since = time.time()
                continue
            fault.target, fault.attempt = hit[int(fault.pick * len(hit))], job["attempt"]
            self.inject(fault)
            done.append(fault)
            self.recover(fault)
            if fault.back is None:
                self.say(f"{fault.kind} on {fault.target}: the run did not train again ({fault.note})")
                break
            self.say(f"{fault.kind} on {fault.target}: attempt {fault.after} trains, "
                     f"{fault.back - fault.injected:.0f}s after the fault")
            since = fault.back
        return done

    def inject(self, fault: Fault) -> None:
        n, host = self.nodes, fault.target
        fault.injected = time.time()
        if fault.kind == "kill":
            fault.extra["pid"] = n.kill_rank(host)
        elif fault.kind in ("worker", "master"):
            n.freeze(host)
        elif fault.kind == "cut":
            n.disconnect(host)
        elif fault.kind == "disk":
            n.fill(host, self.folder)
        held = f" for {fault.hold:.0f}s" if fault.kind in ("worker", "master", "cut") else ""
        self.say(f"{fault.kind} on {host}{held} (attempt {fault.attempt})")

    def restore(self, fault: Fault) -> None:
        if fault.restored is not None or fault.kind == "kill":
            return
        {"worker": self.nodes.thaw, "master": self.nodes.thaw, "cut": self.nodes.reconnect,
         "disk": self.nodes.free}[fault.kind](fault.target)
        fault.restored = time.time()

    def recover(self, fault: Fault) -> None:
        """Until the fault is undone and a later attempt trains; the disk is freed as soon as
        the attempt it broke has ended, before the next one's checkpoint copy."""
        until = fault.injected + BOUND + fault.hold
        try:
            while time.time() < until:
                if not self.running():
                    fault.note = "the launch ended"
                    return
                now = time.time()
                if fault.kind in ("worker", "master", "cut") and now >= fault.injected + fault.hold:
                    self.restore(fault)
                job = self.nodes.record(self.run_id)
                moved = job is not None and (job["attempt"] > fault.attempt or job.get("restarting"))
                if fault.kind == "disk" and (moved or now >= fault.injected + DISK_MOST):
                    self.restore(fault)
                if moved and job["attempt"] > fault.attempt and not job.get("restarting"):
                    first = self.trained(job["attempt"], job["master"])
                    if first and (fault.restored or fault.kind == "kill"):
                        fault.after, fault.back = job["attempt"], first
                        return
                time.sleep(1)
            fault.note = f"no attempt trained within {BOUND + fault.hold:.0f}s"
        finally:
            self.restore(fault)


# --- the verdict ----------------------------------------------------------------------------------


def analyse(faults: list[Fault], attempts: list[dict], steps: dict[int, dict], step_s: float) -> list[dict]:
    """One row per fault: how the attempt it hit ended, and what it cost."""
    rows = []
    for f in faults:
        row = {"kind": f.kind, "target": f.target, "injected": f.injected, "hold": f.hold, "note": f.note,
               "attempt": f.attempt, "after": f.after, "cause": None, "recorded": False, "detect_s": None,
               "stalled_s": None, "reached": None, "resumed": None, "redone": None, "lost_s": None,
               "world_size": None, "survived": f.back is not None}
        if f.attempt and f.attempt <= len(attempts):
            hit = attempts[f.attempt - 1]
            row["cause"] = hit.get("cause")
            row["recorded"] = expected(f.kind, f.target, hit.get("cause"))
            if hit.get("ended_at"):
                row["detect_s"] = seconds(hit["ended_at"]) - f.injected
        if f.after and f.after <= len(attempts):
            row["world_size"] = attempts[f.after - 1].get("world_size")
            out = [n for n in NODES if n not in (attempts[f.after - 1].get("nodes") or NODES)]
            if out:
                row["note"] = " ".join([row["note"], f"attempt {f.after} runs without {', '.join(out)}"]).strip()
            before, next_one = steps.get(f.attempt, {}), steps.get(f.after, {})
            row["reached"] = before.get("reached")
            row["resumed"] = next_one.get("resumed")
            if row["resumed"] is None:
                row["resumed"] = attempts[f.after - 1].get("resumed_from")
            if before.get("last_at") and next_one.get("first_at"):
                row["stalled_s"] = next_one["first_at"] - before["last_at"]
            if row["reached"] is not None and row["resumed"] is not None:
                row["redone"] = row["reached"] - row["resumed"]
                if row["stalled_s"] is not None:
                    row["lost_s"] = row["stalled_s"] + row["redone"] * step_s
        rows.append(row)
    return rows


def num(value, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[dict], t0: float) -> str:
    head = (f"{'#':>2} {'at':>5} {'fault':<6} {'node':<6} {'hold s':>6} {'attempt':>7} {'recorded cause':<44} "
            f"{'detect s':>8} {'stalled s':>9} {'reached':>7} {'resumed':>7} {'redone':>6} {'lost s':>6} "
            f"{'world':>5} {'survived':>8}")
    lines = [head, "-" * len(head)]
    for i, r in enumerate(rows, 1):
        cause = r["cause"] or {}
        said = f"{cause.get('kind', '-')} {cause.get('host', '')}".strip()
        code = re.search(r"code \d+", cause.get("reason", ""))
        said += f" ({code[0]})" if code else ""
        said = ("" if r["recorded"] or not r["cause"] else "UNEXPECTED ") + said
        hops = f"{r['attempt']}->{r['after']}" if r["after"] else (str(r["attempt"]) if r["attempt"] else "-")
        hold = num(r["hold"]) if r["kind"] in ("worker", "master", "cut") else "-"
        lines.append(f"{i:>2} {clock(r['injected'], t0):>5} {r['kind']:<6} {r['target'] or '-':<6} {hold:>6} "
                     f"{hops:>7} {said[:44]:<44} {num(r['detect_s'], '.1f'):>8} {num(r['stalled_s'], '.1f'):>9} "
                     f"{num(r['reached']):>7} {num(r['resumed']):>7} {num(r['redone']):>6} "
                     f"{num(r['lost_s'], '.1f'):>6} {num(r['world_size']):>5} "
                     f"{('yes' if r['survived'] else 'NO'):>8}" + (f"  {r['note']}" if r["note"] else ""))
    return "\n".join(lines)


def verdict(code: int, out: dict, rows: list[dict], attempts: list[dict], sums: set[str], ref: dict,
            left: list[str], faults: list[Fault], elsewhere: list[str]) -> list[tuple[str, bool, str]]:
    """Each check: (what, passed, the detail)."""
    checks = []
    error = (out.get("error") or {}).get("message", "")
    checks.append(("the run finished (exit 0)", code == 0, f"exit {code}" + (f": {error[:300]}" if error else "")))
    same = sums == {ref["checksum"]}
    sizes = sorted({a.get("world_size") for a in attempts if a.get("world_size")})
    detail = (f"{', '.join(sorted(s[:16] for s in sums)) or 'none'} against the reference's {ref['checksum'][:16]} "
              f"({ref['run_id']}); world sizes of the attempts: {sizes}")
    checks.append(("the parameter checksum equals the uninterrupted run's", same, detail))
    hit = {f.attempt for f in faults if f.target}
    problems = [f"attempt {a['attempt']} has no cause" for a in attempts[:-1] if not a.get("cause")]
    problems += [f"attempt {a['attempt']} did not end on a fault: {(a.get('cause') or {}).get('reason')}"
                 for a in attempts[:-1] if a["attempt"] not in hit]
    problems += [f"{r['kind']} on {r['target']} (attempt {r['attempt']}) is recorded as "
                 f"{(r['cause'] or {}).get('reason')}" for r in rows if r["target"] and not r["recorded"]]
    if not attempts or attempts[-1].get("cause") is not None:
        problems.append("the last attempt did not end well")
    checks.append(("every attempt is on the record with its cause", not problems,
                   "; ".join([f"{len(attempts)} attempts", *problems])))
    checks.append(("no node trained outside the run's recorded attempts (no split brain)", not elsewhere,
                   "; ".join(elsewhere) or "none"))
    checks.append(("nothing left on any node (containers, processes, guards, locks)", not left,
                   "; ".join(left) or "none"))
    return checks


def report(opts, run_id: str, t0: float, ended: float, ref: dict, rows: list[dict], checks, faults) -> None:
    kinds = {k: sum(1 for f in faults if f.kind == k and f.target) for k in KINDS}
    survived = sum(1 for r in rows if r["target"] and r["survived"])
    injected = sum(kinds.values())
    lost = sum(r["lost_s"] or 0 for r in rows)
    print(f"\nsoak {run_id} ({datetime.fromtimestamp(t0, timezone.utc):%Y-%m-%d %H:%M} UTC, {ended - t0:.0f}s; "
          f"seed {opts.seed}; 3 docker hosts, container mode; launch_node_timeout {opts.node_timeout}s, "
          f"launch_rejoin_timeout {opts.rejoin_timeout}s, launch_min_nodes {opts.min_nodes}; "
          f"a checkpoint every {opts.checkpoint_every} steps; reference {ref['steps']} steps in "
          f"{ref['seconds']:.0f}s, {ref['step_s'] * 1000:.1f} ms a step)")
    print(table(rows, t0))
    print(f"faults injected: {injected} ({', '.join(f'{k} {v}' for k, v in kinds.items())}); survived: {survived}; "
          f"time lost: {lost:.0f}s")
    print("at: since the launch; detect: from the fault to the attempt's recorded end; stalled: from the last step "
          "before the fault to the next attempt's first step (any rank); reached: the last step logged before the "
          "fault; resumed: the step the next attempt resumed from; lost: stalled plus the steps redone at the "
          "reference's pace; world: the next attempt's world size")
    for what, passed, detail in checks:
        print(f"{'PASS' if passed else 'FAIL'}  {what}: {detail}")


def parse(argv: list[str]):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30, help="how long faults are injected (a soak: 20 to 60)")
    p.add_argument("--seed", type=int, default=58, help="the schedule's seed and the workload's")
    p.add_argument("--faults", type=int, default=0, help="at most this many faults (0: as many as the time allows)")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"the fault kinds, of {', '.join(KINDS)}")
    p.add_argument("--gap", default="60,180", help="seconds between the run training again and the next fault")
    p.add_argument("--hold", default="20,30", help="seconds a node stays frozen or cut off")
    p.add_argument("--epochs", type=int, default=0, help="the workload's epochs (0: calibrated to the minutes)")
    p.add_argument("--checkpoint-every", type=int, default=200)
    p.add_argument("--node-timeout", type=int, default=10, help="launch_node_timeout")
    p.add_argument("--rejoin-timeout", type=int, default=90, help="launch_rejoin_timeout: longer than any hold")
    p.add_argument("--min-nodes", type=int, default=2,
                   help="launch_min_nodes: a majority, so that a node cut off alone cannot go on by itself")
    p.add_argument("--plan", action="store_true", help="print the schedule and stop")
    p.add_argument("--down", action="store_true", help="remove the soak's cluster and stop")
    opts = p.parse_args(argv)
    opts.kinds = tuple(k for k in opts.kinds.split(",") if k)
    opts.gap = tuple(float(x) for x in opts.gap.split(","))
    opts.hold = tuple(float(x) for x in opts.hold.split(","))
    if set(opts.kinds) - set(KINDS) or not opts.kinds:
        p.error(f"--kinds: of {', '.join(KINDS)}")
    if opts.hold[1] + opts.node_timeout >= opts.rejoin_timeout:
        p.error("--rejoin-timeout must exceed the longest hold plus the node timeout, for a node to come back")
    return opts


def main(argv: list[str]) -> int:
    opts = parse(argv)
    if opts.down:
        cluster_down()
        return 0
    count = opts.faults or int(opts.minutes * 60 // opts.gap[0]) + 1
    faults = schedule(opts.seed, count, opts.kinds, opts.gap, opts.hold)
    if opts.plan:
        for i, f in enumerate(faults, 1):
            print(f"{i:>2} {f.kind:<6} {f.gap:>5.0f}s after the last recovery, hold {f.hold:.0f}s, pick {f.pick:.2f}")
        return 0
    cluster_up()
    nodes = Nodes()
    epochs = opts.epochs or calibrate(nodes, opts)
    restarts = count + 5
    ref = reference(nodes, opts, epochs, restarts)
    run_id = f"soak-{opts.seed}-{stamp()}"
    folder = f"{CHECKPOINTS}/{run_id}"
    nodes.mount(folder)
    print(f"soak: {run_id}, {epochs} epochs, faults for {opts.minutes:g} minutes", flush=True)
    process = launch(run_id, opts, epochs, restarts, folder)
    soak = Soak(nodes, opts, run_id, process, folder, epochs, ref["steps"] * ref["step_s"])
    done: list[Fault] = []
    try:
        done = soak.inject_all(faults)
        soak.say("no more faults: waiting for the run's end")
        code, out = finish(process, timeout=max(600.0, 4 * ref["seconds"]))
    except BaseException:
        nodes.undo()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            finish(process, timeout=300)
        raise
    finally:
        nodes.undo()
    ended = time.time()
    left = nodes.leftovers(run_id)
    if left:
        # A guard that a thaw woke may still be ending: what stays a minute on is left over.
        time.sleep(60)
        left = nodes.leftovers(run_id)
    nodes.unmount(folder)
    summary = FOLDER / "runs" / run_id / run_vocab.SUMMARY
    attempts = (json.loads(summary.read_text()) if summary.exists() else out.get("run") or {}).get("attempts") or []
    logs = nodes.logs(run_id)
    rows = analyse(done, attempts, per_attempt(logs, attempts), ref["step_s"])
    checks = verdict(code, out, rows, attempts, checksums(run_id), ref, left, done, outside(logs, attempts))
    report(opts, run_id, soak.t0, ended, ref, rows, checks, done)
    (FOLDER / "runs" / run_id / "soak.json").write_text(json.dumps(
        {"faults": [asdict(f) for f in done], "rows": rows, "checks": checks, "reference": ref}, indent=1))
    return 0 if all(passed for _, passed, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
