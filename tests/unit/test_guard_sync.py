"""The checkpoint sync between the guards of a new attempt, through a real TCPStore on
loopback: one thread per node, each with its own folder and its own client, as the guards."""

import hashlib
import os
import threading
import time
from datetime import timedelta

import pytest

from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_store, guard_sync

TCPStore = pytest.importorskip("torch.distributed").TCPStore
HOSTS = ["node-1", "node-2", "node-3"]
OLD, NEW = 1_700_000_000_000_000_000, 1_700_000_100_123_456_789  # mtimes in ns, NEW with a sub-second part


@pytest.fixture
def store():
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    yield master


def write(folder, name, data: bytes, mtime_ns: int):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def digest(folder):
    """Every file under a folder, dot-files included: its bytes' hash and its mtime."""
    found = {}
    for path in sorted(folder.rglob("*")) if folder.exists() else []:
        if path.is_file():
            found[path.relative_to(folder).as_posix()] = (hashlib.sha256(path.read_bytes()).hexdigest(),
                                                          path.stat().st_mtime_ns)
    return found


KEY = b"the run's key"


def run_sync(master, folders: dict, attempt=1, timeout=10.0, hosts=HOSTS, rejected=None):
    """sync() on one thread per host in ``folders``, each with its own client of ``master``,
    signed as a guard's is; returns each host's result, or the exception it raised, and the
    lines it said."""
    results, lines = {}, {h: [] for h in folders}

    def node(host):
        client = guard_store.SignedStore(TCPStore("127.0.0.1", master.port, is_master=False,
                                                  timeout=timedelta(seconds=10)), KEY, rejected or (lambda *_: None))
        try:
            results[host] = guard_sync.sync(client, attempt, host, hosts, str(folders[host]), timeout,
                                            say=lines[host].append)
        except Exception as exc:  # noqa: BLE001 - the test reads which one
            results[host] = exc

    threads = [threading.Thread(target=node, args=(h,)) for h in folders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results, lines


def test_the_newest_folder_reaches_the_others_byte_for_byte(store, tmp_path):
    one, two, three = tmp_path / "one", tmp_path / "two", tmp_path / "three"  # three does not exist
    write(one, "checkpoint-000000010.pt", b"old step 10", OLD)
    write(one, "notes.txt", b"only on node-1", OLD)
    write(two, "checkpoint-000000010.pt", b"step 10, as node-2 holds it", OLD + 5)
    write(two, "checkpoint-000000020.pt", os.urandom(3000), NEW)
    write(two, "shards/model-0.bin", os.urandom(100), OLD)
    write(two, ".checkpoint-000000030.pt.tmp-node-2-99", b"half-writ", NEW + 10**9)
    write(two, ".partial/checkpoint-000000030.pt", b"in a dot folder", NEW + 10**9)
    before = digest(two)

    results, lines = run_sync(store, {"node-1": one, "node-2": two, "node-3": three})

    assert {r["source"] for r in results.values()} == {"node-2"}, results
    assert digest(two) == before
    shared = {k: v for k, v in before.items() if not any(part.startswith(".") for part in k.split("/"))}
    assert digest(three) == shared
    assert digest(one) == {**shared, "notes.txt": digest(one)["notes.txt"]}
    assert (one / "notes.txt").read_bytes() == b"only on node-1"
    assert sorted(results["node-3"]["copied"]) == ["checkpoint-000000010.pt", "checkpoint-000000020.pt",
                                                   "shards/model-0.bin"]
    assert results["node-3"]["bytes"] == len(b"step 10, as node-2 holds it") + 3000 + 100
    assert results["node-2"]["copied"] == [] and results["node-2"]["bytes"] == 0
    assert "received 3 file(s)" in lines["node-3"][0] and "from node-2" in lines["node-3"][0]
    assert "sent to node-1, node-3" in lines["node-2"][0]
    for folder in (one, three):  # the temporary files of the copy are gone
        assert not [p for p in folder.rglob(".*")]


def test_a_node_already_up_to_date_copies_nothing(store, tmp_path):
    folders = {h: tmp_path / h for h in HOSTS}
    write(folders["node-1"], "checkpoint-000000005.pt", b"five", NEW)
    first, _ = run_sync(store, folders, attempt=1)
    assert sorted(first["node-3"]["copied"]) == ["checkpoint-000000005.pt"]
    stamps = {h: digest(f) for h, f in folders.items()}

    second, lines = run_sync(store, folders, attempt=2)

    assert all(r["copied"] == [] and r["bytes"] == 0 and r["source"] == "node-1" for r in second.values()), second
    assert {h: digest(f) for h, f in folders.items()} == stamps
    assert "up to date with node-1" in lines["node-2"][0]


def test_ties_go_to_the_first_node_in_order(store, tmp_path):
    folders = {h: tmp_path / h for h in HOSTS}
    write(folders["node-2"], "checkpoint-000000001.pt", b"node-2's", NEW)
    write(folders["node-3"], "checkpoint-000000001.pt", b"node-3's copy", NEW)
    results, _ = run_sync(store, folders)
    assert results["node-1"]["source"] == "node-2"
    assert (folders["node-3"] / "checkpoint-000000001.pt").read_bytes() == b"node-2's"


def test_a_file_of_many_chunks_arrives_whole_and_leaves_no_chunk_in_the_store(store, tmp_path):
    folders = {h: tmp_path / h for h in HOSTS}
    big = os.urandom(2 * guard_sync.CHUNK + guard_sync.CHUNK // 3)  # three chunks, the last one short
    many = os.urandom(guard_sync.CHUNK * (guard_sync.WINDOW + 2))  # more chunks than the store may hold at once
    write(folders["node-3"], "checkpoint-000000040.pt", big, NEW + 1)
    write(folders["node-3"], "zz-last.pt", many, NEW)
    write(folders["node-1"], "zz-last.pt", many, NEW)  # node-1 needs only the first file, node-2 both

    results, _ = run_sync(store, folders)

    assert results["node-1"]["copied"] == ["checkpoint-000000040.pt"] and results["node-1"]["bytes"] == len(big)
    assert results["node-2"]["bytes"] == len(big) + len(many)
    for host in ("node-1", "node-2"):
        assert digest(folders[host]) == digest(folders["node-3"])
    chunks = -(-len(big) // guard_sync.CHUNK) + len(many) // guard_sync.CHUNK
    assert store.add(guard_sync.count_key(1, "sent"), 0) == chunks  # each chunk crossed the store once
    assert not any(store.check([guard_sync.chunk_key(1, seq)]) for seq in range(chunks))


def test_a_host_that_never_calls_is_named(store, tmp_path):
    folders = {h: tmp_path / h for h in HOSTS[:2]}
    write(folders["node-1"], "checkpoint-000000001.pt", b"one", NEW)
    started = time.monotonic()
    results, _ = run_sync(store, folders, timeout=1.0)
    assert time.monotonic() - started < 10
    for host in folders:
        assert isinstance(results[host], (TimeoutError, guard_sync.SyncError)), results
        assert "node-3 did not publish its manifest" in str(results[host])
    assert not (folders["node-2"] / "checkpoint-000000001.pt").exists()


def test_a_changed_source_file_fails_every_host_with_the_reason(store, tmp_path, monkeypatch):
    folders = {h: tmp_path / h for h in HOSTS}
    write(folders["node-1"], "checkpoint-000000001.pt", b"one", NEW)
    # node-1's file changes after its manifest was read: a writer is still at work there.
    real = guard_sync.manifest

    def stale(folder):
        found = real(folder)
        if folder == str(folders["node-1"]):
            write(folders["node-1"], "checkpoint-000000001.pt", b"one, rewritten", NEW + 1)
        return found

    monkeypatch.setattr(guard_sync, "manifest", stale)
    results, _ = run_sync(store, folders, timeout=2.0)
    assert str(results["node-1"]) == "checkpoint-000000001.pt changed during the checkpoint sync"
    for host in ("node-2", "node-3"):
        assert isinstance(results[host], guard_sync.PeerError)
        assert str(results[host]) == ("checkpoint sync of attempt 1 failed on node-1: "
                                      "checkpoint-000000001.pt changed during the checkpoint sync")
    assert not (folders["node-2"] / "checkpoint-000000001.pt").exists()


def test_a_forged_failure_and_a_forged_part_are_ignored_and_told(store, tmp_path):
    """Values without the run's MAC, set by anyone who reaches the store before the copy: a
    failure that would end every host's copy, and the first part of the file that the copy
    needs. The copy goes on, the file arrives byte for byte, and the rejection is told."""
    folders = {h: tmp_path / h for h in HOSTS}
    data = os.urandom(1000)
    write(folders["node-1"], "checkpoint-000000001.pt", data, NEW)
    store.set(guard_sync.failed_key(1), "node-1: forged")
    store.set(guard_sync.chunk_key(1, 0), b"0" * 64 + b"forged part")
    rejected = []

    results, _ = run_sync(store, folders, rejected=lambda name, value: rejected.append(name))

    assert all(not isinstance(r, Exception) for r in results.values()), results
    for host in ("node-2", "node-3"):
        assert (folders[host] / "checkpoint-000000001.pt").read_bytes() == data
    assert guard_sync.failed_key(1) in rejected


def test_no_checkpoint_anywhere_copies_nothing(store, tmp_path):
    folders = {h: tmp_path / h for h in HOSTS}
    folders["node-1"].mkdir()
    write(folders["node-2"], ".checkpoint-000000001.pt.tmp-1", b"never finished", NEW)
    results, lines = run_sync(store, folders)
    assert all(r == {"source": None, "copied": [], "bytes": 0, "seconds": r["seconds"]} for r in results.values()), results
    assert not folders["node-3"].exists()
    assert "nothing to copy" in lines["node-1"][0]


def test_the_manifest_skips_dot_names_and_links(tmp_path):
    write(tmp_path, "a.pt", b"1234", OLD)
    write(tmp_path, "sub/b.pt", b"12", NEW)
    write(tmp_path, ".tmp/c.pt", b"x", NEW)
    write(tmp_path, "sub/.d.pt.tmp", b"x", NEW)
    (tmp_path / "link.pt").symlink_to(tmp_path / "a.pt")
    assert guard_sync.manifest(str(tmp_path)) == {"a.pt": [4, OLD], "sub/b.pt": [2, NEW]}
    assert guard_sync.manifest(str(tmp_path / "missing")) == {}
