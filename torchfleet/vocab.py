"""The run's vocabulary for the package: the collection's module_utils/run_vocab.py, the one
file that names a run's files, store keys, states and abort kinds (it ships to the nodes
beside the guard).

Inside Ansible (the action plugins that call into this package) the collection loader
imports it, and this is that very module. In the CLI's own process no collection loader
runs, so it is loaded from the collection in the checkout this package runs from.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab
except ImportError:
    _NAME = "torchfleet._run_vocab"
    _PATH = (Path(__file__).resolve().parents[1] / "collections" / "ansible_collections" / "torchfleet" / "cluster"
             / "plugins" / "module_utils" / "run_vocab.py")
    _spec = importlib.util.spec_from_file_location(_NAME, _PATH)
    run_vocab = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = run_vocab  # the enums' pickling and dataclasses look their module up
    _spec.loader.exec_module(run_vocab)

__all__ = ["run_vocab"]
