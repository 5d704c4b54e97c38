"""What comes back of the ranks' out folders: which files are torchfleet's (torchfleet.outputs),
what the node packs under the limit (module_utils.out_folder), and how the controller puts the
archive in place."""

import hashlib
import io
import os
import tarfile

import pytest
from test_spec import RUN_ID, build

from ansible_collections.torchfleet.cluster.plugins.module_utils import out_folder
from torchfleet import inputs, outputs, report, spec

# What the nodes' modules and guards write in a run folder, by mode and host (the spec's
# prefix is tfjob; node-1 is the master with ranks 0 and 1, node-2 has rank 2).
C = f"tfjob-{RUN_ID}"
TORCHFLEET_FILES = {
    ("container", None, "node-1"): ["spec.json", "guard.py", "run_vocab.py", "__pycache__/run_vocab.cpython-311.pyc",
                                    "guard_policy.py", "guard_child.py", "__pycache__/guard_policy.cpython-311.pyc",
                                    "guard.json", "guard-0.json", "guard-1.json", "job.json",
                                    "rank-0.log", "rank-1.log", "checksum-rank-0.txt", "checksum-rank-1.txt",
                                    "model.pt", f"heartbeat-{C}-rank0", f"heartbeat-{C}-rank1", "stop",
                                    "job.json.tmp4242", "guard.json.tmp"],
    ("container", None, "node-2"): ["spec.json", "guard.py", "run_vocab.py", "guard.json", "guard-2.json", "rank-2.log",
                                    "checksum-rank-2.txt", f"heartbeat-{C}-rank2"],
    ("process", None, "node-2"): ["spec.json", "guard.py", "run_vocab.py", "guard.json", "guard-2.json", "rank-2.log",
                                  "rank-2.meta",
                                  "rank-2.pid", "rank-2.exit", "rank-2.stopped", "rank-2.secret", "rank-2.unit",
                                  "checksum-rank-2.txt", "heartbeat-rank-2", "rank-2.meta.tmp"],
    ("torchrun", "process", "node-1"): ["spec.json", "guard.py", "guard.json", "guard-0.json", "job.json",
                                        "torchrun.log", "torchrun.meta", "torchrun.pid", "torchrun.exit",
                                        "heartbeat-torchrun", "rank-0.log", "checksum-rank-0.txt", "model.pt"],
    ("mpirun", None, "node-1"): ["spec.json", "guard.py", "guard.json", "guard-0.json", "job.json", "mpirun.log",
                                 "node.env", "node.secret.env", "model.pt", "checksum-rank-0.txt"],
    ("mpirun", None, "node-2"): ["spec.json", "guard.py", "guard.json", "guard-1.json", "sshd.log", "node.env",
                                 "node.secret.env", "checksum-rank-2.txt"],
}
# What a user's script may write there; a name torchfleet uses at the top is the user's below it.
USER_FILES = ["metrics.json", "tensorboard/rank-0/events.out.tfevents.1700000000.node-1.7.0", "sub/__pycache__/x.pyc",
              "ckpt/epoch-1/rank-0.log", "ckpt/model.pt", "stop-early.txt", "rank-9.log"]


def write(root, files, content=lambda path: path.encode()):
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content(rel))


@pytest.mark.parametrize("mode, runtime, host", list(TORCHFLEET_FILES), ids=lambda v: str(v))
def test_only_the_users_files_of_a_run_folder_count_as_its_out_folder(tmp_path, mode, runtime, host):
    write(tmp_path, TORCHFLEET_FILES[(mode, runtime, host)] + USER_FILES)
    own = outputs.own_files(spec.redacted(build(mode, runtime)), host)
    assert [path for path, _ in out_folder.listing(str(tmp_path), own)] == sorted(USER_FILES)


def test_a_model_on_a_node_other_than_the_master_is_the_users():
    assert "model.pt" not in outputs.own_files(spec.redacted(build("container")), "node-2")


def test_links_are_neither_listed_nor_followed(tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("x")
    run = tmp_path / "run"
    write(run, ["a.txt"])
    (run / "to-secret").symlink_to(tmp_path / "outside" / "secret")
    (run / "to-folder").symlink_to(tmp_path / "outside")
    assert out_folder.listing(str(run), []) == [("a.txt", len(b"a.txt"))]


def test_the_smallest_files_are_taken_first_within_the_limit():
    files = [("ckpt/big.pt", 700), ("events", 10), ("metrics.json", 100), ("ckpt/mid.pt", 300), ("zero", 0)]
    taken, left = out_folder.pick(files, 420)
    assert taken == [("ckpt/mid.pt", 300), ("events", 10), ("metrics.json", 100), ("zero", 0)]
    assert left == [("ckpt/big.pt", 700)]
    assert out_folder.pick(files, 0) == ([], sorted(files))
    assert out_folder.pick(files, 10_000) == (sorted(files), [])


def _out(paths):
    return [(path, f"out/{path}") for path in paths]


def test_an_archive_arrives_whole_with_every_byte(tmp_path):
    node, run = tmp_path / "node", tmp_path / "runs" / "r1"
    out = run / "out" / "node-1"
    run.mkdir(parents=True)
    blob = os.urandom(3 << 20)
    write(node, ["metrics.json", "nested/deep/data.bin", "tensorboard/rank-0/events.out.tfevents.1.h", "rank-0.log",
                 "job.json", "model.pt"], lambda rel: blob if rel.endswith((".bin", ".pt")) else rel.encode() * 100)
    archive = tmp_path / "out.tar.gz"
    paths = ["metrics.json", "nested/deep/data.bin", "tensorboard/rank-0/events.out.tfevents.1.h", "gone.txt"]
    members = [("rank-0.log", "run/rank-0.log"), ("job.json", "run/job.json"), ("model.pt", "run/model.pt")] + _out(paths)
    assert out_folder.archive(str(node), members, str(archive)) == [m[1] for m in members[:6]]
    # The master's job.json of a restarted run comes back under the node's own name.
    wanted = {"rank-0.log": "rank-0.log", "job.json": "job-node-1.json", "model.pt": "model.pt"}
    assert outputs.unpack(archive, run, wanted, out) == (["job-node-1.json", "model.pt", "rank-0.log"],
                                                         sorted(paths[:3]))
    for rel in paths[:3]:
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == hashlib.sha256((node / rel).read_bytes()).hexdigest()
    assert (run / "model.pt").read_bytes() == blob and (run / "job-node-1.json").read_bytes() == b"job.json" * 100
    # Nothing but the files and the folder is left beside them.
    assert sorted(os.listdir(run)) == ["job-node-1.json", "model.pt", "out", "rank-0.log"]
    assert os.listdir(out.parent) == ["node-1"]


def test_a_second_collect_replaces_the_folder_whole_and_one_without_out_files_keeps_it(tmp_path):
    out = tmp_path / "out" / "node-1"
    write(out, ["old.txt"])
    node = tmp_path / "node"
    write(node, ["new.txt", "rank-0.log"])
    out_folder.archive(str(node), _out(["new.txt"]), str(tmp_path / "a.tar.gz"))
    outputs.unpack(tmp_path / "a.tar.gz", tmp_path, {}, out)
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]
    assert os.listdir(out.parent) == ["node-1"]
    out_folder.archive(str(node), [("rank-0.log", "run/rank-0.log")], str(tmp_path / "b.tar.gz"))
    assert outputs.unpack(tmp_path / "b.tar.gz", tmp_path, {"rank-0.log": "rank-0.log"}, out) == (["rank-0.log"], None)
    assert sorted(p.name for p in out.iterdir()) == ["new.txt"]


def test_an_archive_from_a_node_cannot_write_outside_its_folders_or_leave_links(tmp_path):
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, data in (("out/../../escape.txt", b"x"), ("/abs.txt", b"x"), ("out/fine/ok.txt", b"ok"),
                           ("run/../escape.txt", b"x"), ("run/sub/rank-0.log", b"x"), ("run/unasked.txt", b"x"),
                           ("run/rank-0.log", b"log"), ("top.txt", b"x")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name in ("out/link", "run/model.pt"):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(link)
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    out = run / "out" / "node-1"
    assert outputs.unpack(archive, run, {"rank-0.log": "rank-0.log", "model.pt": "model.pt"}, out) == \
        (["rank-0.log"], ["fine/ok.txt"])
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() or p.is_symlink()) == \
        ["evil.tar.gz", "runs/r1/out/node-1/fine/ok.txt", "runs/r1/rank-0.log"]


def test_a_broken_archive_leaves_the_last_folder_and_no_partial_one(tmp_path):
    out = tmp_path / "out" / "node-1"
    write(out, ["kept.txt"])
    (tmp_path / "broken.tar.gz").write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(tarfile.TarError):
        outputs.unpack(tmp_path / "broken.tar.gz", tmp_path, {}, out)
    assert os.listdir(out.parent) == ["node-1"] and os.listdir(out) == ["kept.txt"]


def test_the_message_names_the_node_its_ranks_what_stayed_and_how_to_get_it():
    plans = outputs.collect_plans(spec.redacted(build("container")), ["node-1", "node-2"])
    found = {"total": [5, 12 << 20], "taken": [3, 1 << 20], "left": [2, 11 << 20],
             "left_largest": [["ckpt/b.pt", 8 << 20], ["ckpt/a.pt", 3 << 20]]}
    entry = outputs.record("node-1", plans["node-1"], "/var/lib/tfnode/runs/x", "/runs/x/out/node-1", found, 2)
    assert entry["ranks"] == [0, 1] and entry["left_files"] == 2 and entry["left_bytes"] == 11 << 20
    message = entry["message"]
    assert message.startswith("node-1 (ranks 0, 1): 2 of the out folder's 5 files (11.0 MB of 12.0 MB) stayed")
    assert "launch_collect_out_max_mb=2" in message and "ckpt/b.pt (8.0 MB)" in message
    assert "node-1:/var/lib/tfnode/runs/x" in message
    assert message.endswith(f"torchfleet collect {RUN_ID} -e launch_collect_out_max_mb=12")
    whole = dict(found, taken=[5, 12 << 20], left=[0, 0], left_largest=[])
    assert outputs.record("node-1", plans["node-1"], "/n", "/o", whole, 1024)["message"] is None


def test_each_nodes_plan_is_what_the_spec_says_of_that_node_alone():
    """collect_plans: computed once from the spec, each node's task carries only its own part."""
    run_spec = spec.redacted(build("container"))
    plans = outputs.collect_plans(run_spec, ["node-1", "node-2", "node-9"])
    for host in ("node-1", "node-2"):
        assert plans[host]["wanted"] == dict(report.run_files(run_spec, host))
        assert plans[host]["own"] == outputs.own_files(run_spec, host)
        assert plans[host]["ranks"] == sorted(r["rank"] for r in run_spec["ranks"] if r["host"] == host)
    assert "model.pt" in plans["node-1"]["wanted"] and "model.pt" not in plans["node-2"]["wanted"]
    # A node that holds nothing of the run: nothing to bring, but its end still comes from the spec.
    assert plans["node-9"]["wanted"] == {} and plans["node-9"]["ranks"] == []
    assert plans["node-9"]["end"] == report.run_end(run_spec) and plans["node-9"]["run_id"] == run_spec["run_id"]


@pytest.mark.parametrize("value, ok", [(-1, False), (0, True), (1024, True), (1 << 20, True), ((1 << 20) + 1, False),
                                       ("lots", False)])
def test_the_limit_is_checked_with_the_launchs_other_numbers(value, ok):
    (name, low, high, why), = [r for r in inputs.RANGES if r[0] == "launch_collect_out_max_mb"]
    bad = inputs.out_of_range([{"name": name, "value": value, "min": low, "max": high, "why": why}])
    assert bad == ([] if ok else [{"variable": name, "message": f"{name}={value} must be between 0 and 1048576 "
                                                                "(0: bring no out folder back)"}])


def test_a_collect_that_brings_nothing_new_places_nothing(tmp_path):
    """A repeated collect of a run that ended: the same files again change nothing on the
    controller (collect_run then reports no change); one changed file is placed anew."""
    node, run = tmp_path / "node", tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    out = run / "out" / "node-1"
    write(node, ["metrics.json", "rank-0.log"])
    members = [("rank-0.log", "run/rank-0.log")] + _out(["metrics.json"])
    out_folder.archive(str(node), members, str(tmp_path / "a.tar.gz"))
    wanted = {"rank-0.log": "rank-0.log"}
    assert outputs.unpack(tmp_path / "a.tar.gz", run, wanted, out) == (["rank-0.log"], ["metrics.json"])
    before = {p: p.stat().st_ino for p in (run / "rank-0.log", out / "metrics.json")}
    assert outputs.unpack(tmp_path / "a.tar.gz", run, wanted, out) == ([], [])
    assert {p: p.stat().st_ino for p in before} == before  # not even rewritten
    (node / "metrics.json").write_text("a new line\n")
    out_folder.archive(str(node), members, str(tmp_path / "b.tar.gz"))
    assert outputs.unpack(tmp_path / "b.tar.gz", run, wanted, out) == ([], ["metrics.json"])
    assert (out / "metrics.json").read_text() == "a new line\n"
