"""A download without a checksum is refused unless the user says so, naming the variable."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK = ROOT / "tests" / "playbooks" / "download_checks.yml"
DATASET = {"dataset_source": "url", "dataset_url": "https://example.invalid/fashion",
           "dataset_files": ["a.gz", "b.gz"]}
CONDA = {"python_env_manager": "conda", "python_env_conda_installer_url": "https://example.invalid/Miniforge3.sh"}


def check(**variables):
    args = [str(Path(sys.executable).parent / "ansible-playbook"), str(PLAYBOOK), "-i", "localhost,",
            "-e", json.dumps({"ansible_python_interpreter": sys.executable, **variables})]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))


@pytest.mark.parametrize("variables, message", [
    (DATASET, "dataset_url would fetch a.gz, b.gz with no sha256 in dataset_checksums"),
    ({**DATASET, "dataset_checksums": {"a.gz": "0" * 64}},
     "dataset_url would fetch b.gz with no sha256 in dataset_checksums; add them, or set dataset_allow_unchecked"),
    (CONDA, "python_env_conda_installer_url has no python_env_conda_installer_checksum"),
])
def test_a_url_without_a_checksum_is_refused(variables, message):
    result = check(**variables)
    assert result.returncode != 0
    assert f"host localhost: {message}" in result.stdout.replace("\n", " ").replace("  ", " ")


@pytest.mark.parametrize("variables", [
    {**DATASET, "dataset_checksums": {"a.gz": "0" * 64, "b.gz": "1" * 64}},
    {**DATASET, "dataset_allow_unchecked": True},
    {**CONDA, "python_env_conda_installer_checksum": "sha256:" + "0" * 64},
    {**CONDA, "python_env_conda_allow_unchecked": True},
    # A file on the controller, or a copied dataset, downloads nothing.
    {**CONDA, "python_env_conda_installer_file": "/srv/Miniforge3.sh"},
    {"dataset_source": "copy", "dataset_src": "/srv/fashion"},
])
def test_a_checksum_or_the_opt_out_lets_it_through(variables):
    result = check(**variables)
    assert result.returncode == 0, result.stdout[-2000:]
