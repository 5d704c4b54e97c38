"""The bundled workload's TensorBoard event files, read back by TensorBoard's own reader."""

import ast
import types
from pathlib import Path

import pytest

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
from tensorboard.backend.event_processing import event_file_loader  # noqa: E402

MNIST = Path(__file__).resolve().parents[2] / "files" / "workloads" / "mnist.py"
WRITER = ("_crc32c_table", "_CRC32C", "crc32c", "_masked_crc", "_varint", "_field_bytes", "_event", "EventWriter")


def _writer():
    """The writer's own definitions from mnist.py, which imports torch at its top (this venv
    has no torch): the rest of the file is left out, the writer's code is run as it is."""
    tree = ast.parse(MNIST.read_text())
    keep = [node for node in tree.body
            if getattr(node, "name", None) in WRITER
            or (isinstance(node, ast.Assign) and {t.id for t in node.targets} & set(WRITER))]
    assert {getattr(n, "name", None) or n.targets[0].id for n in keep} == set(WRITER)
    module = types.ModuleType("mnist_events")
    exec("import os, socket, struct, time\n", module.__dict__)
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(MNIST), "exec"), module.__dict__)
    return module


def test_crc32c_is_castagnoli():
    mnist = _writer()
    # RFC 3720's check value, and a vector from its appendix B.4 (32 bytes of zeros).
    assert mnist.crc32c(b"123456789") == 0xE3069283
    assert mnist.crc32c(bytes(32)) == 0x8A9136AA


def test_tensorboard_reads_every_scalar_back_by_step(tmp_path):
    mnist = _writer()
    writer = mnist.EventWriter(str(tmp_path / "rank-0"))
    losses = [2.30, 1.75, 0.5, 0.125]
    for step, loss in enumerate(losses):
        writer.scalar("train/loss", loss, step)
    writer.scalar("test/accuracy", 0.75, 10_000_000_000)  # an int64 beyond 32 bits
    writer.close()

    path = Path(writer.path)
    assert path.name.startswith("events.out.tfevents.") and path.parent.name == "rank-0"
    # The raw loader checks both CRCs of every record; the first record names the format.
    events = list(event_file_loader.EventFileLoader(str(path)).Load())
    assert events[0].file_version == "brain.Event:2"
    assert len(events) == 1 + len(losses) + 1

    acc = event_accumulator.EventAccumulator(str(tmp_path / "rank-0"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["test/accuracy", "train/loss"]
    read = acc.Scalars("train/loss")
    assert [e.step for e in read] == [0, 1, 2, 3]
    assert [e.value for e in read] == pytest.approx(losses)
    assert [(e.step, e.value) for e in acc.Scalars("test/accuracy")] == [(10_000_000_000, 0.75)]
    assert all(e.wall_time > 1.7e9 for e in read)


def test_a_corrupted_record_is_refused_by_tensorboard(tmp_path):
    mnist = _writer()
    writer = mnist.EventWriter(str(tmp_path))
    writer.scalar("train/loss", 1.0, 1)
    writer.close()
    data = bytearray(Path(writer.path).read_bytes())
    # The last record's data: its float's last byte.
    data[-5] ^= 0xFF
    Path(writer.path).write_bytes(bytes(data))
    loaded = list(event_file_loader.EventFileLoader(writer.path).Load())
    # The loader stops at a record whose CRC does not match: only the first is read.
    assert len(loaded) == 1 and loaded[0].file_version == "brain.Event:2"
