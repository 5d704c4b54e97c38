"""Where a user's runs and the controller's state go: $TORCHFLEET_RUNS_DIR and
$TORCHFLEET_STATE_DIR, else runs/ and .torchfleet/ in the working folder (a checkout's root,
or the folder that torchfleet or ansible-playbook runs in). Never inside an installed
package: the CLI, the API and the roles' shared defaults all ask here."""

from __future__ import annotations

import os
from pathlib import Path

RUNS_ENV = "TORCHFLEET_RUNS_DIR"
STATE_ENV = "TORCHFLEET_STATE_DIR"


def runs_dir(workdir: str | Path) -> Path:
    """Each run's logs, checksums, model and summary come back into a folder of its own here."""
    return Path(os.environ.get(RUNS_ENV) or Path(workdir) / "runs").resolve()


def state_dir(workdir: str | Path) -> Path:
    """The controller's state: SSH keys, the cluster CA, the image archive, the dataset."""
    return Path(os.environ.get(STATE_ENV) or Path(workdir) / ".torchfleet").resolve()


FOLDERS = {"runs": runs_dir, "state": state_dir, "work": lambda workdir: Path(workdir).resolve()}
