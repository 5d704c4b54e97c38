"""Issue 59, item 2: the live sync's parts without nodes. The node's side (out_sync: what
changed, only the new bytes of a file that grew) run against real files here, the
controller's (apply, the names per rank and attempt, the layout) against what it wrote, and
TensorBoard itself reading the layout while torch's SummaryWriter, as a user's script
would, writes on the "nodes"."""

import base64
import hashlib
import json
import os
import time
import urllib.request

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.torchfleet.cluster.plugins.module_utils import out_sync
from ansible_collections.torchfleet.cluster.plugins.modules import out_sync as out_sync_module
from torchfleet import livesync

def mnist():
    """The bundled workload, for its event writer: the files the sync brings are the ones it writes."""
    spec = importlib.util.spec_from_file_location("mnist_workload", ROOT / "files" / "workloads" / "mnist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def node_round(run_dir, have, max_bytes=1 << 20, max_file_bytes=1 << 20, own=()):
    files = out_sync.listing(str(run_dir), list(own))
    reads, skipped = out_sync.changes(str(run_dir), files, have, max_bytes, max_file_bytes)
    return out_sync.read_chunks(str(run_dir), reads), skipped


def sync_once(run_dir, copy, digests, **kw):
    """One round, the node's side then the controller's: the bytes moved."""
    chunks, _ = node_round(run_dir, livesync.held(copy, digests), **kw)
    written, count = livesync.apply(copy, chunks)
    digests.update(written)
    return chunks, count


def test_a_file_that_grows_sends_only_its_new_bytes_and_the_copy_equals_the_nodes(tmp_path):
    node, copy, digests = tmp_path / "node", tmp_path / "copy", {}
    (node / "tb").mkdir(parents=True)
    log = node / "tb" / "metrics.csv"
    log.write_bytes(b"step,loss\n" + b"".join(b"%d,0.5\n" % i for i in range(2000)))
    chunks, count = sync_once(node, copy, digests)
    assert count == log.stat().st_size and [c["offset"] for c in chunks] == [0]
    with open(log, "ab") as fh:
        fh.write(b"2000,0.25\n")
    chunks, count = sync_once(node, copy, digests)
    assert [(c["path"], c["offset"]) for c in chunks] == [("tb/metrics.csv", log.stat().st_size - 10)]
    assert count == 10
    assert (copy / "tb" / "metrics.csv").read_bytes() == log.read_bytes()
    assert (copy / "tb" / "metrics.csv").stat().st_mtime_ns == log.stat().st_mtime_ns
    # Nothing changed: nothing moves.
    assert sync_once(node, copy, digests) == ([], 0)


def test_a_rewritten_file_comes_again_whole(tmp_path):
    node, copy, digests = tmp_path / "node", tmp_path / "copy", {}
    node.mkdir()
    (node / "state.json").write_text(json.dumps({"step": 1, "pad": "x" * 5000}))
    sync_once(node, copy, digests)
    # Longer, but its old end changed: not an append.
    (node / "state.json").write_text(json.dumps({"step": 22, "pad": "x" * 5000}))
    chunks, _ = sync_once(node, copy, digests)
    assert [c["offset"] for c in chunks] == [0]
    # The same size, another mtime: again whole.
    (node / "state.json").write_text(json.dumps({"step": 23, "pad": "x" * 5000}))
    os.utime(node / "state.json", ns=(1, 1))
    chunks, _ = sync_once(node, copy, digests)
    assert [c["offset"] for c in chunks] == [0]
    assert (copy / "state.json").read_text() == (node / "state.json").read_text()


def test_a_round_keeps_to_its_budget_smallest_first_and_the_next_goes_on(tmp_path):
    node, copy, digests = tmp_path / "node", tmp_path / "copy", {}
    node.mkdir()
    big, small = os.urandom(3000), os.urandom(500)
    (node / "big.bin").write_bytes(big)
    (node / "small.bin").write_bytes(small)
    chunks, count = sync_once(node, copy, digests, max_bytes=2000)
    assert [(c["path"], c["offset"], len(base64.b64decode(c["data"]))) for c in chunks] == [
        ("small.bin", 0, 500), ("big.bin", 0, 1500)]
    chunks, count = sync_once(node, copy, digests, max_bytes=2000)
    assert [(c["path"], c["offset"]) for c in chunks] == [("big.bin", 1500)] and count == 1500
    assert (copy / "big.bin").read_bytes() == big and (copy / "small.bin").read_bytes() == small


def test_torchfleets_own_files_dot_files_links_and_large_files_stay_on_the_node(tmp_path):
    node = tmp_path / "node"
    (node / "tb").mkdir(parents=True)
    for name in ("rank-0.log", "spec.json", "tb/rank-0.log", "tb/.half.tmp", "huge.bin"):
        (node / name).write_bytes(b"x" * (5000 if name == "huge.bin" else 10))
    (node / "link").symlink_to(node / "tb" / "rank-0.log")
    chunks, skipped = node_round(node, {}, max_file_bytes=4096, own=["rank-*.log", "spec.json"])
    assert [c["path"] for c in chunks] == ["tb/rank-0.log"]
    assert skipped == [["huge.bin", 5000]]


def test_until_the_runs_spec_is_known_no_node_sends_a_byte(tmp_path):
    """The first round learns which files are torchfleet's (the run's store key among them)."""
    class Cluster:
        runs_dir = tmp_path / "runs"

    asked = livesync.LiveSync(Cluster, "r1", tmp_path / "view").variables()["launch__sync"]
    assert asked["spec"] is True and asked["max_bytes"] == 0
    node = tmp_path / "node"
    node.mkdir()
    (node / "store.key").write_bytes(b"k" * 32)
    assert node_round(node, {}, max_bytes=asked["max_bytes"]) == ([], [])


def test_the_controller_takes_only_plain_relative_paths_and_appends_only_where_its_copy_ends(tmp_path):
    def chunk(path, offset, data):
        return {"path": path, "offset": offset, "data": base64.b64encode(data).decode(), "size": 0, "mtime_ns": 10**18,
                "digest": "d"}

    written, count = livesync.apply(tmp_path, [chunk("../escape", 0, b"x"), chunk("/abs", 0, b"x"),
                                               chunk("a/.hidden", 0, b"x"), chunk("a/b", 0, b"abc")])
    assert list(written) == ["a/b"] and count == 3 and not (tmp_path.parent / "escape").exists()
    # A chunk for a copy that is no longer that long (the collect replaced it) is dropped.
    written, count = livesync.apply(tmp_path, [chunk("a/b", 5, b"zz")])
    assert written == {} and (tmp_path / "a" / "b").read_bytes() == b"abc"
    written, _ = livesync.apply(tmp_path, [chunk("a/b", 3, b"de")])
    assert (tmp_path / "a" / "b").read_bytes() == b"abcde" and written["a/b"][0] == 5


def test_the_out_sync_module_reads_the_run_and_its_changes(tmp_path, capsys):
    run = tmp_path / "runs" / "r1"
    (run / "tb").mkdir(parents=True)
    (run / "spec.json").write_text(json.dumps({"run_id": "r1"}))
    (run / "tb" / "events.out.tfevents.1").write_bytes(b"e" * 100)
    args = {"run_dir": str(run), "own": ["spec.json"], "have": {}, "spec": True}
    with patch_module_args(args), pytest.raises(SystemExit):
        out_sync_module.main()
    result = json.loads(capsys.readouterr().out)
    assert result["found"] and result["spec"] == {"run_id": "r1"} and result["files"] == [1, 100]
    (chunk,) = result["chunks"]
    assert chunk["path"] == "tb/events.out.tfevents.1" and base64.b64decode(chunk["data"]) == b"e" * 100
    assert chunk["digest"] == hashlib.sha256(b"e" * 100).hexdigest()
    with patch_module_args(dict(args, run_dir=str(tmp_path / "runs" / "r2"))), pytest.raises(SystemExit):
        out_sync_module.main()
    assert json.loads(capsys.readouterr().out)["found"] is False


# --- names: one curve per rank and attempt -------------------------------------------------------

ROWS = [{"attempt": 1, "started_at": "2027-01-15T08:00:00.000000Z", "nodes": ["node-1", "node-2", "node-3"],
         "ranks": {"node-1": [0], "node-2": [1], "node-3": [2]}},
        {"attempt": 2, "started_at": "2027-01-15T08:10:00.000000Z", "nodes": ["node-2", "node-3"],
         "ranks": {"node-2": [0], "node-3": [1]}}]
SPEC = {"ranks": [{"rank": 0, "host": "node-1"}, {"rank": 1, "host": "node-2"}, {"rank": 2, "host": "node-3"},
                  {"rank": 3, "host": "node-3"}]}


def test_an_event_file_belongs_to_the_attempt_that_had_started_when_its_writer_began():
    at = 1_800_000_000.0  # 2027-01-15T08:00:00Z, attempt 1's start
    assert livesync.attempt_at(at + 5, ROWS) == 1
    assert livesync.attempt_at(at + 600 + 5, ROWS) == 2
    assert livesync.attempt_at(at - 3, ROWS) == 1  # a clock a little behind: the first
    assert livesync.attempt_at(at + 5, []) == 1


def test_a_restart_renumbers_ranks_and_each_rank_and_attempt_is_a_run_of_its_own():
    # The lost master's place taken: node-2's rank is 1 in attempt 1 and 0 in attempt 2.
    assert livesync.ranks_in(SPEC, ROWS, 1, "node-2") == [1]
    assert livesync.ranks_in(SPEC, ROWS, 2, "node-2") == [0]
    assert livesync.ranks_in(SPEC, [], 1, "node-3") == [2, 3]
    # The bundled workload's folder names the rank already; a user's SummaryWriter at the top
    # of the out folder gets the node's rank, or the node where it had more than one.
    assert livesync.run_name("tensorboard/rank-0/events.x", "node-2", [0], 2) == "tensorboard/rank-0/attempt-2"
    assert livesync.run_name("events.x", "node-2", [1], 1) == "rank-1/attempt-1"
    assert livesync.run_name("runs/Jan15/events.x", "node-3", [2, 3], None) == "runs/Jan15/node-3"
    # Two nodes' writers that would share a run get one each.
    names = {("node-1", "tb/events.a"): "tb/rank-0", ("node-2", "tb/events.b"): "tb/rank-0",
             ("node-3", "tensorboard/rank-2/events.c"): "tensorboard/rank-2"}
    placed = livesync.layout({"node-1": ["tb/events.a"], "node-2": ["tb/events.b"],
                              "node-3": ["tensorboard/rank-2/events.c"]}, names)
    assert placed == {"tb/rank-0/node-1/events.a": ("node-1", "tb/events.a"),
                      "tb/rank-0/node-2/events.b": ("node-2", "tb/events.b"),
                      "tensorboard/rank-2/events.c": ("node-3", "tensorboard/rank-2/events.c")}


def test_tensorboard_shows_each_rank_and_attempt_and_the_curve_grows_as_the_sync_brings_it(tmp_path):
    """SummaryWriter on two nodes, in each rank's folder as the bundled workload writes; node-2
    writes again after a restart, in the same folder, as rank 0. TensorBoard (the package)
    serves the layout."""
    from torch.utils.tensorboard import SummaryWriter

    node = {h: tmp_path / "nodes" / h for h in ("node-1", "node-2")}
    writers = {(host, 1): SummaryWriter(str(node[host] / "tensorboard" / f"rank-{rank}"))
               for host, rank in (("node-1", 0), ("node-2", 1))}
    for step in range(1, 6):
        for w in writers.values():
            w.add_scalar("train/loss", 1.0 / step, step)
    started = {1: time.time() - 60, 2: time.time() + 1}
    rows = [{"attempt": k, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime(t)),
             "ranks": {"node-1": [0], "node-2": [1]} if k == 1 else {"node-2": [0]}} for k, t in started.items()]
    time.sleep(1.2)
    writers[("node-2", 2)] = SummaryWriter(str(node["node-2"] / "tensorboard" / "rank-0"))
    for step in range(5, 8):
        writers[("node-2", 2)].add_scalar("train/loss", 0.1, step)
    for w in writers.values():
        w.flush()

    class Cluster:
        runs_dir = tmp_path / "runs"

    sync = livesync.LiveSync(Cluster, "r1", tmp_path / "view")
    sync.spec, sync.rows = {"ranks": [{"rank": 0, "host": "node-1"}, {"rank": 1, "host": "node-2"}],
                            "guard": {"max_restarts": 1}}, rows
    digests = {h: {} for h in node}

    def bring():
        for host, folder in node.items():
            copy = sync.out_root / host
            chunks, _ = node_round(folder, livesync.held(copy, digests[host]))
            digests[host].update(livesync.apply(copy, chunks)[0])
        return sync.relink()

    bring()
    with livesync.serve(sync.view, port=0, reload_s=1) as url:
        def points(run):
            query = urllib.request.quote(run, safe="")
            with urllib.request.urlopen(f"{url}data/plugin/scalars/scalars?run={query}&tag=train/loss") as answer:
                return [p[1] for p in json.loads(answer.read())]

        def runs(until):
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with urllib.request.urlopen(f"{url}data/runs") as answer:
                    found = sorted(json.loads(answer.read()))
                if until(found):
                    return found
                time.sleep(0.5)
            return found

        expected = ["tensorboard/rank-0/attempt-1", "tensorboard/rank-0/attempt-2", "tensorboard/rank-1/attempt-1"]
        assert runs(lambda found: found == expected) == expected
        assert points("tensorboard/rank-0/attempt-2") == [5, 6, 7]
        assert points("tensorboard/rank-1/attempt-1") == [1, 2, 3, 4, 5]
        for step in range(6, 10):
            writers[("node-1", 1)].add_scalar("train/loss", 1.0 / step, step)
        writers[("node-1", 1)].flush()
        bring()
        deadline = time.monotonic() + 30
        while points("tensorboard/rank-0/attempt-1") != list(range(1, 10)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert points("tensorboard/rank-0/attempt-1") == list(range(1, 10))
    for w in writers.values():
        w.close()
