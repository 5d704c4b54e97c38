import gzip
import struct

from torchfleet.idx import FILES, make_dataset


def test_files_have_the_real_idx_layout(tmp_path):
    make_dataset(tmp_path, train=50, test=10)
    with gzip.open(tmp_path / FILES["train"][0]) as fh:
        magic, count, rows, cols = struct.unpack(">IIII", fh.read(16))
        assert (magic, count, rows, cols) == (0x00000803, 50, 28, 28)
        assert len(fh.read()) == 50 * 28 * 28
    with gzip.open(tmp_path / FILES["test"][1]) as fh:
        magic, count = struct.unpack(">II", fh.read(8))
        labels = fh.read()
        assert (magic, count, len(labels)) == (0x00000801, 10, 10)
        assert max(labels) <= 9


def test_generation_is_byte_stable(tmp_path):
    a = (make_dataset(tmp_path / "a", 20, 5) / FILES["train"][0]).read_bytes()
    b = (make_dataset(tmp_path / "b", 20, 5) / FILES["train"][0]).read_bytes()
    assert a == b
