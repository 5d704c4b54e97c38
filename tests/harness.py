"""What the cluster test folders share: one local docker-host cluster (its own name and
subnet, apart from every molecule scenario's, so the suite's lanes can run side by side),
made and removed through the API, and a way into its nodes. Run the API/CLI tests and the
fault matrix in one pytest session (test.sh's `pytest`), not as two at once."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import torchfleet

ROOT = Path(__file__).resolve().parents[1]
TORCHFLEET = str(Path(sys.executable).parent / "torchfleet")
# The two docker hosts that the API and CLI tests and the fault matrix share (tests/conftest.py);
# every molecule scenario has a subnet of its own.
# Another name and subnet (TORCHFLEET_TEST_CLUSTER, TORCHFLEET_TEST_CLUSTER_SUBNET) let a
# second suite run beside this one.
NAME = os.environ.get("TORCHFLEET_TEST_CLUSTER", "pytest-cluster")
SUBNET = os.environ.get("TORCHFLEET_TEST_CLUSTER_SUBNET", "172.29.6.0/24")
# The nodes' engines start with the training image, from the seed that scripts/test.sh makes
# (loading it is the molecule default and tls scenarios' test); without a seed, they load it.
ENV = {"TORCHFLEET_STATE_DIR": str(ROOT / ".torchfleet"),
       "TORCHFLEET_ENGINE_SEED": f"{os.environ.get('TORCHFLEET_TEST_PREFIX', 'molecule')}-engine-seed"}


def role_guard() -> dict:
    """A launch's job["guard"] (torchfleet.spec.GUARD_VARIABLES) as the launch role's defaults set it."""
    import yaml

    from torchfleet.spec import GUARD_VARIABLES

    defaults = yaml.safe_load((ROOT / "roles" / "launch" / "defaults" / "main.yml").read_text())
    return {key: defaults[variable] for key, variable in GUARD_VARIABLES.items()}


def launch_values(**over) -> dict:
    """A node's launch variables as the launch_input action hands them to node_input: the
    role's defaults where they matter, overridden by ``over``."""
    base = {"launch_timeout": 0, "launch_poll_interval": 2, "launch_progress_interval": 30,
            "launch_master_wait_timeout": 120, "launch_guard_port": 29510, "launch_guard_poll_interval": 0.5,
            "launch_node_timeout": 10, "launch_stall_timeout": 0, "launch_stop_grace": 5, "launch_keep_runs": 10,
            "launch_omp_num_threads": 0, "launch_collect_out_max_mb": 1024, "launch_mode": "container",
            "launch_node_dir": "/var/lib/torchfleet", "launch_max_restarts": 0, "launch_min_nodes": 0,
            "launch_restart_backoff": 2, "launch_rejoin_timeout": 5}
    return dict(base, **over)


def guard_folder(tmp_path: Path) -> tuple[Path, int]:
    """A run folder holding only what the launch copies there for the guards
    (run_vocab.GUARD_SOURCES), and a free port on 127.0.0.1 for their store."""
    import shutil
    import socket

    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard, run_vocab

    run = tmp_path / "run"
    run.mkdir()
    for name in run_vocab.GUARD_SOURCES:
        shutil.copy(Path(guard.__file__).parent / name, run / name)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return run, free.getsockname()[1]


def mark_folder(items, conftest: str, marker: pytest.MarkDecorator) -> None:
    """Every test in the folder of ``conftest`` (a conftest's ``__file__``) carries ``marker``."""
    for item in items:
        if Path(item.fspath).parent == Path(conftest).parent:
            item.add_marker(marker)


def local_cluster(name: str, subnet: str, inventory_dir: Path, runs_dir: Path, nodes: int = 2,
                  **kwargs) -> torchfleet.Cluster:
    # The nodes load the image from the archive folder they share with this machine.
    cluster, _ = torchfleet.local_up(nodes, name=name, subnet=subnet, inventory_dir=inventory_dir, runs_dir=runs_dir,
                                     env=ENV, extra_vars={"image_archive_on_node": True}, **kwargs)
    return cluster


def local_cluster_down(name: str, inventory_dir: Path, **kwargs) -> None:
    torchfleet.local_down(name=name, inventory_dir=inventory_dir, env=ENV, **kwargs)


def node_sh(cluster: str, node: str, command: str, check: bool = True) -> subprocess.CompletedProcess:
    """A shell command inside one docker host (on the host's own engine)."""
    done = subprocess.run(["docker", "exec", f"{cluster}-{node}", "sh", "-c", command], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise AssertionError(f"{node}: {command}: {done.stderr}")
    return done


def cli(*args, inventory_dir: Path, runs_dir: Path) -> tuple[int, dict]:
    """The torchfleet command to its end: (exit code, its --json document)."""
    env = dict(os.environ, **ENV, TORCHFLEET_RUNS_DIR=str(runs_dir))
    done = subprocess.run([TORCHFLEET, *args], capture_output=True, text=True, env=env, timeout=600)
    assert done.stdout.lstrip().startswith("{"), done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout)
