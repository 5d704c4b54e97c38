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
- the host writes the run's state to ``job.json``, which a controller reads to attach;
- with ``launch_max_restarts``, an attempt that ends on a failure is followed by another with
  the same run id: the host decides which nodes take part (those whose guards still beat),
  publishes the plan, and each guard starts its unit again with its new numbers. A guard that
  loses the host moves, in node order, to a store that the next node's first guard hosts.

It runs with the Python that runs the ranks (it needs torch) and nothing else: this file
is the entry point and owns the loop (the store, heartbeats, signals, the records). It imports
its siblings, which are copied with it into each run's folder (run_vocab.GUARD_SOURCES), so
that they lie in the script's own folder, first on its import path: the decisions
(guard_policy.py), the unit's process (guard_child.py), the checkpoint's copy to a new
attempt's nodes (guard_sync.py) and the run's vocabulary (run_vocab.py).
Over 500 lines: the loop is one class, whose store, child, watchdog, records and attempts share
its state.
"""

from __future__ import annotations

import collections
import fcntl
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
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_sync
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
except ImportError:  # on a node: run as a script from the run's folder, where its modules lie beside it
    import guard_child
    import guard_policy as policy
    import guard_sync
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
# How often a unit's guard tries its listen (the spec's ``listen``) until it answers, as the
# controller's listen_wait does.
LISTEN_POLL_S = 0.05


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
        self.listen_timeout = float(config.get("listen_timeout") or 0)
        self.store = None
        self.lock_fd: int | None = None
        self.connect_timeout = 1.0
        self.child: subprocess.Popen | None = None
        self.output: threading.Thread | None = None
        self.started = time.monotonic()
        self.last_progress = self.started
        self.heartbeat_file = self.unit.get("heartbeat")
        # The units of earlier phases whose listen this unit's first start waits for, and
        # where this unit's own listen stands: None (none), "waiting", "answered", "told", or
        # "late" (not within listen_timeout).
        self.after = [int(i) for i in self.unit.get("after") or []]
        self.after_keys = [vocab.listening_key(i) for i in self.after]
        self.listen_state = "waiting" if self.unit.get("listen") else None
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
        # Restarts: the attempt this guard is in (1 is the launch's), the units that take part
        # in it, and the run's table of attempts (the host's; every other guard's copy is the
        # one the last plan carried).
        self.max_restarts = int(config.get("max_restarts") or 0)
        self.min_nodes = int(config.get("min_nodes") or 0)
        self.backoff = float(config.get("restart_backoff") or 0)
        self.rejoin_timeout = float(config.get("rejoin_timeout") or 0)
        self.candidates = config.get("store_candidates") or [dict(config.get("store") or {}, unit=config["store_unit"])]
        self.gen = 0  # which of the candidates hosts the store now
        self.attempt = 1
        self.members = set(range(len(self.units)))
        self.attempts: list[dict] = []
        self.plan: dict | None = None
        self.base_argv = list(argv)
        self.attempt_started = self.started
        # Which thread runs the loop: after a master's loss, the watchdog may take it over
        # from a main thread held in an op on the frozen store, which then must never act.
        self.turn = threading.Lock()
        self.owner: int | None = None
        self.moving = False
        # Set once this guard itself stood still (its node paused) for a node timeout: the
        # store's silence is then its own, and it never takes a lost master's place.
        self.stood_still = False
        # The host's: when its loop last went round, and how long it last stood still and
        # when that ended (see _host_stood_still).
        self.loop_mark = time.monotonic()
        self.still_gap, self.still_end = 0.0, 0.0
        if self.max_restarts:
            # Every guard keeps the table: the one that takes a lost master's place goes on with it.
            self.state["attempt"] = 1
            self.attempts.append(self._attempt_entry(policy.plan_attempt(config, [n["host"] for n in config["nodes"]], 1)))

    def _hold_lock(self) -> None:
        """Hold the unit's lock file until the guard ends, however it ends (run_vocab.guard_lock),
        before the first record: a reader that takes the lock knows the record is final or
        stale."""
        self.lock_fd = os.open(os.path.join(self.run_dir, vocab.guard_lock(self.index)),
                               os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)

    # -- the child --

    @property
    def waiting(self) -> bool:
        """Whether the unit still waits for the units it starts after: forked and held, or
        (a unit that is not forked) a NotStarted stand-in, which is held for good."""
        return getattr(self.child, "held", False)

    def start_child(self, env: dict | None = None, hold: bool = False) -> None:
        """Start the unit: ``self.argv``, with ``env`` over the guard's own environment. With
        ``hold``, a unit that is forked is forked now, while the guard has no other thread,
        and runs once a later call releases it: a fork once the guard's store threads run
        could copy a lock that one of them holds into the unit, whose rendezvous would then
        wait on it for ever. A unit that is not forked starts with that later call."""
        if self.waiting and not hold and isinstance(self.child, guard_child.Forked):
            self.child.release()
            self._running()
            return

        def own_group():
            os.setpgid(0, 0)
            guard_child.die_with_parent()

        def forked_setup():
            own_group()
            if self.lock_fd is not None:
                os.close(self.lock_fd)  # the guard's alone: the unit's life is not the guard's
            os.environ.update(env or {})

        target = policy.preload_target(self.argv, sys.executable)
        if target is not None and guard_child.import_torch():
            self.child = guard_child.Forked(target, forked_setup, held=hold)
        elif hold:
            self.child = guard_child.NotStarted()
        else:
            self.child = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, preexec_fn=own_group,
                                          env=dict(os.environ, **env) if env else None)
        if not hold:
            self._running()

    def _running(self) -> None:
        """The unit runs: its output passed on, its record saying so."""
        self.last_progress, self.has_progressed, self.peer_wait = time.monotonic(), False, None
        self.recent.clear()
        self.output = threading.Thread(target=self._pass_output, args=(self.child, self.attempt), daemon=True)
        self.output.start()
        self.state.update(state=vocab.UnitState.RUNNING.value, pid=self.child.pid)
        self.state.pop("waiting_for", None)
        self._write_state()

    def _pass_output(self, child, attempt: int) -> None:
        outs = [sys.stdout.buffer]
        if self.unit.get("log"):
            outs.append(open(self.unit["log"], "ab"))
        if attempt > 1:
            outs.append(open(os.path.join(self.run_dir, vocab.attempt_log(self._log_name(), attempt)), "ab"))
        for line in iter(child.stdout.readline, b""):
            self.last_progress, self.has_progressed = time.monotonic(), True
            self.recent.append(line.decode(errors="replace"))
            for out in outs:
                out.write(line)
                out.flush()
        # The pipe closes a moment before the process can be reaped; a wake in between finds
        # it still running and the loop sleeps a whole poll. Bounded: a unit may close its
        # output and go on.
        try:
            guard_child.await_exit(child, self.poll)
        except subprocess.TimeoutExpired:
            pass
        for out in outs[1:]:
            out.close()
        self.wake.set()

    def stop_child(self) -> int:
        """SIGTERM to the unit's process group, SIGKILL after the grace period. The record
        says when the first of each was sent (``sigterm_at``, ``sigkill_at``). A unit that
        never started ends as a stopped one would (143), and its record says so."""
        if self.waiting:
            if self.child.pid is not None:
                # Held since the guard's start, it ran nothing of the unit: nothing to grant.
                guard_child.killpg(self.child.pid, signal.SIGKILL)
                guard_child.await_exit(self.child, None)
            self.state["not_started"] = True
            return policy.exit_code(-signal.SIGTERM)
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

        where = self.candidates[self.gen]
        host, port = where["host"], int(where["port"])
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
                if self.gen:
                    # A moved store: the run's own, not another's on the same port.
                    self.store.wait([vocab.RUN_KEY], timedelta(seconds=timeout))
                    if self.store.get(vocab.RUN_KEY).decode() != self.config["run_id"]:
                        raise RuntimeError(f"the store on {host}:{port} is another run's")
        except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError subclasses, by version
            self.store_error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.store = None
            return False
        if self.is_host:
            self.store.set(vocab.RUN_KEY, self.config["run_id"])
        # The store answered; the watchdog's allowance runs from here, not from the start.
        self.last_ok = time.monotonic()
        threading.Thread(target=self._await_abort, args=(TCPStore, host, port, self.gen), daemon=True).start()
        if self.waiting:
            threading.Thread(target=self._await_after, args=(TCPStore, host, port), daemon=True).start()
        return True

    def _await_abort(self, store_class, host: str, port: int, gen: int) -> None:
        """Wake the loop the moment any guard posts the attempt's abort. A connection of its
        own: a client is one socket, and this wait blocks it. Ends with its store's generation."""
        try:
            store = store_class(host, port, is_master=False, timeout=timedelta(seconds=self.start_timeout))
        except Exception:  # noqa: BLE001 - the loop's polls still see the abort
            return
        while self.gen == gen:
            attempt = self.attempt
            try:
                # Long: each timeout prints a c10d warning into the unit's log, and an attempt
                # only ends on its abort, which ends the wait.
                store.wait([vocab.abort_key(attempt)], timedelta(days=1))
            except Exception:  # noqa: BLE001 - the wait's timeout, or the store gone: the polls decide
                time.sleep(self.poll)
                continue
            if self.gen != gen or self.attempt != attempt:
                continue
            # Every abort stops every unit, so the stop starts here, before the loop has read
            # why (three store ops behind 47 other guards on a busy host); the loop still
            # records the reason and escalates to SIGKILL after the grace period.
            self.state.setdefault("abort_seen_at", time.time())
            if self.child is not None and not self.waiting and self.child.poll() is None:
                self.state.setdefault("sigterm_at", time.time())
                guard_child.killpg(self.child.pid, signal.SIGTERM)
            self.wake.set()
            while self.gen == gen and self.attempt == attempt:
                time.sleep(self.poll)

    def read_abort(self) -> dict | None:
        if self.store.check([vocab.abort_key(self.attempt)]):
            return json.loads(self.store.get(vocab.abort_key(self.attempt)))
        return None

    def set_abort(self, abort: dict, attempt: int | None = None) -> dict:
        """The first abort of an attempt wins; every guard reports that one."""
        value = self.store.compare_set(vocab.abort_key(attempt or self.attempt), "", json.dumps(abort))
        return json.loads(value)

    # -- the loop --

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        self._hold_lock()
        if self.after:
            # The loop releases it once the store says every unit of ``after`` listens: this
            # guard meanwhile connects and beats, as the master starts.
            self.start_child(hold=True)
            self.state["waiting_for"] = [self.units[i]["name"] for i in self.after]
            self._write_state()
        else:
            self.start_child()
        if self.listen_state:
            threading.Thread(target=self._await_listen, args=(self.child,), daemon=True).start()
        self._watch()
        return self._loop()

    def _await_listen(self, child) -> None:
        """Note when the unit's listen first answers, or that it did not within the start's
        allowance from the unit's start; the loop tells the store, or aborts the run."""
        listen = self.unit["listen"]
        since = time.monotonic()
        while child.poll() is None:
            if guard_child.answers(listen["host"], int(listen["port"]), timeout=LISTEN_POLL_S * 10):
                self.listen_state = "answered"
                self.wake.set()
                return
            if self.waiting:
                since = time.monotonic()
            elif self.listen_timeout and time.monotonic() - since > self.listen_timeout:
                self.listen_state = "late"
                self.wake.set()
                return
            time.sleep(LISTEN_POLL_S)

    def _await_after(self, store_class, host: str, port: int) -> None:
        """Wake the loop the moment every unit this one starts after listens. A connection
        of its own, as _await_abort's."""
        try:
            store = store_class(host, port, is_master=False, timeout=timedelta(seconds=self.start_timeout))
            store.wait(self.after_keys, timedelta(days=1))
        except Exception:  # noqa: BLE001 - the loop's polls still see the keys
            return
        self.wake.set()

    def _watch(self) -> None:
        """The thread that watches for what the loop may miss: on the host a stop file, on
        any other guard a store that stopped answering (see _watchdog)."""
        target = self._watch_stop if self.is_host else self._watchdog
        threading.Thread(target=target, args=(self.gen,), daemon=True).start()

    def _mine(self) -> None:
        """Go on only in the thread that runs the loop: one that lost it (held in an op on a
        frozen store while the watchdog moved on) waits here for the guard's end."""
        if self.owner != threading.get_ident():
            threading.Event().wait()

    def _loop(self) -> int:
        self.owner = threading.get_ident()
        while True:
            code = self._attempt_loop()
            if code is not None:
                return code

    def _attempt_loop(self) -> int | None:
        """Supervise the current attempt until it ends: the guard's exit code, or None once
        this unit runs in (or waits for) a next attempt."""
        abort = None
        self.loop_mark = time.monotonic()
        seen: dict[int, float] = {}
        counters: dict[int, int] = {}
        exits: dict[int, int] = {}
        while True:
            self._mine()
            self.wake.clear()
            if self.is_host:
                abort = self._host_stood_still(seen) or abort
            self.loop_mark = time.monotonic()
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
                # A unit that finished without listening (a script with no rendezvous) lets
                # the later phase start too, as one that listens does.
                if self.listen_state == "answered" or (self.listen_state == "waiting" and code == 0):
                    self.store.set(vocab.listening_key(self.index), "1")
                    self.listen_state = "told"
                if abort is None and self.listen_state == "late":
                    abort = self.set_abort(dict(policy.not_listening(self.unit, self.listen_timeout), index=self.index))
                if abort is None and code is not None and code != 0 and self._peer_wait_over():
                    failed = policy.abort_for_exit(self.unit, policy.exit_code(code))
                    abort = self.set_abort(dict(failed, index=self.index))
                if abort is None and self.signalled:
                    abort = self.set_abort({"kind": vocab.AbortKind.STOPPED.value, "host": self.unit["host"],
                                            "unit": self.unit["name"],
                                            "reason": f"{policy.who(self.unit)} got signal {self.signalled}"})
                if abort is None and self.waiting and self.store.check(self.after_keys):
                    self.start_child()
                elif abort is None and code is None and not self.waiting:
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
            self._mine()
            if abort is not None:
                return self.end_attempt(abort, exits)
            if code == 0:
                # Exited cleanly: say so, and (the host) keep the store up for the others. The
                # record says it at once, so a launch phase waiting on this unit can go on.
                if "child_exit_code" not in self.state:
                    self.state["child_exit_code"] = 0
                    self._write_state()
                if self.store is not None:
                    try:
                        self._record_exit(0)
                    except Exception:  # noqa: BLE001 - tried again next round; a lost store is judged above
                        pass
                if not self.is_host and self._may_leave():
                    return self.finish(0, vocab.UnitState.EXITED.value)
                if vocab.job_state(self.units, exits, None, [], self.members) == vocab.RunState.SUCCEEDED:
                    return self.finish_host(exits, None)
            self.wake.wait(self.poll)

    # -- attempts (launch_max_restarts) --

    def _restarts_left(self) -> bool:
        return bool(self.max_restarts) and self.attempt <= self.max_restarts

    def _may_leave(self) -> bool:
        """Whether a guard whose unit exited cleanly may end. Where the attempt may still
        fail and be followed by another, in which this unit runs again, the guard stays and
        beats until the run is done (torchelastic's exit barrier); a store lost meanwhile is
        an attempt's end like any other."""
        if not self._restarts_left():
            return True
        try:
            if self.store is not None and self.store.check([vocab.DONE]):
                self.store.set(vocab.left_key(self.index), "1")
                return True
        except Exception:  # noqa: BLE001 - any store failure counts as no contact
            pass
        return False

    def end_attempt(self, abort: dict, exits: dict) -> int | None:
        """The attempt ended with ``abort``: the run's end (today's path, and the last
        attempt's), or, where another attempt may follow, the wait for the host's decision."""
        if not self._restarts_left() or not policy.restartable(abort) or self.index not in self.members:
            if self.max_restarts and self.is_host and abort["kind"] != vocab.AbortKind.MOVED:
                abort = dict(abort, final=policy.restart_refused(abort, self.attempts, self.max_restarts,
                                                                 self._nodes_of(self.members), self.min_nodes)
                             or "no restarts left")
                self._close_attempt(abort)
            return self.abort(abort, exits)
        final = self._stop_for_attempt(abort)
        if abort.get("store_lost"):
            return self.failover(abort)
        if self.is_host:
            self._record_exit(final)
            return self.host_decide(abort, exits)
        if self.store is not None:
            _bounded(lambda: self._record_exit(final), 2 * self.poll + 1)
        return self.await_next()

    def _stop_for_attempt(self, abort: dict) -> int:
        """Stop the unit for the attempt's end, and keep what its record says of it."""
        self.state.setdefault("abort_seen_at", time.time())
        code = self.child.poll()
        final = self.stop_child() if code is None else policy.exit_code(code)
        own = abort.get("index") == self.index and abort["kind"] == vocab.AbortKind.RANK_FAILED
        entry = {"attempt": self.attempt, "ranks": self._ranks(), "exit_code": final,
                 "state": (vocab.UnitState.EXITED if own else vocab.UnitState.STOPPED).value,
                 "why": None if own else abort["reason"]}
        for key in ("abort_seen_at", "sigterm_at", "sigkill_at", "child_exit_code", "not_started"):
            if key in self.state:
                entry[key] = self.state.pop(key)
        self.state.setdefault("attempts", []).append(entry)
        self.state.update(state=vocab.UnitState.RESTARTING.value, exit_code=final, abort=abort)
        if not own:
            self._say(f"[torchfleet guard] stopped {policy.who(self.unit)} (attempt {self.attempt}): {abort['reason']}")
        self._write_state()
        return final

    def host_decide(self, abort: dict, exits: dict, failover: bool = False) -> int | None:
        """The host's: once every unit of the ended attempt stopped, which nodes still answer,
        and then the next attempt on them, or the run's end."""
        if not failover:
            self._await_others(exits)
        self._close_attempt(abort)
        self._write_job(vocab.RunState.RUNNING.value, None, exits, {}, restarting=True)
        hosts = self._answering(abort, failover)
        why = policy.restart_refused(abort, self.attempts, self.max_restarts, hosts, self.min_nodes)
        if why is None and self.store.check([vocab.abort_key(self.attempt + 1)]):
            why = policy.restart_refused(json.loads(self.store.get(vocab.abort_key(self.attempt + 1))),
                                         self.attempts, self.max_restarts, hosts, self.min_nodes)
        if why is None and self._stop_requested():
            why = policy.restart_refused(self._stop_requested(), self.attempts, self.max_restarts, hosts,
                                         self.min_nodes)
        if why is not None:
            final = dict(abort, final=why)
            self.store.set(vocab.next_key(self.attempt), json.dumps({"final": final, "attempts": self.attempts}))
            self._write_job(vocab.job_state(self.units, exits, final, [], self.members), final, exits, {})
            self._await_leaving()
            return self._finish_attempts(final)
        plan = policy.plan_attempt(self.config, hosts, self.attempt + 1)
        self.attempts.append(self._attempt_entry(plan))
        self.store.set(vocab.next_key(self.attempt), json.dumps({"plan": plan, "attempts": self.attempts}))
        return self.begin_attempt(plan)

    def await_next(self) -> int | None:
        """A guard other than the host's, between attempts: beat, and wait for the host's
        decision. A stop or signal meanwhile is posted as the next attempt's abort."""
        attempt = self.attempt
        while True:
            self._mine()
            self.wake.clear()
            try:
                self.store.add(vocab.heartbeat_key(self.index), 1)
                if self.store.check([vocab.next_key(attempt)]):
                    decision = json.loads(self.store.get(vocab.next_key(attempt)))
                    break
                if self.index not in self.members and self.store.check([vocab.DONE]):
                    self.store.set(vocab.left_key(self.index), "1")
                    return self.finish(self.state.get("exit_code", 0), vocab.UnitState.LEFT_OUT.value,
                                       "the run ended in an attempt without this node")
                stop = self._stop_requested() or (
                    {"kind": vocab.AbortKind.STOPPED.value, "host": self.unit["host"], "unit": self.unit["name"],
                     "reason": f"{policy.who(self.unit)} got signal {self.signalled}"} if self.signalled else None)
                if stop:
                    self.set_abort(stop, attempt + 1)
                self.last_ok = time.monotonic()
            except Exception:  # noqa: BLE001 - any store failure counts as no contact
                if time.monotonic() - self.last_ok > self.node_timeout:
                    if self.index in self.members and self._restarts_left():
                        return self.failover(self._store_lost())
                    return self.finish(self.state.get("exit_code", 0), vocab.UnitState.LEFT_OUT.value,
                                       self._store_lost()["reason"])
            self.wake.wait(self.poll)
        self._mine()
        self.attempts = decision["attempts"]
        if "final" in decision:
            _bounded(lambda: self.store.set(vocab.left_key(self.index), "1"), 2 * self.poll + 1)
            return self._finish_attempts(decision["final"])
        return self.begin_attempt(decision["plan"])

    def begin_attempt(self, plan: dict) -> int | None:
        """Start this unit in ``plan``'s attempt, or wait for a later one where it has no part."""
        self.attempt, self.plan = plan["attempt"], plan
        self.members = {int(i) for i in plan["units"]}
        self.state["attempt"] = self.attempt
        if self.index not in self.members:
            self._say(f"[torchfleet guard] attempt {self.attempt} runs without {self.unit['host']}; "
                      f"{policy.who(self.unit)} waits for the next one")
            return self.await_next()
        env, self.argv = policy.unit_attempt(self.unit, self.index, plan, self.base_argv)
        self._sync_checkpoints(plan)
        ranks = plan["units"][str(self.index)]["ranks"]
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}" if ranks else "no rank"
        self._say(f"{vocab.ATTEMPT_BANNER}{self.attempt} of {self.max_restarts + 1}: {label} of {plan['world_size']} "
                  f"on {self.unit['host']} (MASTER_ADDR={plan['master_addr']}, "
                  f"TORCHFLEET_RESTART_COUNT={self.attempt - 1})")
        self.attempt_started = time.monotonic()
        self.state.update(state=vocab.UnitState.RUNNING.value, attempt_ranks=ranks)
        self.state.pop("exit_code", None)
        self.state.pop("abort", None)
        self.start_child(env)
        return None

    def _sync_checkpoints(self, plan: dict) -> None:
        """Bring the newest checkpoint to every node of the attempt before its ranks start
        (guard_sync): the node's first unit of the attempt copies, the others wait for it. Not
        where the nodes share the folder (launch_checkpoint_shared)."""
        folder = os.environ.get("TORCHFLEET_CHECKPOINT_DIR")
        if not folder or self.config.get("checkpoint_shared"):
            return
        host = self.unit["host"]
        first = min(i for i in self.members if self.units[i]["host"] == host)
        ready = vocab.synced_key(self.attempt, host)
        if first != self.index:
            while not self.store.check([ready]):
                self.store.add(vocab.heartbeat_key(self.index), 1)
                time.sleep(self.poll)
            return
        try:
            done = guard_sync.sync(self.store, self.attempt, host, plan["nodes"], folder,
                                   max(30.0, 2 * self.node_timeout), say=self._say)
            self.state.setdefault("checkpoint_sync", []).append(dict(done, attempt=self.attempt))
        except Exception as exc:  # noqa: BLE001 - the ranks still start: the workload may bring its own
            self._say(f"[torchfleet guard] checkpoint sync of attempt {self.attempt} failed: {exc}")
        self.store.set(ready, "1")

    def failover(self, cause: dict) -> int | None:
        """The store's host is gone: move, in node order, to the next node's first guard's
        store (hosting it where that guard is this one), and go on from there."""
        with self.turn:
            if self.moving and self.owner != threading.get_ident():
                threading.Event().wait()
            self.moving, self.owner = True, threading.get_ident()
        if self.child.poll() is None:
            self._stop_for_attempt(cause)
        lost = self.candidates[self.gen]["node"]
        if self.stood_still:
            self.moving = False
            return self._rejoin_or_leave(cause)
        self.store = None
        for gen in range(self.gen + 1, len(self.candidates)):
            where = self.candidates[gen]
            if where["node"] == lost:
                continue
            self.gen, self.is_host = gen, where["unit"] == self.index
            if self.connect(timeout=self._move_on_s()):
                break
        else:
            self.moving = False
            return self._finish_attempts(dict(cause, final=f"no node took over from the lost master {lost}"))
        self.moving = False
        self._say(f"[torchfleet guard] the master {lost} was lost; the run's store moved to "
                  f"{self.candidates[self.gen]['node']}")
        self._watch()
        if self.is_host:
            self.members = {i for i in self.members if self.units[i]["host"] != lost}
            return self.host_decide(cause, {}, failover=True)
        return self.await_next()

    def _rejoin_or_leave(self, cause: dict) -> int | None:
        """This guard stood still, and the store it knew is silent: where the run moved on
        without it, wait there for a later attempt; where it ended, leave."""
        moved_to = self._successor()
        if moved_to is None:
            self.members.discard(self.index)
            return self.finish(self.state.get("exit_code", 0), vocab.UnitState.LEFT_OUT.value,
                               f"{self.unit['host']} stood still, and the run's store is gone: the run went on "
                               f"or ended without it ({cause['reason']})", cause)
        self.gen = next(g for g, c in enumerate(self.candidates) if c["node"] == moved_to)
        self.is_host, self.store = False, None
        if not self.connect(timeout=self.node_timeout):
            self.members.discard(self.index)
            return self.finish(self.state.get("exit_code", 0), vocab.UnitState.LEFT_OUT.value, cause["reason"], cause)
        self.members.discard(self.index)
        self._watch()
        return self.await_next()

    def _taken_over(self) -> str | None:
        """Where the run went on once this host lost every other guard at once: the store it
        finds on a next node, or, where the run may already have ended there, the node that
        the others, having lost this one, make their master: the next in node order, when
        enough nodes are left for launch_min_nodes. Its job.json then speaks for the run."""
        # Asked first: the look for a successor may take seconds.
        back = self._back_from_standing_still()
        found = self._successor()
        if found:
            return found
        # Inferred only where this host stood still for as long as the others take to move
        # on: a host merely starved for CPU, or others that are really all gone, are not that.
        if not back:
            return None
        others = [c for c in self.candidates[self.gen + 1:] if c["node"] != self.unit["host"]]
        if others and len(others) >= self.min_nodes:
            return others[0]["node"]
        return None

    def _move_on_s(self) -> float:
        """How long the guards take, at most, to lose a silent store (a node timeout) and to
        find the next one (as long again, and a margin for a starved node)."""
        return 2 * self.node_timeout + 5

    def _back_from_standing_still(self) -> bool:
        """Whether this host has just come back from standing still for as long as the other
        guards take to lose its store and move on: the units it now finds lost were lost to
        its own absence. Just: within the node timeout that their fresh allowance takes to run
        out (with as much again for a starved host), not after a stand-still long past."""
        return (self.still_gap >= self._move_on_s()
                and time.monotonic() - self.still_end <= self._move_on_s())

    def _successor(self) -> str | None:
        """The node whose store the run moved to while this host stood still, if any (the next
        two in node order: the others go to the first that answers)."""
        from torch.distributed import TCPStore

        for where in self.candidates[self.gen + 1:self.gen + 3]:
            run = _within(lambda: TCPStore(where["host"], int(where["port"]), is_master=False,
                                           timeout=timedelta(seconds=2)).get(vocab.RUN_KEY), 3.0)
            if run is not None and run.decode() == self.config["run_id"]:
                return where["node"]
        return None

    def _moved(self, node: str) -> dict:
        return {"kind": vocab.AbortKind.MOVED.value, "host": self.unit["host"], "unit": None, "moved_to": node,
                "reason": f"{self.unit['host']} stood still as the master and was lost; the run went on with "
                          f"{node} as its master"}

    def _answering(self, abort: dict, failover: bool) -> list[str]:
        """The nodes whose every unit's guard beats: watched for the backoff (and at least
        two polls), then, while a node of the ended attempt is missing, up to the rejoin
        timeout for one it lost, a node timeout for any other (after a failover, as long as
        a guard takes to find the new store)."""
        started = time.monotonic()
        least = max(self.backoff, 2 * self.poll + 1)
        # A node the ended attempt lost gets the rejoin timeout to beat again; any other (slow
        # to say it is there) as long as it would take to be judged lost.
        lost = set(abort.get("hosts") or [abort.get("host")]) if abort.get("kind") == vocab.AbortKind.NODE_LOST else set()
        most = self._move_on_s() if failover else least + self.node_timeout
        first: dict[int, int] = {}
        moved = {self.index}
        wanted = self._nodes_of(self.members)
        while True:
            for i in range(len(self.units)):
                if i in moved or self.units[i].get("service"):
                    continue
                count = self.store.add(vocab.heartbeat_key(i), 0)
                if i not in first:
                    first[i] = count
                elif count != first[i]:
                    moved.add(i)
            hosts = [n["host"] for n in self.config["nodes"]
                     if all(i in moved for i in policy.node_units(self.units, n["host"]))]
            waited = time.monotonic() - started
            missing = set(wanted) - set(hosts)
            if waited >= least and (not missing or (missing <= lost and waited >= self.rejoin_timeout)
                                    or waited >= most):
                return hosts
            time.sleep(self.poll)

    def _await_leaving(self) -> None:
        """The host keeps the store up until the guards that beat have read the run's end: a
        guard gone silent (ended, lost) is not waited for, and none longer than a node timeout."""
        started = time.monotonic()
        others = [i for i in range(len(self.units)) if i != self.index and not self.units[i].get("service")]
        counters: dict[int, int] = {}
        beat: dict[int, float] = {}
        while time.monotonic() - started < self.node_timeout:
            now = time.monotonic()
            waiting = []
            for i in others:
                if self.store.check([vocab.left_key(i)]):
                    continue
                count = self.store.add(vocab.heartbeat_key(i), 0)
                if count != counters.get(i):
                    counters[i], beat[i] = count, now
                if now - beat.get(i, started) < 2 * self.poll + 1:
                    waiting.append(i)
            if not waiting:
                return
            time.sleep(self.poll)

    def _finish_attempts(self, final: dict) -> int:
        """The run ended between attempts: this unit's record says how, with the run's abort."""
        if self.index not in self.members:
            return self.finish(self.state.get("exit_code", 0), vocab.UnitState.LEFT_OUT.value, final["reason"], final)
        last = (self.state.get("attempts") or [{}])[-1]
        state = last.get("state") or vocab.UnitState.STOPPED.value
        return self.finish(self.state.get("exit_code", 0), state, last.get("why"), final)

    def _attempt_entry(self, plan: dict) -> dict:
        return {"attempt": plan["attempt"], "started_at": _now(), "ended_at": None, "seconds": None,
                "state": vocab.RunState.RUNNING.value, "cause": None, "nodes": plan["nodes"],
                "master": plan["master"], "world_size": plan["world_size"], "ranks": plan["ranks"],
                "_t": time.time()}

    def _close_attempt(self, abort: dict | None, state: str | None = None) -> None:
        """The attempt's row in the run's table, once it ended."""
        if not self.attempts or self.attempts[-1].get("ended_at"):
            return
        row = self.attempts[-1]
        row.update(ended_at=_now(), cause={k: v for k, v in abort.items() if k != "final"} if abort else None,
                   state=state or vocab.job_state(self.units, {}, abort, [], self.members))
        if "_t" in row:
            row["seconds"] = round(time.time() - row.pop("_t"), 1)

    def _nodes_of(self, members: set) -> list[str]:
        return [n["host"] for n in self.config["nodes"] if any(self.units[i]["host"] == n["host"] for i in members)]

    def _ranks(self) -> list[int]:
        if self.plan:
            return self.plan["units"][str(self.index)]["ranks"]
        return list(self.unit.get("ranks") or [])

    def _log_name(self) -> str:
        if self.unit.get("log"):
            return os.path.basename(self.unit["log"])
        ranks = self.unit.get("ranks") or []
        return vocab.unit_log(self.unit["role"], ranks[0] if ranks else None)

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
        for i in sorted(self.members):
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
        store = self.candidates[self.gen]
        return {"kind": vocab.AbortKind.NODE_LOST.value, "host": store["node"], "hosts": [store["node"]], "unit": None,
                "store_lost": True,
                "reason": f"lost the supervision store on {store['node']} ({store['host']}:{store['port']}) for "
                          f"{int(time.monotonic() - self.last_ok)}s (launch_node_timeout={self.node_timeout:g}): "
                          "the master node stopped answering"}

    def _store_answers(self) -> bool:
        """Whether the store answers a new connection at once: a guard that stood still
        itself (its node paused) finds the store silent for that long, yet there."""
        from torch.distributed import TCPStore

        where = self.candidates[self.gen]
        return _within(lambda: TCPStore(where["host"], int(where["port"]), is_master=False,
                                        timeout=timedelta(seconds=2)).add(vocab.heartbeat_key(self.index), 0),
                       3.0) is not None

    def _watchdog(self, gen: int) -> None:
        while self.gen == gen:
            slept = time.monotonic()
            time.sleep(self.poll)
            if time.monotonic() - slept > self.node_timeout:
                self.stood_still = True
            silent = time.monotonic() - self.last_ok
            # A loop held in a store op (a frozen master) still obeys a stop on its own node,
            # before the store counts as lost.
            requested = self._stop_requested() if silent > 2 * self.poll + 1 else None
            if requested or silent > self._store_limit() + 2 * self.poll:
                if self.gen != gen or self.moving:
                    return
                if not requested and self.index in self.members and self._restarts_left():
                    if self._store_answers():
                        self.last_ok = time.monotonic()
                        continue
                    self._take_over(self._store_lost())
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

    def _take_over(self, lost: dict) -> NoReturn:
        """From the watchdog: the loop is held in an op on the lost store, so this thread
        moves to the next store and runs the guard from there on."""
        try:
            code = self.failover(lost)
            if code is None:
                code = self._loop()
        except guard_child.ChildExit as done:  # a unit forked from this thread ended
            import atexit

            atexit._run_exitfuncs()  # noqa: SLF001 - as the interpreter ends, without the main thread
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(done.code)
        self.exit_now(code)

    def _watch_stop(self, gen: int = 0) -> None:
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
        key = vocab.exit_key(self.index, self.attempt)
        if not self.store.check([key]):
            self.store.set(key, str(code))

    def _read_exits(self, exits: dict) -> None:
        """Into ``exits``, every unit's exit code in this attempt that the store holds and
        ``exits`` lacks."""
        for i in sorted(self.members):
            if i not in exits and self.store.check([vocab.exit_key(i, self.attempt)]):
                exits[i] = int(self.store.get(vocab.exit_key(i, self.attempt)))

    def _host_stood_still(self, seen: dict) -> dict | None:
        """Whether the host itself stood still (paused, starved) since the loop last went
        round: the others' silence may then be its own, so they get a fresh allowance, and
        where the run moved on to another master meanwhile, the abort that says so. Asked
        again before the host judges the others, since it may stand still between the two."""
        gap = time.monotonic() - self.loop_mark
        if gap <= self.node_timeout:
            return None
        moved_to = self._successor() if self._restarts_left() else None
        # From after the look for a successor, which may take seconds.
        now = time.monotonic()
        for i in seen:
            seen[i] = now
        self.still_gap, self.still_end, self.loop_mark = gap, now, now
        return self.set_abort(self._moved(moved_to)) if moved_to else None

    def _host_checks(self, seen: dict, counters: dict, exits: dict) -> dict | None:
        stood = self._host_stood_still(seen)
        if stood:
            return stood
        now = time.monotonic()
        self._read_exits(exits)
        for i in sorted(self.members):
            count = self.store.add(vocab.heartbeat_key(i), 0)
            if count and count != counters.get(i):
                counters[i], seen[i] = count, now
        if vocab.job_state(self.units, exits, None, [], self.members) == vocab.RunState.SUCCEEDED:
            self.store.set(vocab.DONE, "1")
        others = set(range(len(self.units))) - self.members
        lost = policy.lost_units(self.units, seen, set(exits) | {self.index} | others, now, self.node_timeout,
                                 self.attempt_started, self.start_timeout)
        self._write_job(vocab.RunState.RUNNING.value, None, exits, seen)
        all_silent = set(lost) >= self.members - set(exits) - {self.index}
        if lost and self._restarts_left() and (all_silent or self._back_from_standing_still()):
            # Every other guard silent at once, or this host stood still for as long as the
            # others take to move on (a heartbeat queued before the pause may still arrive
            # from one of them): more likely this host was the one cut off or paused, and the
            # others went on with the next node as their master (see _taken_over).
            moved_to = self._taken_over()
            if moved_to:
                return self.set_abort(self._moved(moved_to))
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
        self._write_job(vocab.job_state(self.units, exits, abort, [], self.members), abort, exits, {})
        self._await_others(exits)
        self._write_job(vocab.job_state(self.units, exits, abort, [], self.members), abort, exits, {})
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
            for i in sorted(self.members):
                if i in exits:
                    continue
                count = self.store.add(vocab.heartbeat_key(i), 0)
                if count != counters.get(i):
                    counters[i], moved[i] = count, now
            waiting = [i for i in sorted(self.members) if i not in exits
                       and now - moved.get(i, started) < 2 * self.poll + 1 + (self.grace if i in moved else 0)]
            if not waiting:
                return
            time.sleep(self.poll)

    def finish_host(self, exits: dict, abort: dict | None) -> int:
        # Services (sshd) stop once they see `done`; give them a moment to say so.
        deadline = time.monotonic() + self.grace + 2 * self.poll
        while len(exits) < len(self.members) and time.monotonic() < deadline:
            self._read_exits(exits)
            time.sleep(self.poll)
        self._close_attempt(None, vocab.RunState.SUCCEEDED.value)
        self._write_job(vocab.job_state(self.units, exits, abort, [], self.members), abort, exits, {})
        if self._restarts_left():
            self._await_leaving()
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

    def _write_job(self, state: str, abort: dict | None, exits: dict, seen: dict, restarting: bool = False) -> None:
        now = time.monotonic()
        job = {
            "run_id": self.config["run_id"], "job": self.config["job"], "state": state, "abort": abort,
            "updated_at": _now(), "elapsed_s": round(now - self.started, 1),
            "units": [{"name": u["name"], "host": u["host"], "role": u["role"], "exit_code": exits.get(i),
                       "heartbeat_age_s": round(now - seen[i], 1) if i in seen else None}
                      for i, u in enumerate(self.units)],
        }
        if self.max_restarts:
            if self.attempts and not self.attempts[-1].get("ended_at") and state != vocab.RunState.RUNNING:
                self._close_attempt(abort, state)
            job.update(attempt=self.attempt, max_attempts=self.max_restarts + 1, master=self.unit["host"],
                       moved_to=(abort or {}).get("moved_to"), restarting=restarting,
                       attempts=[{k: v for k, v in a.items() if not k.startswith("_")} for a in self.attempts])
        write_json(os.path.join(self.run_dir, vocab.JOB), job)


def _within(fn, timeout: float):
    """``fn()``'s result, or None where it failed or took longer than ``timeout`` (a store on a
    frozen host accepts the connection and never answers)."""
    result = []

    def attempt():
        try:
            result.append(fn())
        except Exception:  # noqa: BLE001 - silent or gone
            pass

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout)
    return result[0] if result else None


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
