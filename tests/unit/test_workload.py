"""Packing a workload on the controller: what ships, and that the same files give the same bytes."""

import ast
import os
import tarfile
import types
from pathlib import Path

import pytest

from torchfleet.errors import InventoryError, WorkloadError
from torchfleet.workload import IGNORE_FILE, entrypoint_argv, manifest, pack


def tree(root, files):
    """Write ``files`` ({relative path: text}) under ``root``; returns ``root``."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def members(archive):
    with tarfile.open(archive) as tar:
        return {m.name: m for m in tar.getmembers()}


def test_single_file_ships_as_its_basename(tmp_path):
    script = tree(tmp_path, {"sub/train.py": "print(1)\n"}) / "sub" / "train.py"
    assert manifest(script) == ["train.py"]


def test_git_pycache_pyc_and_the_ignore_file_stay_home(tmp_path):
    tree(tmp_path, {
        "train.py": "", "pkg/mod.py": "",
        ".git/config": "", "pkg/.git": "gitdir: elsewhere\n",
        "__pycache__/train.cpython-311.pyc": "", "pkg/__pycache__/x.py": "", "pkg/old.pyc": "",
        IGNORE_FILE: "# nothing\n",
        "pkg/" + IGNORE_FILE: "",
    })
    # Only the top ignore file is metadata; one further down is just a file.
    assert manifest(tmp_path) == ["pkg/.torchfleetignore", "pkg/mod.py", "train.py"]


def test_basename_patterns_match_at_any_depth(tmp_path):
    tree(tmp_path, {"train.py": "", "a.ckpt": "", "deep/er/b.ckpt": "", "deep/notes.txt": "", "#draft.py": "",
                    IGNORE_FILE: "\n#draft.py\n*.ckpt\nnotes.txt\n"})
    # "#draft.py" is a comment, not a pattern: the file ships.
    assert manifest(tmp_path) == ["#draft.py", "train.py"]


def test_patterns_with_a_slash_match_from_the_root(tmp_path):
    tree(tmp_path, {"train.py": "", "data/raw/x.bin": "", "data/keep.py": "", "sub/data/raw/y.bin": "",
                    "top.log": "", "sub/top.log": "",
                    IGNORE_FILE: "data/raw\n/top.log\n"})
    assert manifest(tmp_path) == ["data/keep.py", "sub/data/raw/y.bin", "sub/top.log", "train.py"]


def test_a_trailing_slash_matches_folders_only(tmp_path):
    tree(tmp_path, {"train.py": "", "out/model.pt": "", "sub/out/x.pt": "", "logs": "a file named logs",
                    IGNORE_FILE: "out/\nlogs/\n"})
    assert manifest(tmp_path) == ["logs", "train.py"]


def test_negated_patterns_are_refused(tmp_path):
    tree(tmp_path, {"train.py": "", IGNORE_FILE: "*.py\n!train.py\n"})
    with pytest.raises(WorkloadError, match=r"\.torchfleetignore:2: .*not supported") as info:
        manifest(tmp_path)
    assert info.value.variable == "launch_workload"
    assert isinstance(info.value, InventoryError)


def test_missing_path_is_refused(tmp_path):
    with pytest.raises(WorkloadError, match="nope is not a file or folder"):
        manifest(tmp_path / "nope")


def test_a_folder_with_nothing_to_ship_is_refused(tmp_path):
    tree(tmp_path, {"__pycache__/a.pyc": "", "skip.txt": "", IGNORE_FILE: "skip.txt\n"})
    with pytest.raises(WorkloadError, match="no file to ship"):
        manifest(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(WorkloadError, match="empty has no file to ship"):
        manifest(empty)


def test_links_inside_the_folder_are_followed(tmp_path):
    work = tree(tmp_path / "work", {"train.py": "real\n", "lib/util.py": ""})
    (work / "alias.py").symlink_to("train.py")
    (work / "lib2").symlink_to("lib")
    assert manifest(work) == ["alias.py", "lib/util.py", "lib2/util.py", "train.py"]
    with tarfile.open(pack(work, tmp_path / "w.tar")["archive"]) as tar:
        assert tar.getmember("alias.py").isfile()
        assert tar.extractfile("alias.py").read() == b"real\n"


def test_a_link_out_of_the_folder_is_refused_unless_ignored(tmp_path):
    outside = tree(tmp_path, {"secret.txt": "x"}) / "secret.txt"
    work = tree(tmp_path / "work", {"train.py": ""})
    (work / "data").symlink_to(outside)
    with pytest.raises(WorkloadError, match=f"{work / 'data'} points outside"):
        manifest(work)
    (work / IGNORE_FILE).write_text("data\n")
    assert manifest(work) == ["train.py"]


def test_a_link_back_up_the_tree_is_refused(tmp_path):
    tree(tmp_path, {"train.py": ""})
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "up").symlink_to("..")
    with pytest.raises(WorkloadError, match="loops"):
        manifest(tmp_path)


@pytest.fixture
def work(tmp_path):
    return tree(tmp_path / "work", {"train.py": "print('train')\n", "pkg/__init__.py": "", "pkg/run.py": "x = 1\n"})


def test_pack_writes_a_normalised_tar(work, tmp_path):
    (work / "train.py").chmod(0o700)
    (work / "pkg" / "run.py").chmod(0o600)
    packed = pack(work, tmp_path / "w.tar")
    assert packed["files"] == ["pkg/__init__.py", "pkg/run.py", "train.py"]
    assert packed["bytes"] == os.path.getsize(tmp_path / "w.tar")
    with tarfile.open(packed["archive"]) as tar:
        got = tar.getmembers()
        assert tar.extractfile("train.py").read() == b"print('train')\n"
    assert [m.name for m in got] == packed["files"]
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in got} == {(0, 0, 0, "", "")}
    assert {m.name: m.mode for m in got} == {"pkg/__init__.py": 0o644, "pkg/run.py": 0o644, "train.py": 0o755}


def test_same_files_same_checksum_whatever_the_mtime(work, tmp_path):
    first = pack(work, tmp_path / "a.tar")
    os.utime(work / "train.py", (1, 1))
    second = pack(work, tmp_path / "b.tar")
    assert second["sha256"] == first["sha256"]
    assert (tmp_path / "a.tar").read_bytes() == (tmp_path / "b.tar").read_bytes()


def test_changed_content_or_mode_changes_the_checksum(work, tmp_path):
    before = pack(work, tmp_path / "w.tar")["sha256"]
    (work / "pkg" / "run.py").write_text("x = 2\n")
    edited = pack(work, tmp_path / "w.tar")["sha256"]
    assert edited != before
    (work / "train.py").chmod(0o755)
    assert pack(work, tmp_path / "w.tar")["sha256"] != edited


def test_a_deleted_file_leaves_the_archive(work, tmp_path):
    before = pack(work, tmp_path / "w.tar")["sha256"]
    (work / "pkg" / "run.py").unlink()
    after = pack(work, tmp_path / "w.tar")
    assert after["sha256"] != before
    assert set(members(tmp_path / "w.tar")) == {"pkg/__init__.py", "train.py"}


def test_pack_replaces_dest_and_leaves_no_temp_file(work, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "w.tar").write_text("stale")
    pack(work, out / "w.tar")
    assert [p.name for p in out.iterdir()] == ["w.tar"]
    assert set(members(out / "w.tar")) == {"pkg/__init__.py", "pkg/run.py", "train.py"}


def test_an_archive_inside_the_workload_is_refused(work):
    with pytest.raises(WorkloadError, match="must not be inside"):
        pack(work, work / "w.tar")
    assert not (work / "w.tar").exists()


def test_a_single_file_workload_packs_as_its_basename(tmp_path):
    script = tree(tmp_path, {"src/mnist.py": "m\n"}) / "src" / "mnist.py"
    assert set(members(pack(script, tmp_path / "w.tar")["archive"])) == {"mnist.py"}


@pytest.mark.parametrize("entrypoint, argv", [
    ("train.py", ["py3", "train.py"]),
    ("./pkg/run.py", ["py3", "pkg/run.py"]),
    ("-m pkg.run", ["py3", "-m", "pkg.run"]),
    ("-m  train ", ["py3", "-m", "train"]),
])
def test_entrypoint_forms(work, entrypoint, argv):
    assert entrypoint_argv(work, entrypoint, "py3") == argv


def test_a_single_file_needs_no_entrypoint(tmp_path):
    script = tree(tmp_path, {"mnist.py": ""}) / "mnist.py"
    assert entrypoint_argv(script, "", "/opt/py/bin/python") == ["/opt/py/bin/python", "mnist.py"]


def test_a_folder_needs_an_entrypoint(work):
    with pytest.raises(WorkloadError, match="set launch_entrypoint") as info:
        entrypoint_argv(work, "", "python3")
    assert info.value.variable == "launch_entrypoint"


def test_an_unknown_script_lists_what_there_is(tmp_path):
    tree(tmp_path, {**{f"f{i:02}.txt": "" for i in range(12)}, "main.py": ""})
    with pytest.raises(WorkloadError) as info:
        entrypoint_argv(tmp_path, "trian.py", "python3")
    assert info.value.variable == "launch_entrypoint"
    msg = str(info.value)
    assert "launch_entrypoint 'trian.py'" in msg
    # Scripts come first, then ten at most in all.
    assert "it has: main.py, f00.txt, " in msg
    assert "f08.txt and 3 more" in msg
    assert "f09.txt" not in msg


@pytest.mark.parametrize("entrypoint", ["-m", "-m pkg.", "-m 1pkg", "-m pkg run", "-m pkg/run"])
def test_bad_module_names_are_refused(work, entrypoint):
    with pytest.raises(WorkloadError, match="not a dotted module name") as info:
        entrypoint_argv(work, entrypoint, "python3")
    assert info.value.variable == "launch_entrypoint"


# The bundled workload's checkpoint helpers (files/workloads/mnist.py). mnist.py imports torch
# at its top and this venv need not have it: these definitions are run as they are, alone.
MNIST = Path(__file__).resolve().parents[2] / "files" / "workloads" / "mnist.py"
CHECKPOINT_HELPERS = ("CHECKPOINT_RE", "TEMP_RE", "RESTART_VARIABLES", "checkpoint_name", "complete_checkpoints",
                      "stale_files", "resume_position", "restart_counts", "attempt")


@pytest.fixture(scope="module")
def mnist():
    tree = ast.parse(MNIST.read_text())
    keep = [node for node in tree.body
            if getattr(node, "name", None) in CHECKPOINT_HELPERS
            or (isinstance(node, ast.Assign) and {t.id for t in node.targets} & set(CHECKPOINT_HELPERS))]
    assert len(keep) == len(CHECKPOINT_HELPERS)
    module = types.ModuleType("mnist_checkpoints")
    exec("import re\n", module.__dict__)
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(MNIST), "exec"), module.__dict__)
    return module


def test_the_newest_complete_checkpoint_comes_first(mnist):
    names = [mnist.checkpoint_name(s) for s in (8, 120, 16)] + [
        ".checkpoint-000000200.pt.tmp-node-1-42",  # a writer's temp file, complete or not
        "checkpoint-200.pt", "checkpoint-000000300.pt.bak", "notes.txt", "checkpoint-00000040.pt",
    ]
    assert mnist.complete_checkpoints(names + [mnist.checkpoint_name(10**9)]) == [
        "checkpoint-1000000000.pt", "checkpoint-000000120.pt", "checkpoint-000000016.pt", "checkpoint-000000008.pt"]
    assert mnist.complete_checkpoints([]) == []


def test_a_save_removes_older_checkpoints_and_dead_writers_temp_files(mnist):
    own = ".checkpoint-000000024.pt.tmp-node-1-7"
    names = [mnist.checkpoint_name(s) for s in (8, 16, 24, 4)] + [
        own, ".checkpoint-000000020.pt.tmp-node-2-9", "model.pt", ".hidden"]
    # Another node's temp file of the same step (a folder the nodes share) is its write in progress: kept.
    assert mnist.stale_files(names + [".checkpoint-000000024.pt.tmp-node-3-5"], 2, own) == [
        "checkpoint-000000008.pt", "checkpoint-000000004.pt", ".checkpoint-000000020.pt.tmp-node-2-9"]
    assert mnist.stale_files(names[:2], 2, own) == []


@pytest.mark.parametrize("saved, world, expected", [
    # The same world: exactly where it stopped, or the next epoch after a closing checkpoint.
    ({"epoch": 2, "batch": 3, "world_size": 2, "batch_size": 16}, 2, (2, 3, True)),
    ({"epoch": 1, "batch": 10, "world_size": 2, "batch_size": 16}, 2, (2, 0, True)),
    # 3 ranks did 5 steps (240 samples); 2 ranks redo what does not fill a step (7 steps, 224).
    ({"epoch": 1, "batch": 5, "world_size": 3, "batch_size": 16}, 2, (1, 7, False)),
    # More than the epoch holds: the next epoch.
    ({"epoch": 1, "batch": 6, "world_size": 2, "batch_size": 16}, 1, (2, 0, False)),
])
def test_resume_position(mnist, saved, world, expected):
    assert mnist.resume_position(saved, 10, world, 16) == expected


def test_the_attempt_is_torchfleets_restart_count_then_torchruns(mnist):
    assert mnist.attempt({}) == 0
    assert mnist.attempt({"TORCHELASTIC_RESTART_COUNT": "2"}) == 2
    both = {"TORCHELASTIC_RESTART_COUNT": "0", "TORCHFLEET_RESTART_COUNT": "3"}
    assert mnist.attempt(both) == 3
    assert list(mnist.restart_counts(both)) == ["TORCHFLEET_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"]
    assert mnist.restart_counts({"TORCHFLEET_RESTART_COUNT": ""}) == {}
