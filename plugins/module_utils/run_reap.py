"""Node-side: the exited rank containers of a node that came back, removed without a controller.

A guard runs inside its unit's container, so it cannot remove that container itself. A
container node's start (run_state, state=present with containers) starts this script from
the run's folder (run_vocab.SCRIPT_SOURCES), in a session of its own, once per run and node:

    python3 run_reap.py RUN_DIR NAME...

NAME... are the containers it started there, each one unit of the run's guard.json. It sleeps
on their guards' locks (run_vocab.guard_lock) until every one of those guards has ended. Where
a guard's record says that its node stood still for a node timeout and came back
(``stood_still``: a frozen node thawed, a VM resumed), the run went on or ended without that
node, and the controller that followed the run could not reach it to collect it: after the
run's ``stop_wait`` (the time a controller's end gives the units), it does what that end
would have done with those units' containers, still there and exited: each one's log into
the run's folder (rank_docker.remove), then the container removed. A later `torchfleet
collect` reads those units from their guards' records and logs. Every other run (whose
nodes all answered) is left to the controller's collect, as before.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import rank_docker
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
    from ansible_collections.torchfleet.cluster.plugins.module_utils.run_end import Failed, Node
except ImportError:  # on a node: run as a script from the run's folder, where its modules lie beside it
    import rank_docker
    import run_vocab as vocab
    from run_end import Failed, Node

# How often it looks for a guard's lock before the guard has made it (its container starting).
LOCK_POLL_S = 0.5


def spawn(run_dir: str, names: list[str]) -> None:
    """Start this script from the run's folder for ``names``, detached: it outlives the start."""
    if not names:
        return
    subprocess.Popen([sys.executable, os.path.join(run_dir, vocab.REAP_SOURCE), run_dir, *names],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)


def await_guards(run_dir: str, indexes: list[int], start_timeout: float) -> None:
    """Until every guard of ``indexes`` has ended: its lock taken once it is free. A guard that
    never made its lock within the start's allowance never ran."""
    for index in indexes:
        path = os.path.join(run_dir, vocab.guard_lock(index))
        deadline = time.monotonic() + start_timeout
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(LOCK_POLL_S)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # held by the guard for its whole life
        finally:
            os.close(fd)


def came_back(run_dir: str, indexes: list[int]) -> list[int]:
    """The units whose guard ended after its node stood still and came back."""
    found = []
    for index in indexes:
        try:
            with open(os.path.join(run_dir, vocab.guard_record(index))) as fh:
                record = json.load(fh)
        except (OSError, ValueError):
            continue
        if record.get("stood_still"):
            found.append(index)
    return found


def reap(run_dir: str, names: list[str], docker: str = "docker") -> list[str]:
    """The whole wait and removal (the module docstring); the names of the containers removed."""
    with open(os.path.join(run_dir, vocab.GUARD_CONFIG)) as fh:
        config = json.load(fh)
    indexes = [i for i, unit in enumerate(config["units"]) if unit["name"] in names]
    await_guards(run_dir, indexes, float(config.get("start_timeout", 120)))
    back = came_back(run_dir, indexes)
    if not back:
        return []
    time.sleep(float(config.get("stop_wait", 0)))
    mine = {config["units"][i]["name"] for i in back}
    labels = {"torchfleet.run": config["run_id"]}
    node = Node()
    left = [c for c in rank_docker.find(node, docker, labels) if c["name"] in mine and not c["running"]]
    if not left:
        return []  # the controller's end came for them meanwhile
    return [c["name"] for c in rank_docker.remove(node, docker, left, labels, 0, log_dir=run_dir)]


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        sys.stderr.write("usage: run_reap.py RUN_DIR NAME...\n")
        return 2
    try:
        reap(argv[0], argv[1:])
    except (Failed, OSError, ValueError, KeyError):
        return 1  # a controller's collect or down removed them meanwhile, or the folder went with its run
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
