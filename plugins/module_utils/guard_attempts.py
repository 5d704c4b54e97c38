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
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_child
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_policy as policy
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_store, guard_sync
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
except ImportError:  # on a node: imported by guard.py from the run's folder, where its siblings lie beside it
    import guard_child
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
        if then == "follow":
            return self.follow(abort, exits)
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
        if failover and len(hosts) < max(1, self.min_nodes):
            # Too few nodes reach this new store: more likely this node is the one cut off,
            # and the run goes on at a store it cannot reach yet.
            return self.rejoin(abort, hosted=True)
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
                self.link.live().add(vocab.heartbeat_key(self.index), 1)
                decision = self.link.read_json(vocab.next_key(attempt))
                if decision is not None:
                    break
                if self.index not in self.members and self.link.said(vocab.DONE):
                    self.link.live().set(vocab.left_key(self.index), "1")
                    return self.finish(self.state.get("exit_code", 0), vocab.UnitState.LEFT_OUT.value,
                                       "the run ended in an attempt without this node")
                stop = self._stop_requested() or (policy.signalled(self.unit, self.signalled) if self.signalled else None)
                if stop:
                    self.set_abort(stop, attempt + 1)
                self.last_ok, self.stood_still = time.monotonic(), False
            except Exception:  # noqa: BLE001 - any store failure counts as no contact
                self._mine()
                if time.monotonic() - self.last_ok > self.node_timeout:
                    if self.index in self.members and self._restarts_left():
                        return self.failover(self._store_lost())
                    # Outside the attempt: the run may have moved on to another store meanwhile.
                    return self.rejoin(self._store_lost())
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
        named = os.environ.get("GLOO_SOCKET_IFNAME")
        if named and guard_child.interface_gone(named):
            # The link came back under another name (a NIC reset, a container's network
            # endpoint made anew): Gloo binds to the one that now leads to MASTER_ADDR.
            found = guard_child.interface_towards(plan["master_addr"])
            if found:
                env["GLOO_SOCKET_IFNAME"] = found
                self.say(f"[torchfleet guard] {named} is gone on {self.unit['host']}: GLOO_SOCKET_IFNAME={found}, "
                         f"the interface towards MASTER_ADDR {plan['master_addr']}")
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
        synced = threading.Event()
        if self.is_host:
            threading.Thread(target=self._keep_job_fresh, args=(synced,), daemon=True).start()
        try:
            done = guard_sync.sync(self.store, self.attempt, host, plan["nodes"], folder,
                                   max(30.0, 2 * self.node_timeout), say=self.say)
            self.state.setdefault("checkpoint_sync", []).append(dict(done, attempt=self.attempt))
        except Exception as exc:  # noqa: BLE001 - the ranks still start: the workload may bring its own
            self.say(f"[torchfleet guard] checkpoint sync of attempt {self.attempt} failed: {exc}")
        finally:
            synced.set()
        self.store.set(ready, "1")

    def _keep_job_fresh(self, done: threading.Event) -> None:
        """The host's job.json stays fresh while its loop copies the checkpoint (up to the
        copy's timeout, where a node of the plan is gone): an attached launch takes a job.json
        older than the guards' stop wait for a host that is gone."""
        while not done.wait(2 * self.poll):
            self.records.write_job(vocab.RunState.RUNNING.value, None, {}, {}, self.attempt)

    def _claim(self) -> None:
        """Run the guard from this thread on (the loop's, or the watchdog's that took it over);
        a thread that comes second, while the other moves the store, waits for the guard's end."""
        with self.turn:
            if self.moving and self.owner != threading.get_ident():
                threading.Event().wait()
            self.moving, self.owner = True, threading.get_ident()

    def failover(self, cause: dict) -> int | None:
        """The store's host is gone: move, in node order, to the next node of the attempt's
        first guard's store (hosting it where that guard is this one), and go on from there."""
        self._claim()
        if self.proc.poll() is None:
            self._stop_for_attempt(cause)
        lost = self.link.where["node"]
        if self.stood_still:
            self.moving = False
            return self.rejoin(cause)
        self.link.leave()
        for gen in policy.failover_order(self.link.candidates, self.link.gen, lost, set(self._nodes_of(self.members))):
            if self.link.candidates[gen]["unit"] == self.index:
                # About to host: where the run's store answers elsewhere (this node was the one
                # cut off, and its link is back), rejoin it instead.
                found = self.link.find_run(policy.search_order(self.link.candidates, self.link.gen, self.unit["host"]))
                if found:
                    self.moving = False
                    return self.rejoin(cause)
            self.link.gen = gen
            if self.connect(timeout=policy.move_on_s(self.node_timeout)):
                break
        else:
            # No node hosts (nor can this one: a node cut off has lost its own address too):
            # where the run's store answers again, rejoin it; else leave.
            self.moving = False
            return self.rejoin(cause)
        self.moving = False
        self.say(f"[torchfleet guard] the master {lost} was lost; the run's store moved to {self.link.where['node']}")
        self._watch()
        if self.is_host:
            self.members = {i for i in self.members if self.units[i]["host"] != lost}
            return self.host_decide(cause, {}, failover=True)
        return self.await_next()

    def follow(self, moved: dict, exits: dict) -> int | None:
        """This node stood still as the master, and the run moved on to ``moved_to``: its
        job.json says so (the run's record is the new master's), and its guards rejoin the run
        there, as workers that wait for the next attempt."""
        if self.is_host:
            self._await_others(exits)
            self.records.write_job(vocab.job_state(self.units, exits, moved, [], self.members), moved, exits, {},
                                   self.attempt)
        self.link.leave()
        there = [g for g, c in enumerate(self.link.candidates) if c["node"] == moved["moved_to"]]
        return self.rejoin(moved, order=there)

    def rejoin(self, cause: dict, hosted: bool = False, order: list[int] | None = None) -> int | None:
        """This guard lost the run's store (it stood still, was cut off, waited outside the
        attempt, or hosts one that too few nodes reach): look for it among the store
        candidates (guard_policy.search_order) for up to launch_rejoin_timeout, and wait there,
        outside the attempt, for the next one; where it is nowhere, leave."""
        self._claim()
        if hosted:
            # This store never was the run's: job.json says where the run went, or that it ended.
            self.link.leave()
        order = order or policy.search_order(self.link.candidates, self.link.gen, self.unit["host"])
        deadline = time.monotonic() + max(self.rejoin_timeout, self.node_timeout)
        found = None
        while found is None and not self._stop_requested():
            found = self.link.find_run(order)
            if found is None and time.monotonic() > deadline:
                break
            if found is None:
                time.sleep(self.poll)
                continue
            self.link.move_to(found)
            if not self.connect(timeout=self.node_timeout):
                found = None
        self.moving = False
        self.members.discard(self.index)
        if hosted:
            left = dict(policy.moved(self.unit["host"], found),
                        reason=f"{self.unit['host']} hosted a store that too few nodes reached; the run went on "
                               f"with {found}") if found else dict(cause, final="too few nodes reach this store")
            self.records.write_job(vocab.job_state(self.units, {}, left, [], self.members), left, {}, {}, self.attempt)
        if found is None:
            return self.finish(self.state.get("exit_code", 0), vocab.UnitState.LEFT_OUT.value,
                               f"{self.unit['host']} lost the run's store, and found it on no node within "
                               f"launch_rejoin_timeout: the run went on or ended without it ({cause['reason']})", cause)
        self.stood_still, self.last_ok = False, time.monotonic()
        self.say(f"[torchfleet guard] {policy.who(self.unit)} found the run's store on {found}: it waits there "
                 f"for the next attempt")
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
