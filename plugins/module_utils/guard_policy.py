"""The guard's decisions: what a unit's exit, silence or lost heartbeat means for the run, how
a report names a unit, and which units are forked rather than started. Pure functions, unit-
tested without a store or a process; the guard's loop (guard.py) acts on what they return.
Shipped beside guard.py into each run's folder (run_vocab.GUARD_SOURCES).
"""

from __future__ import annotations

import os
import re
import shutil

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
except ImportError:  # on a node: imported by guard.py from the run's folder, where run_vocab.py lies beside it
    import run_vocab as vocab


def exit_code(returncode: int) -> int:
    """A child's exit as a shell reports it: a signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def who(unit: dict) -> str:
    """How a report names a unit: rank N (the first of its ranks for torchrun), or its role."""
    if unit.get("role") == "rank" or (unit.get("role") == "torchrun" and unit.get("ranks")):
        ranks = unit.get("ranks") or []
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"
        return f"{label} on {unit['host']}" if unit.get("role") == "rank" else f"torchrun ({label}) on {unit['host']}"
    return f"{unit.get('role', 'unit')} on {unit['host']}"


def abort_for_exit(unit: dict, code: int) -> dict | None:
    """A unit that ended with an error aborts the run; one that succeeded does not."""
    if code == 0:
        return None
    return {"kind": vocab.AbortKind.RANK_FAILED.value, "host": unit["host"], "unit": unit["name"],
            "reason": f"{who(unit)} exited with code {code}"}


def not_listening(unit: dict, timeout: float) -> dict:
    """A listener (the master's rendezvous, the workers' sshd) that did not answer within the
    start's allowance: the units that start after it would wait for ever."""
    listen = unit["listen"]
    return {"kind": vocab.AbortKind.TIMEOUT.value, "host": unit["host"], "unit": unit["name"],
            "reason": f"{who(unit)} did not listen on {listen['host']}:{listen['port']} within {timeout:g}s "
                      f"(launch_master_wait_timeout)"}


def stalled(unit: dict, idle_s: float, stall_timeout: float, progressed: bool = True,
            start_timeout: float = 0) -> dict | None:
    """A unit silent for ``stall_timeout``. Before its first sign of progress it is still
    starting (importing, joining the group): the start's allowance applies, if longer."""
    if stall_timeout <= 0 or idle_s < (stall_timeout if progressed else max(stall_timeout, start_timeout)):
        return None
    what = "made no progress" if progressed else "showed no progress since its start"
    return {"kind": vocab.AbortKind.STALLED.value, "host": unit["host"], "unit": unit["name"],
            "reason": f"{who(unit)} {what} (no output line, no heartbeat) for {int(idle_s)}s "
                      f"(launch_stall_timeout={stall_timeout:g})"}


def lost_units(units: list[dict], seen: dict[int, float], finished: set[int], now: float, node_timeout: float,
               started: float, start_timeout: float) -> list[int]:
    """Units whose heartbeat stood still too long: ``seen`` is when each last moved (a unit
    that never beat counts from the start, with the start's own allowance)."""
    lost = []
    for index in range(len(units)):
        if index in finished:
            continue
        last = seen.get(index)
        if last is None:
            if now - started > start_timeout:
                lost.append(index)
        elif now - last > node_timeout:
            lost.append(index)
    return lost


def peer_wait_over(waited_s: float, moved: dict[int, int], others: list[int], node_timeout: float,
                   poll: float) -> bool:
    """A unit that failed on a lost connection to a peer (Gloo's "connection reset") may not
    be the cause: the peer's guard, or the host's check for silent units, names the cause
    once it is known. The wait ends when every other running unit's guard has beaten twice
    since (none was killed outright, its guard with it), or after the node timeout."""
    if waited_s > node_timeout + 2 * poll:
        return True
    return all(moved.get(i, 0) >= 2 for i in others)


def preload_target(argv: list[str], executable: str) -> tuple[str, str, list[str]] | None:
    """What a unit that is this very interpreter runs: ``("script", PATH, ARGS)`` for ``PYTHON
    SCRIPT ARGS`` (a rank's usual command), ``("module", NAME, ARGS)`` for ``PYTHON -m NAME
    ARGS`` (a torchrun agent). Such a unit is forked from its guard, which imports torch for its
    store anyway, instead of started as a new interpreter that imports it again: about 2 s
    of CPU per unit. Any other form (other options, a wrapper, another Python) starts as it is."""
    if len(argv) < 2:
        return None
    found = shutil.which(argv[0])
    if not found or not executable or os.path.abspath(found) != os.path.abspath(executable):
        return None
    if argv[1] == "-m" and len(argv) > 2 and re.fullmatch(r"[A-Za-z_][\w.]*", argv[2]):
        return ("module", argv[2], argv[3:])
    if not argv[1].startswith("-") and os.path.isfile(argv[1]):
        return ("script", argv[1], argv[2:])
    return None


def next_connect_timeout(current: float, node_timeout: float) -> float:
    """A store host slow to answer (many guards starting at once on a busy master) needs a
    longer wait: a short one that every guard retries only adds to its load. Doubled per
    failure, up to the node timeout."""
    return min(2 * current, max(1.0, node_timeout))


def abort_for_lost(units: list[dict], lost: list[int], node_timeout: float) -> dict:
    hosts = sorted({units[i]["host"] for i in lost})
    return {"kind": vocab.AbortKind.NODE_LOST.value, "host": hosts[0], "hosts": hosts, "unit": units[lost[0]]["name"],
            "reason": f"lost {', '.join(hosts)}: no heartbeat for {node_timeout:g}s (launch_node_timeout); "
                      f"{who(units[lost[0]])} stopped answering"}


# --- restarts (launch_max_restarts) ---------------------------------------------------------------

# An attempt that failed this soon after its start, as the one before it did (the same unit,
# the same exit), is a crash loop: a further attempt would only fail again.
CRASH_LOOP_S = 60.0


def restartable(abort: dict) -> bool:
    return abort.get("kind") in vocab.RESTARTABLE


def node_units(units: list[dict], host: str) -> list[int]:
    """The units of ``host`` that take part in an attempt (services do not)."""
    return [i for i, u in enumerate(units) if u["host"] == host and not u.get("service")]


def plan_attempt(config: dict, hosts: list[str], attempt: int) -> dict:
    """Attempt ``attempt`` on ``hosts``: the nodes keep their order, the first is the master,
    and the ranks are numbered node by node from 0, each unit keeping its count of ranks."""
    nodes = [n for n in config["nodes"] if n["host"] in hosts]
    units, ranks, rank = {}, {}, 0
    for node_rank, node in enumerate(nodes):
        for i in node_units(config["units"], node["host"]):
            count = len(config["units"][i].get("ranks") or [])
            units[str(i)] = {"ranks": list(range(rank, rank + count)), "node_rank": node_rank}
            ranks.setdefault(node["host"], []).extend(range(rank, rank + count))
            rank += count
    return {"attempt": attempt, "nodes": [n["host"] for n in nodes], "master": nodes[0]["host"],
            "master_addr": nodes[0]["address"], "master_port": int(config["master_port"]), "world_size": rank,
            "num_nodes": len(nodes), "units": units, "ranks": ranks}


def unit_attempt(unit: dict, index: int, plan: dict, argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Unit ``index``'s environment and command in ``plan``'s attempt: the variables and
    options its mode named (the unit's ``attempt``: which of the plan's values each takes),
    and the restart count that scripts read."""
    mine = plan["units"][str(index)]
    values = {"rank": mine["ranks"][0] if mine["ranks"] else 0, "node_rank": mine["node_rank"],
              "world_size": plan["world_size"], "num_nodes": plan["num_nodes"],
              "master_addr": plan["master_addr"], "master_port": plan["master_port"]}
    names = unit.get("attempt") or {}
    env = {name: str(values[key]) for name, key in (names.get("env") or {}).items()}
    env["TORCHFLEET_RESTART_COUNT"] = env["TORCHELASTIC_RESTART_COUNT"] = str(plan["attempt"] - 1)
    flags = names.get("argv") or {}
    command = list(argv)
    for i in range(len(command) - 1):
        if command[i] in flags:
            command[i + 1] = str(values[flags[command[i]]])
    return env, command


def crash_loop(attempts: list[dict], window: float = CRASH_LOOP_S) -> str | None:
    """A crash loop, said in one sentence: the last two attempts ended by the same unit's
    same failure, the later one within ``window`` seconds of its start."""
    ended = [a for a in attempts if a.get("cause")]
    if len(ended) < 2:
        return None
    before, last = ended[-2]["cause"], ended[-1]["cause"]
    if last.get("kind") != vocab.AbortKind.RANK_FAILED or before.get("kind") != last.get("kind"):
        return None
    if (before.get("unit"), before.get("reason")) != (last.get("unit"), last.get("reason")):
        return None
    if float(ended[-1].get("seconds") or 0) > window:
        return None
    return (f"crash loop: {last['reason']} in attempts {ended[-2]['attempt']} and {ended[-1]['attempt']}, "
            f"within {window:g}s of its start")


def restart_refused(abort: dict, attempts: list[dict], max_restarts: int, hosts: list[str], min_nodes: int,
                    window: float = CRASH_LOOP_S) -> str | None:
    """Why the run ends with this attempt instead of going on with ``hosts`` (the nodes that
    still answer), or None: another attempt starts."""
    if abort.get("kind") == vocab.AbortKind.STOPPED:
        return "a stop on request is not restarted"
    if not restartable(abort):
        return f"a {abort.get('kind')} is not restarted"
    used = max(0, len(attempts) - 1)
    if used >= max_restarts:
        return f"no restarts left ({used} of {max_restarts} used)"
    loop = crash_loop(attempts, window)
    if loop:
        return loop
    if len(hosts) < max(1, min_nodes):
        return (f"only {len(hosts)} node{'s' if len(hosts) != 1 else ''} answer{'s' if len(hosts) == 1 else ''} "
                f"({', '.join(hosts) or 'none'}); launch_min_nodes={min_nodes}")
    return None
