"""A run folder for real guards on this machine, as the launch leaves it on a node."""

import secrets
import shutil
import socket
from pathlib import Path

from ansible_collections.torchfleet.cluster.plugins.module_utils import guard, run_vocab


def store_key(run: Path, key: str = "") -> str:
    """The run's store key in the folder ``run``, as the launch writes it (0600); a new one
    unless ``key`` is given (the nodes of one run share it)."""
    key = key or secrets.token_hex(32)
    path = run / run_vocab.STORE_KEY
    path.write_text(key)
    path.chmod(0o600)
    return key


def guard_folder(tmp_path: Path, key: str = "") -> tuple[Path, int]:
    """A run folder holding only what the launch writes there for the guards
    (run_vocab.GUARD_SOURCES and the run's store key), and a free port on 127.0.0.1 for their store."""
    run = tmp_path / "run"
    run.mkdir()
    for name in run_vocab.GUARD_SOURCES:
        shutil.copy(Path(guard.__file__).parent / name, run / name)
    store_key(run, key)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return run, free.getsockname()[1]
