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

Every value a guard acts on carries a MAC under the run's key (guard_store). It runs with
the Python that runs the ranks (it needs torch) and nothing else. This file is the entry
point and owns the loop; its siblings, copied with it into each run's folder
(run_vocab.GUARD_SOURCES) so that they lie in the script's own folder, first on its import
path, hold the rest by concern: the decisions (guard_policy.py), the unit's process and the
fork server (guard_child.py), the store and its MACs (guard_store.py), the records
(guard_records.py), the host's checks (guard_host.py), attempts and restarts
(guard_attempts.py), the checkpoint's copy to a new attempt's nodes (guard_sync.py) and the
run's vocabulary (run_vocab.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import sys
import threading
import time
from datetime import timedelta
from typing import NoReturn

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_child
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_policy as policy
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_records, guard_store
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
    from ansible_collections.torchfleet.cluster.plugins.module_utils.guard_attempts import Attempts
    from ansible_collections.torchfleet.cluster.plugins.module_utils.guard_host import HostChecks
except ImportError:  # on a node: run as a script from the run's folder, where its modules lie beside it
    import guard_child
    import guard_policy as policy
    import guard_records
    import guard_store
    import run_vocab as vocab
    from guard_attempts import Attempts
    from guard_host import HostChecks

# How often a unit's guard tries its listen (the spec's ``listen``) until it answers, as the
# controller's listen_wait does.
LISTEN_POLL_S = 0.05


class Guard(Attempts, HostChecks):
    def __init__(self, config: dict, index: int, argv: list[str], run_dir: str):
        self.config, self.index, self.argv, self.run_dir = config, index, argv, run_dir
        self.base_argv = list(argv)
        self.units = config["units"]
        self.unit = self.units[index]
        self.poll = float(config.get("poll_interval", 0.5))
        self.node_timeout = float(config["node_timeout"])
        self.stall_timeout = float(config.get("stall_timeout", 0))
        self.job_timeout = float(config.get("job_timeout", 0))
        self.grace = float(config.get("stop_grace", 5))
        self.start_timeout = float(config.get("start_timeout", 120))
        self.listen_timeout = float(config.get("listen_timeout") or 0)
        self.records = guard_records.Records(config, index, run_dir)
        self.state = self.records.state
        self.say = self.records.say
        # Set when the unit ends, a signal comes or any guard posts the abort: the loop then
        # acts at once instead of at its next poll.
        self.wake = threading.Event()
        self.proc = guard_child.UnitProcess(self.unit, run_dir, self.poll, self.grace, self.wake, self.state,
                                            self.records.running)
        self.link = guard_store.StoreLink(config, index, None, guard_store.Rejections(self.say))
        self.lock_fd: int | None = None
        self.started = time.monotonic()
        # The units of earlier phases whose listen this unit's first start waits for, and
        # where this unit's own listen stands: None (none), "waiting", "answered", "told", or
        # "late" (not within listen_timeout).
        self.after = [int(i) for i in self.unit.get("after") or []]
        self.after_keys = [vocab.listening_key(i) for i in self.after]
        self.listen_state = "waiting" if self.unit.get("listen") else None
        self.signalled: int | None = None
        # The parent whose end is the unit's (config parent_holds_unit), as it was at the start.
        self.parent = os.getppid() if config.get("parent_holds_unit") else None
        # How the wait after a failure that blames a peer stands.
        self.peer_error = re.compile(config["peer_error"], re.IGNORECASE) if config.get("peer_error") else None
        self.peer_wait: dict | None = None
        # A store op on a frozen or cut-off host blocks (the client sets no receive timeout);
        # the watchdog thread ends such a guard's unit on its own (store ops release the GIL).
        self.last_ok = time.monotonic()
        self.ending = threading.Lock()
        # Restarts: the attempt this guard is in (1 is the launch's), and the units that take
        # part in it. The attempt changes under attempt_lock (see _stop_on_abort).
        self.max_restarts = int(config.get("max_restarts") or 0)
        self.min_nodes = int(config.get("min_nodes") or 0)
        self.backoff = float(config.get("restart_backoff") or 0)
        self.rejoin_timeout = float(config.get("rejoin_timeout") or 0)
        self.attempt = 1
        self.attempt_lock = threading.Lock()
        self.members = set(range(len(self.units)))
        self.plan: dict | None = None
        self.attempt_started = self.started
        # Which thread runs the loop: after a master's loss, the watchdog may take it over
        # from a main thread held in an op on the frozen store, which then must never act.
        self.turn = threading.Lock()
        self.owner: int | None = None
        self.moving = False
        # Set once this guard itself stood still (its node paused) for a node timeout: the
        # store's silence is then its own, and it never takes a lost master's place. The
        # watchdog's mark is when its last sleep began.
        self.stood_still = False
        self.watch_mark: float | None = None
        # The host's: when its loop last went round, and how long it last stood still and
        # when that ended (see _host_stood_still).
        self.loop_mark = time.monotonic()
        self.still_gap, self.still_end = 0.0, 0.0

    @property
    def store(self) -> guard_store.SignedStore | None:
        return self.link.store

    @property
    def is_host(self) -> bool:
        return self.link.is_host

    def _hold_lock(self) -> None:
        """Hold the unit's lock file until the guard ends, however it ends (run_vocab.guard_lock),
        before the first record: a reader that takes the lock knows the record is final or
        stale."""
        self.lock_fd = os.open(os.path.join(self.run_dir, vocab.guard_lock(self.index)),
                               os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)
        self.proc.lock_fd = self.lock_fd

    def finish(self, code: int, state: str, why: str | None = None, abort: dict | None = None) -> int:
        """The guard's end, recorded; the watchdog, which ends a guard on its own, leaves it be."""
        self.ending.acquire(blocking=False)
        self._note_standing_still()
        return self.records.finish(code, state, why, abort)

    def _note_standing_still(self) -> None:
        """The record says whether this guard's node stood still and came back (run_reap then
        removes the unit's container): also where the loop ends the guard before the
        watchdog, asleep since before the pause, has looked."""
        if self.watch_mark is not None and time.monotonic() - self.watch_mark > self.node_timeout:
            self.stood_still = self.state["stood_still"] = True

    # -- the child --

    def start_child(self, env: dict | None = None, hold: bool = False) -> None:
        self.proc.start(self.argv, policy.preload_target(self.argv, sys.executable), env, hold, self.attempt)

    def stop_child(self) -> int:
        return self.proc.stop()

    # -- the store --

    def connect(self, timeout: float) -> bool:
        """The store, hosted or reached (guard_store.StoreLink), and the threads that wait on
        it for this guard."""
        if not self.link.connect(timeout):
            return False
        # The store answered; the watchdog's allowance runs from here, not from the start.
        self.last_ok = time.monotonic()
        threading.Thread(target=self._await_abort, args=(self.link.era,), daemon=True).start()
        if self.proc.waiting:
            threading.Thread(target=self._await_after, daemon=True).start()
        return True

    def _await_abort(self, era: int) -> None:
        """Wake the loop the moment any guard posts the attempt's abort. A connection of its
        own: a client is one socket, and this wait blocks it. Ends once the guard left its store."""
        try:
            store = self.link.client(self.start_timeout)
        except Exception:  # noqa: BLE001 - the loop's polls still see the abort
            return
        while self.link.era == era:
            attempt = self.attempt
            try:
                # Long: each timeout prints a c10d warning into the unit's log, and an attempt
                # only ends on its abort, which ends the wait.
                store.wait([vocab.abort_key(attempt)], timedelta(days=1))
                posted = store.read(vocab.abort_key(attempt))
            except Exception:  # noqa: BLE001 - the wait's timeout, or the store gone: the polls decide
                time.sleep(self.poll)
                continue
            if posted is None:  # not the run's: told, and looked at again until a real one replaces it
                time.sleep(self.poll)
                continue
            if self._stop_on_abort(attempt, era):
                self.wake.set()
            while self.link.era == era and self.attempt == attempt:
                time.sleep(self.poll)

    def _stop_on_abort(self, attempt: int, era: int) -> bool:
        """Every abort stops every unit, so the stop starts as soon as the abort's wait wakes,
        before the loop has read why (three store ops behind 47 other guards on a busy host);
        the loop still records the reason and escalates to SIGKILL after the grace period.
        Only while the attempt that ended is the guard's: under attempt_lock, which a new
        attempt takes to change the number before its unit starts, so that a wake held up
        (a starved thread) cannot stop the next attempt's unit, as it once did under load."""
        with self.attempt_lock:
            if self.link.era != era or self.attempt != attempt:
                return False
            self.state.setdefault("abort_seen_at", time.time())
            if self.proc.running_now():
                self.state.setdefault("sigterm_at", time.time())
                guard_child.killpg(self.proc.child.pid, signal.SIGTERM)
            return True

    def read_abort(self) -> dict | None:
        return self.link.read_abort(self.attempt)

    def set_abort(self, abort: dict, attempt: int | None = None) -> dict:
        return self.link.post_abort(abort, attempt or self.attempt)

    # -- the loop --

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._on_signal)
        self.link.key = guard_store.load_key(self.run_dir)
        self._hold_lock()
        target = policy.preload_target(self.argv, sys.executable)
        forkable = target is not None and guard_child.import_torch()
        if self.max_restarts or (self.after and not forkable):
            # Before any thread: every later start comes from it (guard_child.ForkServer).
            self.proc.server = guard_child.ForkServer(close_fds=(self.lock_fd,))
        if self.after:
            # The loop releases it once the store says every unit of ``after`` listens: this
            # guard meanwhile connects and beats, as the master starts.
            self.start_child(hold=True)
            self.state["waiting_for"] = [self.units[i]["name"] for i in self.after]
            self.records.write_state()
        else:
            self.start_child()
        if self.listen_state:
            threading.Thread(target=self._await_listen, args=(self.proc.child,), daemon=True).start()
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
            if self.proc.waiting:
                since = time.monotonic()
            elif self.listen_timeout and time.monotonic() - since > self.listen_timeout:
                self.listen_state = "late"
                self.wake.set()
                return
            time.sleep(LISTEN_POLL_S)

    def _await_after(self) -> None:
        """Wake the loop the moment every unit this one starts after listens. A connection
        of its own, as _await_abort's; the loop checks the values' MACs."""
        try:
            self.link.client(self.start_timeout).wait(self.after_keys, timedelta(days=1))
        except Exception:  # noqa: BLE001 - the loop's polls still see the keys
            return
        self.wake.set()

    def _watch(self) -> None:
        """The thread that watches for what the loop may miss: on the host a stop file, on
        any other guard a store that stopped answering (see _watchdog)."""
        target = self._watch_stop if self.is_host else self._watchdog
        threading.Thread(target=target, args=(self.link.era,), daemon=True).start()

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
            code = self.proc.poll()
            try:
                if self.store is None:
                    self._mine()  # not where the watchdog, moving the store, just left it
                    self.connect(timeout=self.link.connect_timeout)
                    if self.store is None:
                        self.link.connect_timeout = policy.next_connect_timeout(self.link.connect_timeout,
                                                                                self.node_timeout)
                        raise ConnectionError(self.link.error)
                self.link.live().add(vocab.heartbeat_key(self.index), 1)
                abort = abort or self.read_abort()
                # A stop first: on the host, the checks below take a store op per unit.
                if abort is None and self._stop_requested():
                    abort = self.set_abort(self._stop_requested())
                if self.is_host:
                    abort = abort or self._host_checks(seen, counters, exits)
                self._tell_listening(code)
                abort = abort or self._unit_checks(code)
                if abort is None and self.unit.get("service") and self.link.said(vocab.DONE):
                    return self.finish(policy.exit_code(self.stop_child()) if self.proc.poll() is None else 0,
                                       vocab.UnitState.STOPPED.value, "the job's other units finished")
                # In touch: a silence to come is not one this node stood still through.
                self.last_ok, self.stood_still = time.monotonic(), False
            except Exception as exc:  # noqa: BLE001 - any store failure counts as no contact
                # A loop that the watchdog took over meanwhile (it moves the store) stops here.
                self._mine()
                if self.is_host or not isinstance(exc, (RuntimeError, ConnectionError, OSError)):
                    raise
                # Without the store, what this node can tell on its own still stops its unit.
                local = self._stop_requested() or (
                    dict(policy.abort_for_exit(self.unit, policy.exit_code(code)), index=self.index)
                    if code else None)
                if local is None and self.signalled:
                    local = policy.signalled(self.unit, self.signalled)
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
                    self.records.write_state()
                if self.store is not None:
                    try:
                        self.link.record_exit(self.attempt, 0)
                    except Exception:  # noqa: BLE001 - tried again next round; a lost store is judged above
                        pass
                if not self.is_host and self._may_leave():
                    return self.finish(0, vocab.UnitState.EXITED.value)
                if vocab.job_state(self.units, exits, None, [], self.members) == vocab.RunState.SUCCEEDED:
                    return self.finish_host(exits, None)
            self.wake.wait(self.poll)

    def _tell_listening(self, code: int | None) -> None:
        """Tell the store that the unit listens: the guards of the units that start after it
        start them. A unit that finished without listening (a script with no rendezvous) lets
        the later phase start too, as one that listens does."""
        if self.listen_state == "answered" or (self.listen_state == "waiting" and code == 0):
            self.link.live().set(vocab.listening_key(self.index), "1")
            self.listen_state = "told"

    def _unit_checks(self, code: int | None) -> dict | None:
        """What this guard's own unit says, once no abort was posted: its listen too late, its
        exit, a signal to the guard, its release from the wait for an earlier phase, its stall."""
        if self.listen_state == "late":
            return self.set_abort(dict(policy.not_listening(self.unit, self.listen_timeout), index=self.index))
        if code is not None and code != 0 and self._peer_wait_over():
            return self.set_abort(dict(policy.abort_for_exit(self.unit, policy.exit_code(code)), index=self.index))
        if self.signalled:
            return self.set_abort(policy.signalled(self.unit, self.signalled))
        if self.parent is not None and os.getppid() != self.parent:
            return self.set_abort(dict(policy.parent_gone(self.unit, self.parent), index=self.index))
        if self.proc.waiting:
            if all(self.link.said(key) for key in self.after_keys):
                self.start_child()
        elif code is None:
            found = policy.stalled(self.unit, self.proc.progressed(), self.stall_timeout, self.proc.has_progressed,
                                   self.start_timeout)
            if found:
                return self.set_abort(dict(found, index=self.index))
        return None

    def _watchdog(self, era: int) -> None:
        while self.link.era == era:
            self.watch_mark = time.monotonic()
            time.sleep(self.poll)
            self._note_standing_still()
            silent = time.monotonic() - self.last_ok
            # A loop held in a store op (a frozen master) still obeys a stop on its own node,
            # before the store counts as lost.
            requested = self._stop_requested() if silent > 2 * self.poll + 1 else None
            if requested or silent > self._store_limit() + 2 * self.poll:
                if self.link.era != era or self.moving:
                    return
                if not requested and self._restarts_left():
                    if self.link.answers():
                        self.last_ok = time.monotonic()
                        continue
                    self._take_over(self._store_lost())
                if not self.ending.acquire(blocking=False):
                    return
                abort = requested or self._store_lost()
                self.state.setdefault("abort_seen_at", time.time())
                code = self.proc.poll()
                final = self.stop_child() if code is None else policy.exit_code(code)
                self.state["stopped_at"] = time.time()
                self.records.finish(final, vocab.UnitState.STOPPED.value, abort["reason"], abort)
                self.exit_now(final)

    def exit_now(self, code: int) -> NoReturn:
        """End the guard once its record is on disk, without tearing down an interpreter that
        imported torch: a third of a second of CPU, and a stop waits for every guard to be gone
        (at 48 guards on 2 cores, 16 s)."""
        if self.proc.output is not None:
            self.proc.output.join(guard_child.OUTPUT_DRAIN_S)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def _take_over(self, lost: dict) -> NoReturn:
        """From the watchdog: the loop is held in an op on the lost store, so this thread
        moves to the next store (or, outside the attempt, looks for the run's) and runs the
        guard from there on. A later attempt's unit comes from the fork server, never from
        this thread."""
        code = self.failover(lost) if self.index in self.members else self.rejoin(lost)
        if code is None:
            code = self._loop()
        self.exit_now(code)

    def _on_signal(self, signum, frame) -> None:
        self.signalled = signum
        self.wake.set()

    def _stop_requested(self) -> dict | None:
        return policy.stop_requested(self._read_stop, self.unit["host"])

    def _read_stop(self) -> str | None:
        """The stop file's text: None where there is none, "" where it cannot be read."""
        path = os.path.join(self.run_dir, vocab.STOP)
        if not os.path.exists(path):
            return None
        try:
            with open(path) as fh:
                return fh.read()
        except OSError:
            return ""

    def abort(self, abort: dict, exits: dict) -> int:
        if not self.ending.acquire(blocking=False):
            threading.Event().wait()  # the watchdog is ending this guard
        # When this guard learnt of the abort, apart from how long its unit then took to end.
        self.state.setdefault("abort_seen_at", time.time())
        code = self.proc.poll()
        final = self.stop_child() if code is None else policy.exit_code(code)
        self.state["stopped_at"] = time.time()
        # Only the unit that caused the abort ended on its own account; any other was stopped
        # because of it, whether by this guard or by its own runner first (torchrun's agents
        # see a peer agent fail through their own store).
        if policy.own_failure(abort, self.index):
            state, why = vocab.UnitState.EXITED.value, None
        else:
            state, why = vocab.UnitState.STOPPED.value, abort["reason"]
        if not self.is_host:
            # On disk first: the store may be what is gone, and an op on it may block.
            self._note_standing_still()
            self.records.finish(final, state, why, abort)
            if self.store is not None:
                guard_store.bounded(lambda: self.link.record_exit(self.attempt, final), 2 * self.poll + 1)
            return final
        self.link.record_exit(self.attempt, final)
        # Said at once, so that an attached controller need not wait for the stragglers.
        self.records.write_job(vocab.job_state(self.units, exits, abort, [], self.members), abort, exits, {},
                               self.attempt)
        self._await_others(exits)
        self.records.write_job(vocab.job_state(self.units, exits, abort, [], self.members), abort, exits, {},
                               self.attempt)
        return self.finish(final, state, why, abort)

    def _peer_wait_over(self) -> bool:
        """Whether a failed unit may abort the run now (see guard_policy.peer_wait_over)."""
        if self.peer_error is None or not any(self.peer_error.search(line) for line in self.proc.recent):
            return True
        now = time.monotonic()
        if self.peer_wait is None:
            self.peer_wait = {"since": now, "counters": {}, "moved": {}}
            self.say(f"[torchfleet guard] {policy.who(self.unit)} lost a peer; "
                     "waiting for the peers' guards to name the cause")
        wait, others, exits = self.peer_wait, [], {}
        self.link.read_exits(self.members, self.attempt, exits)
        for i in sorted(self.members):
            if i == self.index or i in exits:
                continue
            others.append(i)
            count = self.link.beats(i)
            if i in wait["counters"] and count != wait["counters"][i]:
                wait["moved"][i] = wait["moved"].get(i, 0) + 1
            wait["counters"][i] = count
        return policy.peer_wait_over(now - wait["since"], wait["moved"], others, self.node_timeout, self.poll)

    def _store_limit(self) -> float:
        return policy.store_limit(self.store is not None, self.node_timeout, self.start_timeout)

    def _store_lost(self) -> dict:
        return policy.store_lost(self.link.where, time.monotonic() - self.last_ok, self.node_timeout)


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
    except (OSError, ValueError) as exc:
        if guard.lock_fd is not None:
            raise
        sys.stderr.write(f"guard: cannot read the run's store key: {exc}\n")  # before anything started
        return 2
    guard.exit_now(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
