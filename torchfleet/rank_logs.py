"""What the launch modes and the report both make of a run's logs and of a launcher's exit:
a log's last lines, and each rank's end where one process ran several ranks (torchrun's
agent, mpirun). Apart from the report, which asks the modes for their ranks' ends."""

from __future__ import annotations

from typing import Any, Mapping


def launcher_finals(launcher: Mapping[str, Any], ranks: list[int], failed: Mapping[int, int],
                    others_stopped: bool) -> list[dict[str, Any]]:
    """Per-rank final states where one launcher process (a mode's: LaunchMode.finals) ran ``ranks``: all 0 when
    it exited 0; else ``failed`` (index in ``ranks`` -> exit code) are blamed and the rest,
    which have no exit code of their own, count as stopped when ``others_stopped``."""
    finals = []
    for index, rank in enumerate(ranks):
        final = {"rank": rank, "started_at": launcher.get("started_at"), "finished_at": launcher.get("finished_at")}
        if launcher.get("exit_code") == 0:
            final.update(exit_code=0, stopped_by_torchfleet=False)
        elif index in failed:
            final.update(exit_code=failed[index], stopped_by_torchfleet=False)
        else:
            final.update(exit_code=None, stopped_by_torchfleet=others_stopped,
                         stopped_because=launcher.get("stopped_because") if others_stopped else None)
        finals.append(final)
    return finals


def tail(log: str, lines: int = 15) -> str:
    return "\n".join(log.rstrip().splitlines()[-lines:])
