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

It runs with the Python that runs the ranks (it needs torch) and nothing else: this file
is the entry point and owns the loop (the store, heartbeats, signals, the records). It imports
its siblings, which are copied with it into each run's folder (run_vocab.GUARD_SOURCES), so
that they lie in the script's own folder, first on its import path: the decisions
(guard_policy.py), the unit's process (guard_child.py) and the run's vocabulary (run_vocab.py).
Over 500 lines: the loop is one class, whose store, child, watchdog and records share its state.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from typing import NoReturn

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_child
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_policy as policy
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
except ImportError:  # on a node: run as a script from the run's folder, where its modules lie beside it
    import guard_child
    import guard_policy as policy
    import run_vocab as vocab

# The node's secret environment for mpirun's ranks (the launch role's secret_env_file.yml):
# no rank of the run starts once a unit of it has ended, so the first guard to end removes
# it, also on a node the controller lost and could not clean.
SECRET_FILES = (vocab.SECRET_ENV,)
# How long a guard that is done waits for its unit's last lines (a traceback) to reach the log.
OUTPUT_DRAIN_S = 2.0
# How often the store's host looks for a stop file (torchfleet stop writes it on the master
# first): one stat, in one guard of the run, where the loop's own look waits a whole poll.
STOP_WATCH_S = 0.05


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
            guard_child.die_with_parent()

        target = policy.preload_target(self.argv, sys.executable)
        if target is not None and guard_child.import_torch():
            self.child = guard_child.Forked(target, own_group)
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
            guard_child.await_exit(self.child, self.poll)
        except subprocess.TimeoutExpired:
            pass
        self.wake.set()

    def stop_child(self) -> int:
        """SIGTERM to the unit's process group, SIGKILL after the grace period. The record
        says when the first of each was sent (``sigterm_at``, ``sigkill_at``)."""
        if self.child.poll() is None:
            self.state.setdefault("sigterm_at", time.time())
            guard_child.killpg(self.child.pid, signal.SIGTERM)
            try:
                guard_child.await_exit(self.child, self.grace)
            except subprocess.TimeoutExpired:
                self.state["sigkill_at"] = time.time()
                guard_child.killpg(self.child.pid, signal.SIGKILL)
                guard_child.await_exit(self.child, None)
        else:
            guard_child.killpg(self.child.pid, signal.SIGKILL)  # what the unit left in its group
        return policy.exit_code(self.child.returncode)

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
                guard_child.killpg(self.child.pid, signal.SIGTERM)
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
        else:
            threading.Thread(target=self._watch_stop, daemon=True).start()
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
                        self.connect_timeout = policy.next_connect_timeout(self.connect_timeout, self.node_timeout)
                        raise ConnectionError(getattr(self, "store_error", "no store yet"))
                self.store.add(vocab.heartbeat_key(self.index), 1)
                abort = abort or self.read_abort()
                # A stop first: on the host, the checks below take a store op per unit.
                if abort is None and self._stop_requested():
                    abort = self.set_abort(self._stop_requested())
                if self.is_host:
                    abort = abort or self._host_checks(seen, counters, exits)
                if abort is None and code is not None and code != 0 and self._peer_wait_over():
                    failed = policy.abort_for_exit(self.unit, policy.exit_code(code))
                    abort = self.set_abort(dict(failed, index=self.index))
                if abort is None and self.signalled:
                    abort = self.set_abort({"kind": vocab.AbortKind.STOPPED.value, "host": self.unit["host"],
                                            "unit": self.unit["name"],
                                            "reason": f"{policy.who(self.unit)} got signal {self.signalled}"})
                if abort is None and code is None:
                    found = policy.stalled(self.unit, self.progressed(), self.stall_timeout, self.has_progressed,
                                           self.start_timeout)
                    if found:
                        abort = self.set_abort(dict(found, index=self.index))
                if abort is None and self.unit.get("service") and self.store.check([vocab.DONE]):
                    return self.finish(policy.exit_code(self.stop_child()) if self.child.poll() is None else 0,
                                       vocab.UnitState.STOPPED.value, "the job's other units finished")
                self.last_ok = time.monotonic()
            except Exception as exc:  # noqa: BLE001 - any store failure counts as no contact
                if self.is_host or not isinstance(exc, (RuntimeError, ConnectionError, OSError)):
                    raise
                # Without the store, what this node can tell on its own still stops its unit.
                local = self._stop_requested() or (
                    dict(policy.abort_for_exit(self.unit, policy.exit_code(code)), index=self.index)
                    if code else None)
                if local is None and self.signalled:
                    local = {"kind": vocab.AbortKind.STOPPED.value, "host": self.unit["host"],
                             "unit": self.unit["name"],
                             "reason": f"{policy.who(self.unit)} got signal {self.signalled}"}
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
            self._say(f"[torchfleet guard] {policy.who(self.unit)} lost a peer; "
                      "waiting for the peers' guards to name the cause")
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
        return policy.peer_wait_over(now - wait["since"], wait["moved"], others, self.node_timeout, self.poll)

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
                final = self.stop_child() if code is None else policy.exit_code(code)
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

    def _watch_stop(self) -> None:
        """The host's: wake the loop as soon as a stop file appears, and the loop posts the
        abort that every guard awaits."""
        path = os.path.join(self.run_dir, vocab.STOP)
        while not os.path.exists(path):
            time.sleep(STOP_WATCH_S)
        self.wake.set()

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
        lost = policy.lost_units(self.units, seen, set(exits) | {self.index}, now, self.node_timeout, self.started,
                                 self.start_timeout)
        self._write_job(vocab.RunState.RUNNING.value, None, exits, seen)
        if lost:
            return self.set_abort(policy.abort_for_lost(self.units, lost, self.node_timeout))
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
        final = self.stop_child() if code is None else policy.exit_code(code)
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
            self._say(f"[torchfleet guard] stopped {policy.who(self.unit)}: {why}")
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
    except guard_child.ChildExit as done:  # the forked unit ends here, as its own interpreter would
        return done.code
    guard.exit_now(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
