"""A run's out folders kept in step on the controller while it runs, and its TensorBoard
event files laid out for TensorBoard, one run of TensorBoard's per rank and attempt
(`torchfleet tensorboard`).

Every interval, one playbook (the collection's sync) asks each node, in one module run
(out_sync), for the run's state and what changed in its ranks' out folder against what the
controller holds: a file that only grew sends its new bytes, any other change sends it
anew, within a budget per node and round. The bytes land where the collect puts that node's
out folder, runs/RUN/out/HOST/, so that the collect at the run's end finds the same files.
What a file holds decides nothing here: the layout for TensorBoard (``layout``) links each
event file under a name of its rank and, where the run restarts, its attempt, the attempt
read from the file's first event against the run's table of attempts (job.json).
"""

from __future__ import annotations

import base64
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Iterable, Iterator, Mapping

from torchfleet import outputs, run_status, runner
from torchfleet import run_vocab as vocab
from torchfleet.errors import TorchfleetError
from torchfleet.inputs import check_run_id

# Seconds between rounds, and what one round may bring of one node (it goes on at the next).
INTERVAL = 10.0
MAX_BYTES = 4 << 20
# Larger files (checkpoints) are left to the collect.
MAX_FILE_BYTES = 64 << 20
# A folder named so holds one rank's files (the bundled workload's tensorboard/rank-N).
RANK_FOLDER = re.compile(r"rank[-_]?(\d+)")
# The states of a run that has ended: nothing more to bring.
ENDED = (vocab.RunState.SUCCEEDED, vocab.RunState.FAILED, vocab.RunState.STOPPED)


def held(out_dir: Path, digests: Mapping[str, tuple[int, int, str]]) -> dict[str, list[Any]]:
    """What the controller holds of a node's out folder, as out_sync takes it: [size,
    mtime_ns, digest] by path. The digest is the node's, of the end it last sent
    (``digests``), and only where the file is still as that left it; a file without one
    comes again whole."""
    have: dict[str, list[Any]] = {}
    if not out_dir.is_dir():
        return have
    for root, dirs, names in os.walk(out_dir):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            if name.startswith("."):
                continue
            path = Path(root) / name
            try:
                st = path.lstat()
            except OSError:
                continue
            rel = path.relative_to(out_dir).as_posix()
            known = digests.get(rel)
            if known and known[:2] == (st.st_size, st.st_mtime_ns):
                have[rel] = [st.st_size, st.st_mtime_ns, known[2]]
    return have


def apply(out_dir: Path, chunks: Iterable[Mapping[str, Any]]) -> tuple[dict[str, tuple[int, int, str]], int]:
    """Write out_sync's chunks into ``out_dir``: an offset of 0 starts the file anew (a
    temporary file renamed over it), any other is appended where the copy is that long
    (a chunk that no longer fits, the copy having changed meanwhile, is dropped: the next
    round sends again). Each file written takes the node's mtime. Returns the digests of the
    files written ({path: (size, mtime_ns, digest)}) and the bytes written."""
    written: dict[str, tuple[int, int, str]] = {}
    count = 0
    for chunk in chunks:
        rel = PurePosixPath(chunk["path"])
        if rel.is_absolute() or ".." in rel.parts or any(p.startswith(".") for p in rel.parts):
            continue  # from a node: only plain relative paths
        dest = out_dir.joinpath(*rel.parts)
        data = base64.b64decode(chunk["data"])
        offset = int(chunk["offset"])
        if offset == 0:
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.part-", dir=dest.parent)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, dest)
        else:
            try:
                with open(dest, "r+b") as fh:
                    if fh.seek(0, os.SEEK_END) != offset:
                        continue
                    fh.write(data)
            except FileNotFoundError:
                continue
        mtime = int(chunk["mtime_ns"])
        os.utime(dest, ns=(mtime, mtime))
        written[rel.as_posix()] = (offset + len(data), mtime, chunk["digest"])
        count += len(data)
    return written, count


def first_wall_time(path: Path) -> float | None:
    """The wall time of an event file's first event (its writer's start), or None where the
    file does not begin with a whole TFRecord holding an Event with a wall time."""
    try:
        with open(path, "rb") as fh:
            header = fh.read(12)
            if len(header) < 12:
                return None
            data = fh.read(min(struct.unpack("<Q", header[:8])[0], 1 << 16))
    except OSError:
        return None
    # Event's field 1, wall_time, a double, comes first as protobuf writes fields in order.
    if len(data) >= 9 and data[0] == 0x09:
        return struct.unpack("<d", data[1:9])[0]
    return None


def _epoch(stamp: str | None) -> float | None:
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def attempt_at(wall_time: float | None, rows: Iterable[Mapping[str, Any]]) -> int:
    """The attempt of the run's table ``rows`` (job.json's attempts) that had started by
    ``wall_time``: the latest such; 1 without a table, and the first where none had."""
    started = sorted((t, int(r["attempt"])) for r in rows if (t := _epoch(r.get("started_at"))) is not None)
    if not started:
        return 1
    if wall_time is None:
        return started[-1][1]
    return max((a for t, a in started if t <= wall_time), default=started[0][1])


def ranks_in(spec: Mapping[str, Any], rows: Iterable[Mapping[str, Any]], attempt: int, host: str) -> list[int]:
    """``host``'s ranks in ``attempt``: the attempt's own numbering where the run's table has
    it (a restart renumbers them), else the launch spec's."""
    for row in rows:
        if int(row.get("attempt") or 0) == attempt and isinstance(row.get("ranks"), Mapping):
            return sorted(int(r) for r in row["ranks"].get(host) or [])
    return sorted(int(r["rank"]) for r in spec.get("ranks") or [] if r["host"] == host)


def run_name(path: str, host: str, ranks: list[int], attempt: int | None) -> str:
    """TensorBoard's run for an event file at ``path`` in ``host``'s out folder: its folder,
    then the rank where no part of the folder names one (``host`` where the node had more
    than one), then the attempt where the run restarts (``attempt`` None where it does not)."""
    parts = list(PurePosixPath(path).parent.parts)
    if not any(RANK_FOLDER.fullmatch(p) for p in parts):
        parts.append(vocab.rank_unit(ranks[0]) if len(ranks) == 1 else host)
    return "/".join(parts + ([f"attempt-{attempt}"] if attempt is not None else []))


def layout(event_files: Mapping[str, Iterable[str]],
           names: Mapping[tuple[str, str], str]) -> dict[str, tuple[str, str]]:
    """{path in TensorBoard's folder: (host, path in its out folder)} for every event file
    (``event_files``, by host) that ``names`` names. Two hosts whose files would share a run
    each get their own, the host appended: two writers never merge into one curve."""
    hosts_of: dict[str, set[str]] = {}
    for (host, path), name in names.items():
        hosts_of.setdefault(name, set()).add(host)
    placed: dict[str, tuple[str, str]] = {}
    for host in sorted(event_files):
        for path in sorted(event_files[host]):
            name = names.get((host, path))
            if name is None:
                continue
            if len(hosts_of[name]) > 1:
                name = f"{name}/{host}"
            placed[f"{name}/{PurePosixPath(path).name}"] = (host, path)
    return placed


def link(view: Path, placed: Mapping[str, tuple[str, str]], out_root: Path) -> None:
    """Make ``view`` hold exactly ``placed``: a link per event file to its copy in
    ``out_root``/HOST/, links no longer placed removed."""
    for rel, (host, path) in placed.items():
        dest = view / rel
        target = out_root / host / path
        if dest.is_symlink() and os.readlink(dest) == str(target):
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.link")
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(target)
        os.replace(tmp, dest)
    for root, _, names in os.walk(view):
        for name in names:
            path = Path(root) / name
            if path.is_symlink() and path.relative_to(view).as_posix() not in placed:
                path.unlink()


@dataclass
class Round:
    """What one round found: the run's state and attempt (run_status's fields), the bytes
    brought from each node, the nodes that did not answer, and the files left to the collect."""

    state: str
    attempt: int
    max_attempts: int
    brought: dict[str, int] = field(default_factory=dict)
    unreachable: list[str] = field(default_factory=list)
    skipped: dict[str, list[list[Any]]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def running(self) -> bool:
        """Whether the run may still change: a round that no node answered says nothing of its end."""
        return self.state not in ENDED


class News:
    """What the rounds after ``first`` have to say, each thing once: a new attempt, nodes that
    stop answering, files too large to bring. Each line is (whether it warns, its text)."""

    def __init__(self, first: Round):
        self.attempt, self.unreachable = first.attempt, set(first.unreachable)
        self.skipped: set[tuple[str, str]] = set()

    def __call__(self, done: Round) -> list[tuple[bool, str]]:
        lines = []
        if done.attempt != self.attempt and done.max_attempts > 1:
            lines.append((False, f"attempt {done.attempt} of {done.max_attempts} runs: its curves are named "
                                 f"attempt-{done.attempt}"))
            self.attempt = done.attempt
        if set(done.unreachable) != self.unreachable:
            if done.unreachable:
                lines.append((True, f"not answering: {', '.join(done.unreachable)}; their curves wait"))
            self.unreachable = set(done.unreachable)
        for host, files in sorted(done.skipped.items()):
            for path, size in files:
                if (host, path) not in self.skipped:
                    self.skipped.add((host, path))
                    lines.append((True, f"{host}:{path} ({size / 1e6:.0f} MB) is left to the collect: over "
                                        f"{MAX_FILE_BYTES >> 20} MB"))
        return lines


class LiveSync:
    """A run's out folders on the controller, in step with its nodes (``step``), and their
    event files laid out for TensorBoard in ``view`` (``relink``)."""

    def __init__(self, cluster: Any, run_id: str, view: Path, max_bytes: int = MAX_BYTES,
                 max_file_bytes: int = MAX_FILE_BYTES):
        self.cluster, self.run_id, self.view = cluster, check_run_id(run_id), Path(view)
        self.out_root = Path(cluster.runs_dir) / self.run_id / "out"
        self.max_bytes, self.max_file_bytes = max_bytes, max_file_bytes
        self.spec: dict[str, Any] | None = None
        self.rows: list[dict[str, Any]] = []
        self.digests: dict[str, dict[str, tuple[int, int, str]]] = {}
        self.names: dict[tuple[str, str], str] = {}
        self.rounds, self.bytes = 0, 0

    def variables(self) -> dict[str, Any]:
        hosts = sorted({r["host"] for r in (self.spec or {}).get("ranks") or []})
        # Named as the launch role's internal facts, which the inventory's check never takes for a user's.
        # Until the spec says which files are torchfleet's (the run's store key among them), no
        # node sends a byte.
        return {"launch_run_id": self.run_id, "launch__sync": {
            "spec": self.spec is None, "max_bytes": self.max_bytes if self.spec else 0,
            "max_file_bytes": self.max_file_bytes,
            "own": {h: outputs.own_files(self.spec, h) for h in hosts} if self.spec else {},
            "have": {h: held(self.out_root / h, self.digests.get(h, {})) for h in hosts}}}

    def step(self) -> Round:
        """One round: every node's state of the run, and what changed in its out folder,
        written into runs/RUN/out/HOST/. A node's files are taken only once the run's spec is
        known (the first round asks for it), so that torchfleet's own files stay out."""
        started = time.monotonic()
        answers: dict[str, dict[str, Any]] = {}

        def keep(event: Mapping[str, Any]) -> None:
            data = event.get("event_data") or {}
            if event.get("event") == "runner_on_ok" and str(data.get("task_action", "")).endswith("out_sync"):
                answers[data["host"]] = data.get("res") or {}

        knew_spec = self.spec is not None
        result, _ = self.cluster._run(runner.playbook("sync"), f"sync {self.run_id}", self.variables(), hook=keep)
        unreachable = sorted({f.host for f in result.failures if f.unreachable})
        others = [f for f in result.failures if not f.unreachable]
        if others:
            self.cluster._raise_for(result, "sync")
        found = {h: a for h, a in answers.items() if a.get("found")}
        if self.spec is None:
            self.spec = next((a["spec"] for a in found.values() if a.get("spec")), None)
        fields = run_status.from_view({"nodes": {h: a["run"] for h, a in found.items()}, "unreachable": unreachable})
        self.rows = fields["attempts"] or self.rows
        brought = {}
        if knew_spec:
            for host, answer in sorted(found.items()):
                written, count = apply(self.out_root / host, answer.get("chunks") or [])
                self.digests.setdefault(host, {}).update(written)
                brought[host] = count
        self.rounds += 1
        self.bytes += sum(brought.values())
        state = fields["state"] if found else "unknown"
        return Round(state=state, attempt=fields["attempt"], max_attempts=fields["max_attempts"], brought=brought,
                     unreachable=unreachable, skipped={h: a.get("skipped") or [] for h, a in found.items()
                                                       if a.get("skipped")},
                     seconds=round(time.monotonic() - started, 2))

    def start(self) -> Round:
        """The first round, and where it only learnt the run's spec, a second that brings
        what the nodes hold already: TensorBoard then starts with every curve so far."""
        done = self.step()
        if not done.brought and self.spec is not None:
            done = self.step()
        return done

    def relink(self) -> dict[str, tuple[str, str]]:
        """Lay out the event files held in runs/RUN/out/ in ``view``, one TensorBoard run per
        rank and attempt; returns the layout."""
        restarts = int(((self.spec or {}).get("guard") or {}).get("max_restarts") or 0) > 0
        event_files: dict[str, list[str]] = {}
        if self.out_root.is_dir():
            for host_dir in sorted(p for p in self.out_root.iterdir() if p.is_dir() and not p.name.startswith(".")):
                for path in sorted(host_dir.rglob("*tfevents*")):
                    rel = path.relative_to(host_dir).as_posix()
                    if path.is_file() and not any(part.startswith(".") for part in PurePosixPath(rel).parts):
                        event_files.setdefault(host_dir.name, []).append(rel)
        for host, paths in event_files.items():
            for rel in paths:
                if (host, rel) in self.names:
                    continue
                wall = first_wall_time(self.out_root / host / rel)
                if wall is None:
                    continue  # not one whole record yet
                attempt = attempt_at(wall, self.rows) if restarts else 1
                ranks = ranks_in(self.spec or {}, self.rows, attempt, host)
                self.names[(host, rel)] = run_name(rel, host, ranks, attempt if restarts else None)
        placed = layout(event_files, self.names)
        link(self.view, placed, self.out_root)
        return placed

    def follow(self, interval: float, on_round: Callable[[Round], None] | None = None,
               sleep: Callable[[float], None] = time.sleep) -> Round:
        """Rounds every ``interval`` seconds until the run no longer runs (its last round
        included); each one laid out. Ctrl-C ends it (KeyboardInterrupt goes on)."""
        while True:
            done = self.step()
            self.relink()
            if on_round:
                on_round(done)
            if not done.running:
                return done
            sleep(max(0.0, interval - done.seconds))


def require_run(first: Round, sync: LiveSync) -> None:
    """After the first round: a run that no node holds and the controller has no copy of is
    an error."""
    if first.state == "unknown" and not sync.out_root.is_dir():
        raise TorchfleetError(f"no node that answered holds run {sync.run_id}, and {sync.out_root.parent} does not "
                              "exist; `torchfleet runs` lists the runs")


# TensorBoard's line once it serves: "TensorBoard 2.21.0 at http://localhost:6006/ (Press CTRL+C to quit)".
SERVING = re.compile(r"TensorBoard \S+ at (http://\S+/) ")


@contextmanager
def serve(logdir: Path, host: str = "localhost", port: int = 6006, reload_s: float = 5.0,
          timeout: float = 120.0) -> Iterator[str]:
    """TensorBoard (the `tensorboard` package, in this Python) serving ``logdir``, in a
    session of its own so that a terminal's Ctrl-C reaches only this process, which stops
    it on the way out. Yields its URL once it serves."""
    try:
        import tensorboard  # noqa: F401  # pylint: disable=unused-import
    except ImportError:
        raise TorchfleetError("torchfleet tensorboard needs the tensorboard package in this Python: "
                              "pip install 'torchfleet[tensorboard]'") from None
    log = logdir.parent / "tensorboard.log"
    with open(log, "wb") as out:
        # --load_fast=false: TensorBoard's own Python reader, which reads the links of the layout.
        process = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", host,
                                    "--port", str(port), "--reload_interval", str(reload_s), "--load_fast", "false"],
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            said = log.read_text(errors="replace")
            found = SERVING.search(said)
            if found:
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise TorchfleetError(f"TensorBoard did not start serving {logdir} on {host}:{port}: "
                                      + (said.strip().splitlines() or ["no output"])[-1])
            time.sleep(0.2)
        yield found.group(1)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
