"""launch_mode process: one bare process per rank in the node's own Python (launch_python),
under its guard, no container runtime."""

from __future__ import annotations

from typing import Any, Mapping

from torchfleet.modes import register
from torchfleet.modes.container import PerRank


class Process(PerRank):
    name = "process"

    def runtime(self, job: Mapping[str, Any]) -> str:
        return "process"


register(Process())
