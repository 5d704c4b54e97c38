"""The checks of the guard that hosts the store (on the master): the other guards' heartbeats,
the run's time limit, a stop file, the run's state in job.json, the wait for every unit to
end, and whether this host itself stood still while the run went on with another master.
A part of the Guard class (guard.py), on its state. Shipped beside guard.py into each run's
folder (run_vocab.GUARD_SOURCES).
"""

from __future__ import annotations

import os
import time

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_policy as policy
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
except ImportError:  # on a node: imported by guard.py from the run's folder, where its siblings lie beside it
    import guard_policy as policy
    import run_vocab as vocab

# How often the store's host looks for a stop file (torchfleet stop writes it on the master
# first): one stat, in one guard of the run, where the loop's own look waits a whole poll.
STOP_WATCH_S = 0.05


class HostChecks:
    """The Guard's part that runs on the store's host."""

    def _watch_stop(self, gen: int = 0) -> None:
        """Wake the loop as soon as a stop file appears, and the loop posts the abort that
        every guard awaits."""
        path = os.path.join(self.run_dir, vocab.STOP)
        while not os.path.exists(path):
            time.sleep(STOP_WATCH_S)
        self.wake.set()

    def _host_stood_still(self, seen: dict) -> dict | None:
        """Whether the host itself stood still (paused, starved) since the loop last went
        round: the others' silence may then be its own, so they get a fresh allowance, and
        where the run moved on to another master meanwhile, the abort that says so. Asked
        again before the host judges the others, since it may stand still between the two."""
        gap = time.monotonic() - self.loop_mark
        if gap <= self.node_timeout:
            return None
        self.state["stood_still"] = True  # its node's containers are run_reap's once it ends
        moved_to = self._moved_to() if self._restarts_left() else None
        # From after the look for a successor, which may take seconds.
        now = time.monotonic()
        for i in seen:
            seen[i] = now
        self.still_gap, self.still_end, self.loop_mark = gap, now, now
        return self.set_abort(policy.moved(self.unit["host"], moved_to)) if moved_to else None

    def _back_from_standing_still(self) -> bool:
        return policy.back_from_standing_still(self.still_gap, time.monotonic() - self.still_end, self.node_timeout)

    def _host_checks(self, seen: dict, counters: dict, exits: dict) -> dict | None:
        stood = self._host_stood_still(seen)
        if stood:
            return stood
        now = time.monotonic()
        self.link.read_exits(self.members, self.attempt, exits)
        for i in sorted(self.members):
            count = self.link.beats(i)
            if count and count != counters.get(i):
                counters[i], seen[i] = count, now
        if vocab.job_state(self.units, exits, None, [], self.members) == vocab.RunState.SUCCEEDED:
            self.store.set(vocab.DONE, "1")
        others = set(range(len(self.units))) - self.members
        lost = policy.lost_units(self.units, seen, set(exits) | {self.index} | others, now, self.node_timeout,
                                 self.attempt_started, self.start_timeout)
        self.records.write_job(vocab.RunState.RUNNING.value, None, exits, seen, self.attempt)
        all_silent = set(lost) >= self.members - set(exits) - {self.index}
        if lost and self._restarts_left() and (all_silent or self._back_from_standing_still()):
            # Every other guard silent at once, or this host stood still for as long as the
            # others take to move on (a heartbeat queued before the pause may still arrive
            # from one of them): more likely this host was the one cut off or paused, and the
            # others went on with the next node as their master (see _taken_over).
            moved_to = self._taken_over()
            if moved_to:
                return self.set_abort(policy.moved(self.unit["host"], moved_to))
        if lost:
            return self.set_abort(policy.abort_for_lost(self.units, lost, self.node_timeout))
        if self.job_timeout and now - self.started > self.job_timeout:
            return self.set_abort({"kind": vocab.AbortKind.TIMEOUT.value, "host": self.unit["host"], "unit": None,
                                   "reason": f"the job ran past launch_timeout={self.job_timeout:g}s"})
        return None

    def _taken_over(self) -> str | None:
        """Where the run went on once this host lost every other guard at once: the store it
        finds on a next node, or, where the run may already have ended there, the node that
        the others, having lost this one, make their master (guard_policy.inferred_successor).
        Its job.json then speaks for the run."""
        # Asked first: the look for a successor may take seconds.
        back = self._back_from_standing_still()
        found = self._moved_to()
        if found:
            return found
        # Inferred only where this host stood still for as long as the others take to move
        # on: a host merely starved for CPU, or others that are really all gone, are not that.
        if not back:
            return None
        return policy.inferred_successor(self.link.candidates, self.link.gen, self.unit["host"], self.min_nodes,
                                         set(self._nodes_of(self.members)))

    def _moved_to(self) -> str | None:
        """The node that hosts the run's store now, if another than this one."""
        return self.link.find_run(policy.search_order(self.link.candidates, self.link.gen, self.unit["host"]))

    def _await_others(self, exits: dict) -> None:
        """Keep the store up until every other unit has stopped, or has gone silent (a unit
        killed outright, a lost node): a live guard beats every poll."""
        started = time.monotonic()
        deadline = started + self.grace + self.node_timeout
        counters: dict[int, int] = {}
        moved: dict[int, float] = {}
        while time.monotonic() < deadline:
            now = time.monotonic()
            self.link.read_exits(self.members, self.attempt, exits)
            for i in sorted(self.members):
                if i in exits:
                    continue
                count = self.link.beats(i)
                if count != counters.get(i):
                    counters[i], moved[i] = count, now
            if not policy.still_ending(self.members, exits, moved, started, now, self.poll, self.grace):
                return
            time.sleep(self.poll)

    def _await_leaving(self) -> None:
        """Keep the store up until the guards that beat have read the run's end: a guard gone
        silent (ended, lost) is not waited for, and none longer than a node timeout."""
        started = time.monotonic()
        others = [i for i in range(len(self.units)) if i != self.index and not self.units[i].get("service")]
        counters: dict[int, int] = {}
        beat: dict[int, float] = {}
        while time.monotonic() - started < self.node_timeout:
            now = time.monotonic()
            waiting = []
            for i in others:
                if self.link.said(vocab.left_key(i)):
                    continue
                count = self.link.beats(i)
                if count != counters.get(i):
                    counters[i], beat[i] = count, now
                if now - beat.get(i, started) < 2 * self.poll + 1:
                    waiting.append(i)
            if not waiting:
                return
            time.sleep(self.poll)

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
        most = policy.move_on_s(self.node_timeout) if failover else least + self.node_timeout
        looks: dict[int, list[int]] = {}
        beating = {self.index}
        # After a failover the lost master is one of them: back, it rejoins here as a worker.
        wanted = set(self._nodes_of(self.members)) | lost
        while True:
            for i in range(len(self.units)):
                if i in beating or self.units[i].get("service"):
                    continue
                if policy.beats_again(looks, i, self.link.beats(i)):
                    beating.add(i)
            hosts = policy.answering_hosts(self.config["nodes"], self.units, beating)
            # A new store that too few nodes reach may be one that a node cut off made for
            # itself: it waits for no lost node, and goes looking for the run's (host_decide).
            rejoin = lost if not failover or len(hosts) >= max(1, self.min_nodes) else set()
            if policy.answering_done(time.monotonic() - started, least, most, wanted - set(hosts), rejoin,
                                     self.rejoin_timeout):
                return hosts
            # Fresh while it waits (up to launch_rejoin_timeout): an attached launch takes a
            # job.json older than the guards' stop wait for a host that is gone.
            self.records.write_job(vocab.RunState.RUNNING.value, None, {}, {}, self.attempt, restarting=True)
            time.sleep(self.poll)

    def finish_host(self, exits: dict, abort: dict | None) -> int:
        # Services (sshd) stop once they see `done`; give them a moment to say so.
        deadline = time.monotonic() + self.grace + 2 * self.poll
        while len(exits) < len(self.members) and time.monotonic() < deadline:
            self.link.read_exits(self.members, self.attempt, exits)
            time.sleep(self.poll)
        self.records.close_attempt(None, vocab.RunState.SUCCEEDED.value)
        self.records.write_job(vocab.job_state(self.units, exits, abort, [], self.members), abort, exits, {},
                               self.attempt)
        if self._restarts_left():
            self._await_leaving()
        return self.finish(0, vocab.UnitState.EXITED.value)
