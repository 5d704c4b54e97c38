"""The guard: what supervises a run on the cluster, whether or not a controller watches.

Every unit torchfleet starts (a rank, a torchrun agent, an sshd, mpirun) runs under a guard
of its own: ``python3 guard.py CONFIG UNIT -- ARGV``. The guard starts ARGV (forked from
itself, torch already imported, when ARGV is its own Python running a script), passes its
output through, and meets the other guards in a torch TCPStore (the one torchelastic uses)
that the guard of the master's first unit hosts on ``launch_guard_port``, bound to the
cluster address only. Through it:

- a unit that exits non-zero, stalls, or runs past the job's time sets ``abort`` once;
  every guard stops its unit when it sees it and records why (``guard-UNIT.json``);
- each guard bumps its heartbeat counter; the host declares a node lost when a counter
  stands still for ``node_timeout``, and a guard that cannot reach the host for that long
  stops its own unit (so the master's loss stops everyone too);
- a ``stop`` file in the run's folder (``torchfleet stop``) aborts the run from any node;
- the host writes the run's state to ``job.json``, which a controller reads to attach.

It runs with the Python that runs the ranks (it needs torch) and nothing else, so it is a
single file copied into each run's folder, beside the run's vocabulary (run_vocab.py) that it
imports. The decisions are the pure functions at the top.
"""

from __future__ import annotations

import builtins
import collections
import importlib.machinery
import io
import json
import os
import re
import runpy
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import types
import warnings
from datetime import datetime, timedelta, timezone
from typing import NoReturn

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
except ImportError:  # on a node: run as a script from the run's folder, where run_vocab.py lies beside it
    import run_vocab as vocab

# Exit codes of a guard whose unit it stopped: 128 + the signal, as a shell reports it.
STOPPED = 128 + signal.SIGTERM
# The node's secret environment for mpirun's ranks (the launch role's secret_env_file.yml):
# no rank of the run starts once a unit of it has ended, so the first guard to end removes
# it, also on a node the controller lost and could not clean.
SECRET_FILES = (vocab.SECRET_ENV,)
# How long a guard that is done waits for its unit's last lines (a traceback) to reach the log.
OUTPUT_DRAIN_S = 2.0


# --- decisions (pure; unit-tested without a store) --------------------------------------------


def exit_code(returncode: int) -> int:
    """A child's exit as a shell reports it: a signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def who(unit: dict) -> str:
    """How a report names a unit: rank N (the first of its ranks for torchrun), or its role."""
    if unit.get("role") == "rank" or (unit.get("role") == "torchrun" and unit.get("ranks")):
        ranks = unit.get("ranks") or []
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
        return f"{label} on {unit['host']}" if unit.get("role") == "rank" else f"torchrun ({label}) on {unit['host']}"
    return f"{unit.get('role', 'unit')} on {unit['host']}"


def abort_for_exit(unit: dict, code: int) -> dict | None:
    """A unit that ended with an error aborts the run; one that succeeded does not."""
    if code == 0:
        return None
    return {"kind": vocab.AbortKind.RANK_FAILED.value, "host": unit["host"], "unit": unit["name"],
            "reason": f"{who(unit)} exited with code {code}"}


def stalled(unit: dict, idle_s: float, stall_timeout: float, progressed: bool = True,
            start_timeout: float = 0) -> dict | None:
    """A unit silent for ``stall_timeout``. Before its first sign of progress it is still
    starting (importing, joining the group): the start's allowance applies, if longer."""
    if stall_timeout <= 0 or idle_s < (stall_timeout if progressed else max(stall_timeout, start_timeout)):
        return None
    what = "made no progress" if progressed else "showed no progress since its start"
    return {"kind": vocab.AbortKind.STALLED.value, "host": unit["host"], "unit": unit["name"],
            "reason": f"{who(unit)} {what} (no output line, no heartbeat) for {int(idle_s)}s "
                      f"(launch_stall_timeout={stall_timeout:g})"}


def lost_units(units: list[dict], seen: dict[int, float], finished: set[int], now: float, node_timeout: float,
               started: float, start_timeout: float) -> list[int]:
    """Units whose heartbeat stood still too long: ``seen`` is when each last moved (a unit
    that never beat counts from the start, with the start's own allowance)."""
    lost = []
    for index in range(len(units)):
        if index in finished:
            continue
        last = seen.get(index)
        if last is None:
            if now - started > start_timeout:
                lost.append(index)
        elif now - last > node_timeout:
            lost.append(index)
    return lost


def peer_wait_over(waited_s: float, moved: dict[int, int], others: list[int], node_timeout: float,
                   poll: float) -> bool:
    """A unit that failed on a lost connection to a peer (Gloo's "connection reset") may not
    be the cause: the peer's guard, or the host's check for silent units, names the cause
    once it is known. The wait ends when every other running unit's guard has beaten twice
    since (none was killed outright, its guard with it), or after the node timeout."""
    if waited_s > node_timeout + 2 * poll:
        return True
    return all(moved.get(i, 0) >= 2 for i in others)


def preload_target(argv: list[str], executable: str) -> tuple[str, str, list[str]] | None:
    """What a unit that is this very interpreter runs: ``("script", PATH, ARGS)`` for ``PYTHON
    SCRIPT ARGS`` (a rank's usual command), ``("module", NAME, ARGS)`` for ``PYTHON -m NAME
    ARGS`` (a torchrun agent). Such a unit is forked from its guard, which imports torch for its
    store anyway, instead of started as a new interpreter that imports it again: about 2 s
    of CPU per unit. Any other form (other options, a wrapper, another Python) starts as it is."""
    if len(argv) < 2:
        return None
    found = shutil.which(argv[0])
    if not found or not executable or os.path.abspath(found) != os.path.abspath(executable):
        return None
    if argv[1] == "-m" and len(argv) > 2 and re.fullmatch(r"[A-Za-z_][\w.]*", argv[2]):
        return ("module", argv[2], argv[3:])
    if not argv[1].startswith("-") and os.path.isfile(argv[1]):
        return ("script", argv[1], argv[2:])
    return None


def next_connect_timeout(current: float, node_timeout: float) -> float:
    """A store host slow to answer (many guards starting at once on a busy master) needs a
    longer wait: a short one that every guard retries only adds to its load. Doubled per
    failure, up to the node timeout."""
    return min(2 * current, max(1.0, node_timeout))


def abort_for_lost(units: list[dict], lost: list[int], node_timeout: float) -> dict:
    hosts = sorted({units[i]["host"] for i in lost})
    return {"kind": vocab.AbortKind.NODE_LOST.value, "host": hosts[0], "hosts": hosts, "unit": units[lost[0]]["name"],
            "reason": f"lost {', '.join(hosts)}: no heartbeat for {node_timeout:g}s (launch_node_timeout); "
                      f"{who(units[lost[0]])} stopped answering"}


# --- the guard --------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=1)
    os.replace(tmp, path)


class Guard:
    def __init__(self, config: dict, index: int, argv: list[str], run_dir: str):
        self.config, self.index, self.argv, self.run_dir = config, index, argv, run_dir
        self.units = config["units"]
        self.unit = self.units[index]
        self.is_host = index == config["store_unit"]
        self.poll = float(config.get("poll_interval", 0.5))
        self.node_timeout = float(config["node_timeout"])
        self.stall_timeout = float(config.get("stall_timeout", 0))
        self.job_timeout = float(config.get("job_timeout", 0))
        self.grace = float(config.get("stop_grace", 5))
        self.start_timeout = float(config.get("start_timeout", 120))
        self.store = None
        self.connect_timeout = 1.0
        self.child: subprocess.Popen | None = None
        self.output: threading.Thread | None = None
        self.started = time.monotonic()
        self.last_progress = self.started
        self.heartbeat_file = self.unit.get("heartbeat")
        self.heartbeat_mtime = 0.0
        self.has_progressed = False
        self.signalled: int | None = None
        # The unit's last lines, and how the wait after a failure that blames a peer stands.
        self.recent: collections.deque[str] = collections.deque(maxlen=20)
        self.peer_error = re.compile(config["peer_error"], re.IGNORECASE) if config.get("peer_error") else None
        self.peer_wait: dict | None = None
        # A store op on a frozen or cut-off host blocks (the client sets no receive timeout);
        # the watchdog thread ends such a guard's unit on its own (store ops release the GIL).
        self.last_ok = time.monotonic()
        self.ending = threading.Lock()
        # Set when the unit ends, a signal comes or any guard posts the abort: the loop then
        # acts at once instead of at its next poll.
        self.wake = threading.Event()
        self.state = {"unit": index, "name": self.unit["name"], "host": self.unit["host"], "role": self.unit["role"],
                      "ranks": self.unit.get("ranks", []), "state": vocab.UnitState.STARTING.value,
                      "started_at": _now()}

    # -- the child --

    def start_child(self) -> None:
        def own_group():
            os.setpgid(0, 0)
            _die_with_parent()

        target = preload_target(self.argv, sys.executable)
        if target is not None and _import_torch():
            self.child = Forked(target, own_group)
        else:
            self.child = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, preexec_fn=own_group)
        self.output = threading.Thread(target=self._pass_output, daemon=True)
        self.output.start()
        self.state.update(state=vocab.UnitState.RUNNING.value, pid=self.child.pid)
        self._write_state()

    def _pass_output(self) -> None:
        outs = [sys.stdout.buffer]
        if self.unit.get("log"):
            outs.append(open(self.unit["log"], "ab"))
        for line in iter(self.child.stdout.readline, b""):
            self.last_progress, self.has_progressed = time.monotonic(), True
            self.recent.append(line.decode(errors="replace"))
            for out in outs:
                out.write(line)
                out.flush()
        # The pipe closes a moment before the process can be reaped; a wake in between finds
        # it still running and the loop sleeps a whole poll. Bounded: a unit may close its
        # output and go on.
        try:
            await_exit(self.child, self.poll)
        except subprocess.TimeoutExpired:
            pass
        self.wake.set()

    def stop_child(self) -> int:
        """SIGTERM to the unit's process group, SIGKILL after the grace period. The record
        says when the first of each was sent (``sigterm_at``, ``sigkill_at``)."""
        if self.child.poll() is None:
            self.state.setdefault("sigterm_at", time.time())
            _killpg(self.child.pid, signal.SIGTERM)
            try:
                await_exit(self.child, self.grace)
            except subprocess.TimeoutExpired:
                self.state["sigkill_at"] = time.time()
                _killpg(self.child.pid, signal.SIGKILL)
                await_exit(self.child, None)
        else:
            _killpg(self.child.pid, signal.SIGKILL)  # what the unit left in its group
        return exit_code(self.child.returncode)

    def progressed(self) -> float:
        """Seconds since the unit last wrote a line or touched its heartbeat file."""
        if self.heartbeat_file:
            try:
                mtime = os.stat(self.heartbeat_file).st_mtime
            except OSError:
                mtime = 0.0
            if mtime > self.heartbeat_mtime:
                self.heartbeat_mtime = mtime
                self.last_progress, self.has_progressed = time.monotonic(), True
        return time.monotonic() - self.last_progress

    # -- the store --

    def connect(self, timeout: float) -> bool:
        from torch.distributed import TCPStore  # the ranks' own torch; imported once the unit runs

        host, port = self.config["store"]["host"], int(self.config["store"]["port"])
        op_timeout = timedelta(seconds=max(1.0, min(self.node_timeout / 2, 5.0)))
        try:
            if self.is_host:
                import socket

                # Bound to the cluster address only, and handed to the store already listening.
                self.listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
                self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                self.listener.bind((host, port))
                self.listener.listen(256)
                self.store = TCPStore(host, port, is_master=True, timeout=op_timeout, wait_for_workers=False,
                                      master_listen_fd=self.listener.fileno())
            else:
                self.store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout))
                self.store.set_timeout(op_timeout)
        except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError subclasses, by version
            self.store_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.store = None
            return False
        # The store answered; the watchdog's allowance runs from here, not from the start.
        self.last_ok = time.monotonic()
        threading.Thread(target=self._await_abort, args=(TCPStore, host, port), daemon=True).start()
        return True

    def _await_abort(self, store_class, host: str, port: int) -> None:
        """Wake the loop the moment any guard posts the abort. A connection of its own: a
        client is one socket, and this wait blocks it."""
        try:
            store = store_class(host, port, is_master=False, timeout=timedelta(seconds=self.start_timeout))
        except Exception:  # noqa: BLE001 - the loop's polls still see the abort
            return
        while True:
            try:
                store.wait([vocab.ABORT], timedelta(seconds=60))
            except Exception:  # noqa: BLE001 - the wait's timeout, or the store gone: the polls decide
                time.sleep(self.poll)
                continue
            # Every abort stops every unit, so the stop starts here, before the loop has read
            # why (three store ops behind 47 other guards on a busy host); the loop still
            # records the reason and escalates to SIGKILL after the grace period.
            self.state.setdefault("abort_seen_at", time.time())
            if self.child is not None and self.child.poll() is None:
                self.state.setdefault("sigterm_at", time.time())
                _killpg(self.child.pid, signal.SIGTERM)
            self.wake.set()
            return

    def read_abort(self) -> dict | None:
        if self.store.check([vocab.ABORT]):
            return json.loads(self.store.get(vocab.ABORT))
        return None

    def set_abort(self, abort: dict) -> dict:
        """The first abort wins; every guard reports that one."""
        value = self.store.compare_set(vocab.ABORT, "", json.dumps(abort))
        return json.loads(value)

    # -- the loop --

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        self.start_child()
        if not self.is_host:
            threading.Thread(target=self._watchdog, daemon=True).start()
        abort = None
        last_loop = time.monotonic()
        seen: dict[int, float] = {}
        counters: dict[int, int] = {}
        exits: dict[int, int] = {}
        while True:
            self.wake.clear()
            now = time.monotonic()
            if self.is_host and now - last_loop > self.node_timeout:
                # The host itself stood still (paused, starved): the others' silence may be its
                # own, so they get a fresh allowance; a node that is really gone is named after it.
                seen = {i: now for i in seen}
            last_loop = now
            code = self.child.poll()
            try:
                if self.store is None:
                    self.connect(timeout=self.connect_timeout)
                    if self.store is None:
                        self.connect_timeout = next_connect_timeout(self.connect_timeout, self.node_timeout)
                        raise ConnectionError(getattr(self, "store_error", "no store yet"))
                self.store.add(vocab.heartbeat_key(self.index), 1)
                abort = abort or self.read_abort()
                if self.is_host:
                    abort = abort or self._host_checks(seen, counters, exits)
                if abort is None and self._stop_requested():
                    abort = self.set_abort(self._stop_requested())
                if abort is None and code is not None and code != 0 and self._peer_wait_over():
                    abort = self.set_abort(dict(abort_for_exit(self.unit, exit_code(code)), index=self.index))
                if abort is None and self.signalled:
                    abort = self.set_abort({"kind": vocab.AbortKind.STOPPED.value, "host": self.unit["host"],
                                            "unit": self.unit["name"],
                                            "reason": f"{who(self.unit)} got signal {self.signalled}"})
                if abort is None and code is None:
                    found = stalled(self.unit, self.progressed(), self.stall_timeout, self.has_progressed,
                                    self.start_timeout)
                    if found:
                        abort = self.set_abort(dict(found, index=self.index))
                if abort is None and self.unit.get("service") and self.store.check([vocab.DONE]):
                    return self.finish(exit_code(self.stop_child()) if self.child.poll() is None else 0,
                                       vocab.UnitState.STOPPED.value, "the job's other units finished")
                self.last_ok = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - any store failure counts as no contact
                if self.is_host or not isinstance(exc, (RuntimeError, ConnectionError, OSError)):
                    raise
                # Without the store, what this node can tell on its own still stops its unit.
                local = self._stop_requested() or (
                    dict(abort_for_exit(self.unit, exit_code(code)), index=self.index) if code else None)
                if local is None and self.signalled:
                    local = {"kind": vocab.AbortKind.STOPPED.value, "host": self.unit["host"], "unit": self.unit["name"],
                             "reason": f"{who(self.unit)} got signal {self.signalled}"}
                if local is None and time.monotonic() - self.last_ok > self._store_limit():
                    local = self._store_lost()
                abort = abort or local
            if abort is not None:
                return self.abort(abort, exits)
            if code == 0:
                # Exited cleanly: say so, and (the host) keep the store up for the others. The
                # record says it at once, so a launch phase waiting on this unit can go on.
                if "child_exit_code" not in self.state:
                    self.state["child_exit_code"] = 0
                    self._write_state()
                if self.store is not None:
                    self._record_exit(0)
                if not self.is_host:
                    return self.finish(0, vocab.UnitState.EXITED.value)
                if vocab.job_state(self.units, exits, None, []) == vocab.RunState.SUCCEEDED:
                    return self.finish_host(exits, None)
            self.wake.wait(self.poll)

    def _peer_wait_over(self) -> bool:
        """Whether a failed unit may abort the run now (see peer_wait_over)."""
        if self.peer_error is None or not any(self.peer_error.search(line) for line in self.recent):
            return True
        now = time.monotonic()
        if self.peer_wait is None:
            self.peer_wait = {"since": now, "counters": {}, "moved": {}}
            self._say(f"[torchfleet guard] {who(self.unit)} lost a peer; waiting for the peers' guards to name the cause")
        wait, others, exits = self.peer_wait, [], {}
        self._read_exits(exits)
        for i in range(len(self.units)):
            if i == self.index or i in exits:
                continue
            others.append(i)
            count = self.store.add(vocab.heartbeat_key(i), 0)
            if i in wait["counters"] and count != wait["counters"][i]:
                wait["moved"][i] = wait["moved"].get(i, 0) + 1
            wait["counters"][i] = count
        return peer_wait_over(now - wait["since"], wait["moved"], others, self.node_timeout, self.poll)

    def _store_limit(self) -> float:
        """Until the store first answers, the start's allowance applies."""
        return self.node_timeout if self.store is not None else self.start_timeout

    def _store_lost(self) -> dict:
        store = self.config["store"]
        return {"kind": vocab.AbortKind.NODE_LOST.value, "host": store["node"], "hosts": [store["node"]], "unit": None,
                "reason": f"lost the supervision store on {store['node']} ({store['host']}:{store['port']}) for "
                          f"{int(time.monotonic() - self.last_ok)}s (launch_node_timeout={self.node_timeout:g}): "
                          "the master node stopped answering"}

    def _watchdog(self) -> None:
        while True:
            time.sleep(self.poll)
            silent = time.monotonic() - self.last_ok
            # A loop held in a store op (a frozen master) still obeys a stop on its own node,
            # before the store counts as lost.
            requested = self._stop_requested() if silent > 2 * self.poll + 1 else None
            if requested or silent > self._store_limit() + 2 * self.poll:
                if not self.ending.acquire(blocking=False):
                    return
                abort = requested or self._store_lost()
                self.state.setdefault("abort_seen_at", time.time())
                code = self.child.poll()
                final = self.stop_child() if code is None else exit_code(code)
                self.state["stopped_at"] = time.time()
                self._finish_unlocked(final, vocab.UnitState.STOPPED.value, abort["reason"], abort)
                self.exit_now(final)

    def exit_now(self, code: int) -> NoReturn:
        """End the guard once its record is on disk, without tearing down an interpreter that
        imported torch: a third of a second of CPU, and a stop waits for every guard to be gone
        (at 48 guards on 2 cores, 16 s)."""
        if self.output is not None:
            self.output.join(OUTPUT_DRAIN_S)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def _on_signal(self, signum, frame) -> None:
        self.signalled = signum
        self.wake.set()

    def _stop_requested(self) -> dict | None:
        path = os.path.join(self.run_dir, vocab.STOP)
        if not os.path.exists(path):
            return None
        try:
            with open(path) as fh:
                why = fh.read().strip()
        except OSError:
            why = ""
        return {"kind": vocab.AbortKind.STOPPED.value, "host": self.unit["host"], "unit": None,
                "reason": why or "stopped on request (torchfleet stop)"}

    def _record_exit(self, code: int) -> None:
        if not self.store.check([vocab.exit_key(self.index)]):
            self.store.set(vocab.exit_key(self.index), str(code))

    def _read_exits(self, exits: dict) -> None:
        """Into ``exits``, every unit's exit code the store holds and ``exits`` lacks."""
        for i in range(len(self.units)):
            if i not in exits and self.store.check([vocab.exit_key(i)]):
                exits[i] = int(self.store.get(vocab.exit_key(i)))

    def _host_checks(self, seen: dict, counters: dict, exits: dict) -> dict | None:
        now = time.monotonic()
        self._read_exits(exits)
        for i in range(len(self.units)):
            count = self.store.add(vocab.heartbeat_key(i), 0)
            if count and count != counters.get(i):
                counters[i], seen[i] = count, now
        if vocab.job_state(self.units, exits, None, []) == vocab.RunState.SUCCEEDED:
            self.store.set(vocab.DONE, "1")
        lost = lost_units(self.units, seen, set(exits) | {self.index}, now, self.node_timeout, self.started,
                          self.start_timeout)
        self._write_job(vocab.RunState.RUNNING.value, None, exits, seen)
        if lost:
            return self.set_abort(abort_for_lost(self.units, lost, self.node_timeout))
        if self.job_timeout and now - self.started > self.job_timeout:
            return self.set_abort({"kind": vocab.AbortKind.TIMEOUT.value, "host": self.unit["host"], "unit": None,
                                   "reason": f"the job ran past launch_timeout={self.job_timeout:g}s"})
        return None

    def abort(self, abort: dict, exits: dict) -> int:
        if not self.ending.acquire(blocking=False):
            threading.Event().wait()  # the watchdog is ending this guard
        # When this guard learnt of the abort, apart from how long its unit then took to end.
        self.state.setdefault("abort_seen_at", time.time())
        code = self.child.poll()
        own = abort.get("index") == self.index and abort["kind"] == vocab.AbortKind.RANK_FAILED
        final = self.stop_child() if code is None else exit_code(code)
        self.state["stopped_at"] = time.time()
        # Only the unit that caused the abort ended on its own account; any other was stopped
        # because of it, whether by this guard or by its own runner first (torchrun's agents
        # see a peer agent fail through their own store).
        if own:
            state, why = vocab.UnitState.EXITED.value, None
        else:
            state, why = vocab.UnitState.STOPPED.value, abort["reason"]
        if not self.is_host:
            # On disk first: the store may be what is gone, and an op on it may block.
            self._finish_unlocked(final, state, why, abort)
            if self.store is not None:
                _bounded(lambda: self._record_exit(final), 2 * self.poll + 1)
            return final
        self._record_exit(final)
        # Said at once, so that an attached controller need not wait for the stragglers.
        self._write_job(vocab.job_state(self.units, exits, abort, []), abort, exits, {})
        self._await_others(exits)
        self._write_job(vocab.job_state(self.units, exits, abort, []), abort, exits, {})
        return self.finish(final, state, why, abort)

    def _await_others(self, exits: dict) -> None:
        """The host keeps the store up until every other unit has stopped, or has gone
        silent (a unit killed outright, a lost node): a live guard beats every poll."""
        started = time.monotonic()
        deadline = started + self.grace + self.node_timeout
        counters: dict[int, int] = {}
        moved: dict[int, float] = {}
        while time.monotonic() < deadline:
            now = time.monotonic()
            self._read_exits(exits)
            for i in range(len(self.units)):
                if i in exits:
                    continue
                count = self.store.add(vocab.heartbeat_key(i), 0)
                if count != counters.get(i):
                    counters[i], moved[i] = count, now
            waiting = [i for i in range(len(self.units)) if i not in exits
                       and now - moved.get(i, started) < 2 * self.poll + 1 + (self.grace if i in moved else 0)]
            if not waiting:
                return
            time.sleep(self.poll)

    def finish_host(self, exits: dict, abort: dict | None) -> int:
        # Services (sshd) stop once they see `done`; give them a moment to say so.
        deadline = time.monotonic() + self.grace + 2 * self.poll
        while len(exits) < len(self.units) and time.monotonic() < deadline:
            self._read_exits(exits)
            time.sleep(self.poll)
        self._write_job(vocab.job_state(self.units, exits, abort, []), abort, exits, {})
        return self.finish(0, vocab.UnitState.EXITED.value)

    def finish(self, code: int, state: str, why: str | None = None, abort: dict | None = None) -> int:
        self.ending.acquire(blocking=False)
        return self._finish_unlocked(code, state, why, abort)

    def _finish_unlocked(self, code: int, state: str, why: str | None, abort: dict | None) -> int:
        for name in SECRET_FILES:
            try:
                os.remove(os.path.join(self.run_dir, name))
            except OSError:
                pass
        self.state.update(state=state, exit_code=code, ended_at=_now())
        if why:
            self.state["stopped_because"] = why
        if abort:
            self.state["abort"] = abort
        if why:
            self._say(f"[torchfleet guard] stopped {who(self.unit)}: {why}")
        self._write_state()
        return code

    def _say(self, text: str) -> None:
        """A line of the guard's own in the unit's log."""
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        if self.unit.get("log"):
            with open(self.unit["log"], "a") as fh:
                fh.write(text + "\n")

    def _write_state(self) -> None:
        write_json(os.path.join(self.run_dir, vocab.guard_record(self.index)), self.state)

    def _write_job(self, state: str, abort: dict | None, exits: dict, seen: dict) -> None:
        now = time.monotonic()
        write_json(os.path.join(self.run_dir, vocab.JOB), {
            "run_id": self.config["run_id"], "job": self.config["job"], "state": state, "abort": abort,
            "updated_at": _now(), "elapsed_s": round(now - self.started, 1),
            "units": [{"name": u["name"], "host": u["host"], "role": u["role"], "exit_code": exits.get(i),
                       "heartbeat_age_s": round(now - seen[i], 1) if i in seen else None}
                      for i, u in enumerate(self.units)],
        })


class Forked:
    """A unit forked from the guard to run as ``python3 SCRIPT ARGS`` or ``python3 -m MODULE
    ARGS`` would (see preload_target), with what the guard uses of a Popen: pid, stdout,
    poll, wait, returncode. It forks before the guard starts any thread or connects to the store."""

    def __init__(self, target: tuple[str, str, list[str]], setup) -> None:
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            # Python 3.12 warns of forking a process with threads; torch's import leaves one
            # idle thread, and its at-fork handlers are what make its DataLoader's fork safe.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os.close(read)
            _run_target(target, write, setup)
        os.close(write)
        try:
            os.setpgid(pid, pid)  # also here, so that a stop right away reaches its group
        except OSError:
            pass  # the child did it first
        self.pid, self.returncode = pid, None
        self.stdout = os.fdopen(read, "rb")
        self._reaping = threading.Lock()

    def poll(self) -> int | None:
        with self._reaping:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """As Popen waits with a timeout: polls 0.5 ms apart at first, then up to 50 ms."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["python3", "-"], timeout)
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
        return self.returncode


def _import_torch() -> bool:
    try:
        from torch.distributed import TCPStore  # noqa: F401 - what the store needs, loaded once for both
    except Exception:  # noqa: BLE001 - no torch: the unit starts on its own, and the store reports it
        return False
    return True


class ChildExit(BaseException):
    """Raised in a forked unit once its script has ended: it unwinds to main(), so that the
    interpreter ends as the script's own would (its exit functions, threads and objects
    finalized, its sockets closed last), not at once. A peer still joining the group may
    depend on that time."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _exec_as_main(path: str) -> None:
    """Run a script as the interpreter runs one: in a new ``__main__`` module that stays
    ``__main__`` to the end (runpy's would give the guard's back as soon as the script
    returns, before its exit functions and threads, which may pickle its classes)."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None, __builtins__=builtins,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    with io.open_code(path) as fh:
        code = compile(fh.read(), path, "exec")
    exec(code, main.__dict__)  # noqa: S102 - the unit's own script, which it would run anyway


def _run_target(target: tuple[str, str, list[str]], output: int, setup) -> None:
    """In the forked child: become ``python3 SCRIPT ARGS`` (or ``-m MODULE``), then raise
    ChildExit with its exit code."""
    code = 1
    try:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        setup()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(null)
        os.close(output)
        sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
        kind, name, args = target
        sys.argv = [name if kind == "script" else "-m", *args]
        # As the interpreter starts a script (or -m): its folder (or the working folder) first
        # on the import path, where the guard's folder was, unless safe_path keeps it off.
        if not getattr(sys.flags, "safe_path", False):
            sys.path[0] = os.path.dirname(os.path.realpath(name)) if kind == "script" else os.getcwd()
        try:
            if kind == "script":
                _exec_as_main(name)
            else:
                runpy.run_module(name, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                sys.stderr.write(f"{exc.code}\n")
        except KeyboardInterrupt:
            # As the interpreter ends on one: its traceback, then killed by SIGINT (130).
            sys.excepthook(*sys.exc_info())
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # noqa: BLE001 - reported as the interpreter reports it
            sys.excepthook(*sys.exc_info())
    except BaseException:  # noqa: BLE001 - whatever happens, the child never goes on as a guard
        traceback.print_exc()
    raise ChildExit(code & 0xFF)


def await_exit(child, timeout: float | None) -> int:
    """``child.wait(timeout)``, woken by the exit itself through a pidfd where Linux and
    Python have one. Popen's and Forked's own waits poll, backing off to 50 ms apart, so a
    unit that takes a while to end (48 at once on 2 cores) was reaped up to 50 ms late."""
    if child.poll() is None and hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(child.pid)
        except OSError:  # reaped meanwhile, or no pidfd in this kernel: the wait below decides
            fd = None
        if fd is not None:
            try:
                exited = select.poll()
                exited.register(fd, select.POLLIN)
                if not exited.poll(None if timeout is None else max(0, int(timeout * 1000))):
                    raise subprocess.TimeoutExpired(getattr(child, "args", "unit"), timeout)
            finally:
                os.close(fd)
    return child.wait(timeout)


def _bounded(fn, timeout: float) -> None:
    """Run a store op that may block for ever (a frozen host), for at most ``timeout``."""
    def attempt():
        try:
            fn()
        except Exception:  # noqa: BLE001 - the store may be what is gone
            pass

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout)


def _killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _die_with_parent() -> None:
    """The unit gets SIGKILL if its guard is killed outright (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: guard.py CONFIG UNIT -- ARGV...\n")
        return 2
    config_path, index, command = argv[0], int(argv[1]), argv[3:]
    with open(config_path) as fh:
        config = json.load(fh)
    guard = Guard(config, index, command, os.path.dirname(os.path.abspath(config_path)))
    try:
        code = guard.run()
    except ChildExit as done:  # the forked unit ends here, as its own interpreter would
        return done.code
    guard.exit_now(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
