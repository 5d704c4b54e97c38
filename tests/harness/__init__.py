"""What the tests share, by kind: ``harness.inputs`` (a role's variables as its defaults give
them), ``harness.guards`` (a run folder for real guards on this machine), and
``harness.cluster`` (the local docker-host cluster the cluster test folders share, and a way
into its nodes). Unit tests import nothing of the cluster's."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
