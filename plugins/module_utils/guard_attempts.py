"""Attempts and restarts (launch_max_restarts): what a guard does once its attempt ended, the
host's decision (which nodes go on, or the run's end), the next attempt's start with the
newest checkpoint on every node, and the move to the next node's store when the master is
lost. A part of the Guard class (guard.py), on its state. Shipped beside guard.py into each
run's folder (run_vocab.GUARD_SOURCES).
"""

from __future__ import annotations

import json
import os
import threading
import time

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_policy as policy
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_store, guard_sync
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
except ImportError:  # on a node: imported by guard.py from the run's folder, where its siblings lie beside it
    import guard_policy as policy
    import guard_store
    import guard_sync
    import run_vocab as vocab


class Attempts:
    """The Guard's part that ends an attempt and starts the next."""

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
            if self.store is not None and self.link.said(vocab.DONE):
                self.store.set(vocab.left_key(self.index), "1")
                return True
        except Exception:  # noqa: BLE001 - any store failure counts as no contact
            pass
        return False

    def end_attempt(self, abort: dict, exits: dict) -> int | None:
        """The attempt ended with ``abort``: the run's end (the last attempt's, or a run
        without restarts), or the way to the next attempt (guard_policy.attempt_end)."""
        then = policy.attempt_end(self._restarts_left(), abort, self.index in self.members, self.is_host)
        if then == "final":
            if self.max_restarts and self.is_host and abort["kind"] != vocab.AbortKind.MOVED:
                abort = dict(abort, final=policy.restart_refused(abort, self.records.attempts, self.max_restarts,
                                                                 self._nodes_of(self.members), self.min_nodes)
                             or "no restarts left")
                self._close_attempt(abort)
            return self.abort(abort, exits)
        final = self._stop_for_attempt(abort)
        if then == "failover":
            return self.failover(abort)
        if then == "decide":
            self.link.record_exit(self.attempt, final)
            return self.host_decide(abort, exits)
        if self.store is not None:
            guard_store.bounded(lambda: self.link.record_exit(self.attempt, final), 2 * self.poll + 1)
        return self.await_next()

    def _stop_for_attempt(self, abort: dict) -> int:
        """Stop the unit for the attempt's end, and keep what its record says of it."""
        self.state.setdefault("abort_seen_at", time.time())
        code = self.proc.poll()
        final = self.proc.stop() if code is None else policy.exit_code(code)
        own = policy.own_failure(abort, self.index)
        self.state.setdefault("attempts", []).append(
            policy.attempt_entry(self.attempt, self._ranks(), final, abort, own, self.state))
        self.state.update(state=vocab.UnitState.RESTARTING.value, exit_code=final, abort=abort)
        if not own:
            self.say(f"[torchfleet guard] stopped {policy.who(self.unit)} (attempt {self.attempt}): {abort['reason']}")
        self.records.write_state()
        return final

    def _close_attempt(self, abort: dict | None) -> None:
        self.records.close_attempt(abort, vocab.job_state(self.units, {}, abort, [], self.members))

    def host_decide(self, abort: dict, exits: dict, failover: bool = False) -> int | None:
        """The host's: once every unit of the ended attempt stopped, which nodes still answer,
        and then the next attempt on them, or the run's end."""
        if not failover:
            self._await_others(exits)
        self._close_attempt(abort)
        self.records.write_job(vocab.RunState.RUNNING.value, None, exits, {}, self.attempt, restarting=True)
        hosts = self._answering(abort, failover)
        attempts = self.records.attempts
        why = policy.restart_refused(abort, attempts, self.max_restarts, hosts, self.min_nodes)
        later = self.link.read_abort(self.attempt + 1)
        if why is None and later:
            why = policy.restart_refused(later, attempts, self.max_restarts, hosts, self.min_nodes)
        stop = self._stop_requested()
        if why is None and stop:
            why = policy.restart_refused(stop, attempts, self.max_restarts, hosts, self.min_nodes)
        if why is not None:
            final = dict(abort, final=why)
            self.store.set(vocab.next_key(self.attempt), json.dumps({"final": final, "attempts": attempts}))
            self.records.write_job(vocab.job_state(self.units, exits, final, [], self.members), final, exits, {},
                                   self.attempt)
            self._await_leaving()
            return self._finish_attempts(final)
        plan = policy.plan_attempt(self.config, hosts, self.attempt + 1)
        self.records.open_attempt(plan)
        self.store.set(vocab.next_key(self.attempt), json.dumps({"plan": plan, "attempts": self.records.attempts}))
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
                decision = self.link.read_json(vocab.next_key(attempt))
                if decision is not None:
                    break
                if self.index not in self.members and self.link.said(vocab.DONE):
                    self.store.set(vocab.left_key(self.index), "1")
                    return self.finish(self.state.get("exit_code", 0), vocab.UnitState.LEFT_OUT.value,
                                       "the run ended in an attempt without this node")
                stop = self._stop_requested() or (policy.signalled(self.unit, self.signalled) if self.signalled else None)
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
        self.records.attempts = decision["attempts"]
        if "final" in decision:
            guard_store.bounded(lambda: self.store.set(vocab.left_key(self.index), "1"), 2 * self.poll + 1)
            return self._finish_attempts(decision["final"])
        return self.begin_attempt(decision["plan"])

    def begin_attempt(self, plan: dict) -> int | None:
        """Start this unit in ``plan``'s attempt, or wait for a later one where it has no part."""
        # Under the lock that the abort's wake takes to stop the unit (Guard._stop_on_abort):
        # a wake for the attempt that ended must find its number changed, not this attempt's unit.
        with self.attempt_lock:
            self.attempt, self.plan = plan["attempt"], plan
        self.members = {int(i) for i in plan["units"]}
        self.state["attempt"] = self.attempt
        if self.index not in self.members:
            self.say(f"[torchfleet guard] attempt {self.attempt} runs without {self.unit['host']}; "
                     f"{policy.who(self.unit)} waits for the next one")
            return self.await_next()
        env, self.argv = policy.unit_attempt(self.unit, self.index, plan, self.base_argv)
        self._sync_checkpoints(plan)
        ranks = plan["units"][str(self.index)]["ranks"]
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}" if ranks else "no rank"
        self.say(f"{vocab.ATTEMPT_BANNER}{self.attempt} of {self.max_restarts + 1}: {label} of {plan['world_size']} "
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
            while not self.link.said(ready):
                self.store.add(vocab.heartbeat_key(self.index), 1)
                time.sleep(self.poll)
            return
        try:
            done = guard_sync.sync(self.store, self.attempt, host, plan["nodes"], folder,
                                   max(30.0, 2 * self.node_timeout), say=self.say)
            self.state.setdefault("checkpoint_sync", []).append(dict(done, attempt=self.attempt))
        except Exception as exc:  # noqa: BLE001 - the ranks still start: the workload may bring its own
            self.say(f"[torchfleet guard] checkpoint sync of attempt {self.attempt} failed: {exc}")
        self.store.set(ready, "1")

    def failover(self, cause: dict) -> int | None:
        """The store's host is gone: move, in node order, to the next node's first guard's
        store (hosting it where that guard is this one), and go on from there."""
        with self.turn:
            if self.moving and self.owner != threading.get_ident():
                threading.Event().wait()
            self.moving, self.owner = True, threading.get_ident()
        if self.proc.poll() is None:
            self._stop_for_attempt(cause)
        lost = self.link.where["node"]
        if self.stood_still:
            self.moving = False
            return self._rejoin_or_leave(cause)
        self.link.store = None
        for gen in range(self.link.gen + 1, len(self.link.candidates)):
            if self.link.candidates[gen]["node"] == lost:
                continue
            self.link.gen = gen
            if self.connect(timeout=policy.move_on_s(self.node_timeout)):
                break
        else:
            self.moving = False
            return self._finish_attempts(dict(cause, final=f"no node took over from the lost master {lost}"))
        self.moving = False
        self.say(f"[torchfleet guard] the master {lost} was lost; the run's store moved to {self.link.where['node']}")
        self._watch()
        if self.is_host:
            self.members = {i for i in self.members if self.units[i]["host"] != lost}
            return self.host_decide(cause, {}, failover=True)
        return self.await_next()

    def _rejoin_or_leave(self, cause: dict) -> int | None:
        """This guard stood still, and the store it knew is silent: where the run moved on
        without it, wait there for a later attempt; where it ended, leave."""
        moved_to = self.link.successor()
        if moved_to is None:
            self.members.discard(self.index)
            return self.finish(self.state.get("exit_code", 0), vocab.UnitState.LEFT_OUT.value,
                               f"{self.unit['host']} stood still, and the run's store is gone: the run went on "
                               f"or ended without it ({cause['reason']})", cause)
        self.link.move_to(moved_to)
        if not self.connect(timeout=self.node_timeout):
            self.members.discard(self.index)
            return self.finish(self.state.get("exit_code", 0), vocab.UnitState.LEFT_OUT.value, cause["reason"], cause)
        self.members.discard(self.index)
        self._watch()
        return self.await_next()

    def _finish_attempts(self, final: dict) -> int:
        """The run ended between attempts: this unit's record says how, with the run's abort."""
        if self.index not in self.members:
            return self.finish(self.state.get("exit_code", 0), vocab.UnitState.LEFT_OUT.value, final["reason"], final)
        state, why = policy.final_unit_state(self.state.get("attempts"))
        return self.finish(self.state.get("exit_code", 0), state, why, final)

    def _nodes_of(self, members: set) -> list[str]:
        return [n["host"] for n in self.config["nodes"] if any(self.units[i]["host"] == n["host"] for i in members)]

    def _ranks(self) -> list[int]:
        if self.plan:
            return self.plan["units"][str(self.index)]["ranks"]
        return list(self.unit.get("ranks") or [])
