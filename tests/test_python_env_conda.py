"""python_env's conda path end to end; it needs a Miniforge installer and a conda channel."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INSTALLER = os.environ.get("TORCHFLEET_MINIFORGE_INSTALLER", "")

pytestmark = pytest.mark.skipif(
    not INSTALLER,
    reason="conda cannot be exercised here: no Miniforge installer and no conda channel can be reached; "
           "set TORCHFLEET_MINIFORGE_INSTALLER=/path/to/Miniforge3-Linux-x86_64.sh where they can",
)


def play(prefix, env_file):
    args = [str(Path(sys.executable).parent / "ansible-playbook"), str(ROOT / "tests/playbooks/python_env_conda.yml"),
            "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
            "-e", f"python_env_conda_installer_file={INSTALLER}", "-e", f"python_env_conda_prefix={prefix}",
            "-e", f"python_env_conda_environment_file={env_file}"]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))


def test_conda_env_from_the_installer_in_batch_mode_and_idempotent(tmp_path):
    env_file = tmp_path / "environment.yml"
    env_file.write_text("name: torchfleet\nchannels: [conda-forge]\ndependencies: [python=3.11, numpy]\n")
    prefix = tmp_path / "miniforge"
    first = play(prefix, env_file)
    assert first.returncode == 0, first.stdout + first.stderr
    python = prefix / "envs" / "torchfleet" / "bin" / "python"
    done = subprocess.run([str(python), "-c", "import numpy; print(numpy.__version__)"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    second = play(prefix, env_file)
    assert "changed=0" in second.stdout
