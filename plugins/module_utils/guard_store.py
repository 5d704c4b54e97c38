"""The guards' store: torch's TCPStore that the guard of the master's first unit hosts on
``launch_guard_port``, bound to the cluster address only (after a lost master, the next
node's), and what every guard says and reads there. Shipped beside guard.py into each run's
folder (run_vocab.GUARD_SOURCES).

Every value a guard acts on carries a MAC: HMAC-SHA256 under the run's key (run_vocab.STORE_KEY,
a 0600 file the launch writes into every node's run folder), over the value's key name and
the value, so that a value is good under its own name only. A value without a valid MAC is
ignored, and the guard's log says it rejected it. The heartbeats and the checkpoint copy's
progress are counters (``add``), which carry none: a forged count can delay a verdict, never
decide one (docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import threading
import time
from datetime import timedelta

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
except ImportError:  # on a node: imported by guard.py from the run's folder, where run_vocab.py lies beside it
    import run_vocab as vocab

MAC_SIZE = 64  # the MAC's hex digits, before the value


class Rejected(RuntimeError):
    """A value in the store whose MAC is not the run's."""


def load_key(run_dir: str) -> bytes:
    """The run's key, from its folder: refused where missing or empty, as an unsigned store
    would take any value from anyone."""
    with open(os.path.join(run_dir, vocab.STORE_KEY), "rb") as fh:
        key = fh.read().strip()
    if not key:
        raise ValueError(f"{vocab.STORE_KEY} in {run_dir} is empty")
    return key


class SignedStore:
    """A TCPStore client whose values carry a MAC under ``key``; ``rejected(name, data)`` is told
    of each value that does not."""

    def __init__(self, raw, key: bytes, rejected) -> None:
        self.raw, self.key, self.rejected = raw, key, rejected

    def _mac(self, name: str, payload: bytes) -> bytes:
        return hmac.new(self.key, name.encode() + b"\0" + payload, hashlib.sha256).hexdigest().encode()

    def sign(self, name: str, value: str | bytes) -> bytes:
        payload = value.encode() if isinstance(value, str) else bytes(value)
        return self._mac(name, payload) + payload

    def opened(self, name: str, data: bytes) -> bytes | None:
        """The value in ``data`` where its MAC is good under ``name``, else None (and told)."""
        payload = data[MAC_SIZE:]
        if len(data) >= MAC_SIZE and hmac.compare_digest(data[:MAC_SIZE], self._mac(name, payload)):
            return payload
        self.rejected(name, data)
        return None

    def set(self, name: str, value: str | bytes) -> None:
        self.raw.set(name, self.sign(name, value))

    def read(self, name: str) -> bytes | None:
        """The value of ``name``: None where there is none, or none with a good MAC."""
        if not self.raw.check([name]):
            return None
        return self.opened(name, self.raw.get(name))

    def get(self, name: str) -> bytes:
        """The value of ``name``, which must be there: a bad MAC raises Rejected."""
        value = self.opened(name, self.raw.get(name))
        if value is None:
            raise Rejected(f"{name} in the store has no valid MAC under the run's key")
        return value

    def first(self, name: str, value: str | bytes) -> bytes:
        """The first good value that anyone set for ``name`` (``value`` where none did): one
        without a good MAC is replaced, so that a forged value cannot take a key's place."""
        mine = self.sign(name, value)
        expected: bytes | str = ""
        for _attempt in range(100):
            current = self.raw.compare_set(name, expected, mine)
            if current == mine:
                return self.opened(name, current)
            good = self.opened(name, current)
            if good is not None:
                return good
            expected = current
        raise Rejected(f"{name} in the store keeps being replaced by values without a valid MAC")

    # Existence, counters and removal: as the store has them.
    def check(self, names: list[str]) -> bool:
        return self.raw.check(names)

    def wait(self, names: list[str], timeout: timedelta) -> None:
        self.raw.wait(names, timeout)

    def add(self, name: str, amount: int) -> int:
        return self.raw.add(name, amount)

    def delete_key(self, name: str) -> bool:
        return self.raw.delete_key(name)

    def set_timeout(self, timeout: timedelta) -> None:
        self.raw.set_timeout(timeout)


class Rejections:
    """What a guard's stores rejected, each value said once in the guard's log."""

    def __init__(self, say) -> None:
        self.say, self.seen, self.lock = say, set(), threading.Lock()

    def __call__(self, name: str, data: bytes) -> None:
        digest = hashlib.sha256(data).hexdigest()
        with self.lock:
            if (name, digest) in self.seen:
                return
            self.seen.add((name, digest))
        self.say(f"[torchfleet guard] rejected {name} from the store: no valid MAC under the run's key "
                 f"({len(data)} bytes, sha256 {digest[:16]}); ignored")


class StoreLink:
    """A guard's way to the run's store: which of the candidates (the master's, then in node
    order each next node's first unit's) hosts it now, and a connection to it, hosted by
    this guard where its unit is that candidate's."""

    def __init__(self, config: dict, index: int, key: bytes, rejected) -> None:
        self.config, self.index, self.key, self.rejected = config, index, key, rejected
        self.node_timeout = float(config["node_timeout"])
        self.candidates = config.get("store_candidates") or [dict(config.get("store") or {}, unit=config["store_unit"])]
        self.gen = 0  # which of the candidates hosts the store now
        # Bumped each time the guard leaves a store (a move, or a rejoin at the same one): the
        # threads that wait on the store it left end with it.
        self.era = 0
        # The stores this guard hosted and left, by candidate: its server keeps the port, so a
        # later move back to it takes it up again.
        self.left: dict[int, SignedStore] = {}
        self.store: SignedStore | None = None
        self.listener = None
        self.error = "no store yet"
        self.connect_timeout = 1.0

    @property
    def where(self) -> dict:
        return self.candidates[self.gen]

    @property
    def is_host(self) -> bool:
        return self.where["unit"] == self.index

    def signed(self, raw) -> SignedStore:
        return SignedStore(raw, self.key, self.rejected)

    def connect(self, timeout: float) -> bool:
        """Host the current candidate's store, or connect to it: True once it answered."""
        from torch.distributed import TCPStore  # the ranks' own torch; imported once the unit runs

        host, port = self.where["host"], int(self.where["port"])
        op_timeout = timedelta(seconds=max(1.0, min(self.node_timeout / 2, 5.0)))
        try:
            if self.is_host and self.gen in self.left:
                store = self.left.pop(self.gen)
                store.set(vocab.RUN_KEY, self.config["run_id"])
            elif self.is_host:
                import socket

                # Bound to the cluster address only, and handed to the store already listening.
                self.listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
                self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                self.listener.bind((host, port))
                self.listener.listen(256)
                store = self.signed(TCPStore(host, port, is_master=True, timeout=op_timeout, wait_for_workers=False,
                                             master_listen_fd=self.listener.fileno()))
                store.set(vocab.RUN_KEY, self.config["run_id"])
            else:
                store = self.signed(TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout)))
                store.set_timeout(op_timeout)
                if self.gen or self.era:
                    # A moved store: the run's own, not another's on the same port. One that its
                    # host left says so until the host takes it up again, as a new one is not
                    # there until then: waited for alike.
                    deadline = time.monotonic() + timeout
                    store.wait([vocab.RUN_KEY], timedelta(seconds=timeout))
                    while store.read(vocab.RUN_KEY) != self.config["run_id"].encode():
                        if time.monotonic() > deadline:
                            raise RuntimeError(f"the store on {host}:{port} is not this run's")
                        time.sleep(0.2)
        except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError subclasses, by version
            self.error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.store = None
            return False
        self.store = store
        return True

    def client(self, timeout: float) -> SignedStore:
        """A connection of its own to the current store (a wait blocks its client's one socket)."""
        from torch.distributed import TCPStore

        return self.signed(TCPStore(self.where["host"], int(self.where["port"]), is_master=False,
                                    timeout=timedelta(seconds=timeout)))

    def answers(self) -> bool:
        """Whether the store answers a new connection at once: a guard that stood still itself
        (its node paused) finds the store silent for that long, yet there."""
        from torch.distributed import TCPStore

        where = self.where
        return within(lambda: TCPStore(where["host"], int(where["port"]), is_master=False,
                                       timeout=timedelta(seconds=2)).add(vocab.heartbeat_key(self.index), 0),
                      3.0) is not None

    def holds_run(self, gen: int) -> bool:
        """Whether candidate ``gen`` hosts this run's store now: its signed id answers, within
        a few seconds (a frozen host accepts and never answers)."""
        from torch.distributed import TCPStore

        where = self.candidates[gen]
        run = within(lambda: self.signed(TCPStore(where["host"], int(where["port"]), is_master=False,
                                                  timeout=timedelta(seconds=2))).read(vocab.RUN_KEY), 3.0)
        return run is not None and run.decode() == self.config["run_id"]

    def find_run(self, order: list[int]) -> str | None:
        """The node of the first candidate in ``order`` (guard_policy.search_order) that hosts
        this run's store, if any."""
        for gen in order:
            if self.holds_run(gen):
                return self.candidates[gen]["node"]
        return None

    def move_to(self, node: str) -> None:
        """Follow the run to the store of ``node``, as a guard that does not host it."""
        self.leave()
        self.gen = next(g for g, c in enumerate(self.candidates) if c["node"] == node)

    def leave(self) -> None:
        """Leave the current store; one this guard hosts first stops saying it is the run's,
        so that no guard that looks for the run's store takes it for one."""
        store, self.store, self.era = self.store, None, self.era + 1
        if store is not None and self.is_host:
            bounded(lambda: store.set(vocab.RUN_KEY, f"left by {self.config['run_id']}"), 2.0)
            # Kept: its server and listening socket go with the guard, never under a thread in an op.
            self.left[self.gen] = store

    def live(self) -> SignedStore:
        """The store, or ConnectionError where there is none now (another thread of the guard
        may leave it at any moment: the loop's ops then fail as on a lost store)."""
        store = self.store
        if store is None:
            raise ConnectionError(f"no store: {self.error}")
        return store

    # What the guards say to each other.
    def read_abort(self, attempt: int) -> dict | None:
        return _json(self.live().read(vocab.abort_key(attempt)))

    def post_abort(self, abort: dict, attempt: int) -> dict:
        """The first abort of an attempt wins; every guard reports that one."""
        return _json(self.live().first(vocab.abort_key(attempt), _dumps(abort)))

    def record_exit(self, attempt: int, code: int) -> None:
        key = vocab.exit_key(self.index, attempt)
        if self.live().read(key) is None:
            self.live().set(key, str(code))

    def read_exits(self, members: set[int], attempt: int, exits: dict) -> None:
        """Into ``exits``, every unit's exit code in ``attempt`` that the store holds and ``exits`` lacks."""
        for i in sorted(members):
            if i not in exits:
                code = self.live().read(vocab.exit_key(i, attempt))
                if code is not None:
                    exits[i] = int(code)

    def said(self, name: str) -> bool:
        """Whether a guard said ``name`` (done, left, listening, synced): set with a good MAC."""
        return self.live().read(name) is not None

    def read_json(self, name: str) -> dict | None:
        return _json(self.live().read(name))

    def beats(self, index: int) -> int:
        return self.live().add(vocab.heartbeat_key(index), 0)


def _json(data: bytes | None):
    return None if data is None else json.loads(data)


def _dumps(value) -> str:
    return json.dumps(value)


def within(fn, timeout: float):
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


def bounded(fn, timeout: float) -> None:
    """Run a store op that may block for ever (a frozen host), for at most ``timeout``."""
    within(fn, timeout)
