"""Make the torchfleet package importable from controller-side plugins.

It is installed in the venv that the README sets up; a user who runs ansible-playbook
straight from a checkout gets the copy at the repository root instead.
"""

import sys
from pathlib import Path

try:
    import torchfleet  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[6]))
