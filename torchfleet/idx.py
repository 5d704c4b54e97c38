"""FashionMNIST-format IDX files: write a small synthetic set, read the real layout.

The real files cannot be downloaded here, so tests make small ones with the same
gzip'd IDX layout (magic 0x00000803 for images, 0x00000801 for labels).
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}


def write_idx(path: Path, array: np.ndarray) -> None:
    dtype_code = 0x08  # unsigned byte
    header = struct.pack(">HBB", 0, dtype_code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    # mtime=0 keeps the bytes, and so Ansible's checksums, stable across re-generation.
    with open(path, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as fh:
        fh.write(header + array.astype(np.uint8).tobytes())


def synthetic(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Ten learnable classes: each label draws a bar at its own place, plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=count, dtype=np.uint8)
    images = rng.integers(0, 60, size=(count, 28, 28), dtype=np.uint8)
    for i, label in enumerate(labels):
        row = 2 + int(label) * 2
        images[i, row : row + 3, 4:24] = 220
    return images, labels


def make_dataset(directory: str | Path, train: int = 1920, test: int = 320, seed: int = 0) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for split, count, offset in (("train", train, 0), ("test", test, 1)):
        images, labels = synthetic(count, seed + offset)
        image_file, label_file = FILES[split]
        write_idx(directory / image_file, images)
        write_idx(directory / label_file, labels)
    return directory


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Write a small synthetic FashionMNIST-format dataset.")
    parser.add_argument("directory")
    parser.add_argument("--train", type=int, default=1920)
    parser.add_argument("--test", type=int, default=320)
    args = parser.parse_args()
    print(make_dataset(args.directory, args.train, args.test))
