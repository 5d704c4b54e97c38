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
    return abort.get("kind") in vocab.RESTARTABLE and not abort.get("final")


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
    if abort.get("final"):
        return f"{abort.get('reason')}: not restarted"
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


# --- the loop's and the host's decisions -----------------------------------------------------------

def stop_requested(read_stop, host: str) -> dict | None:
    """The abort a stop file asks for (torchfleet stop), or None where there is none: ``read_stop()``
    gives the file's text, "" where it cannot be read, None where there is no file."""
    why = read_stop()
    if why is None:
        return None
    return {"kind": vocab.AbortKind.STOPPED.value, "host": host, "unit": None,
            "reason": why.strip() or "stopped on request (torchfleet stop)"}


def signalled(unit: dict, signum: int) -> dict:
    """The abort of a guard that got SIGTERM, SIGINT or SIGHUP."""
    return {"kind": vocab.AbortKind.STOPPED.value, "host": unit["host"], "unit": unit["name"],
            "reason": f"{who(unit)} got signal {signum}"}


def parent_gone(unit: dict, parent: int) -> dict:
    """The abort of a guard whose parent, the scheduler's process that holds its unit (a Slurm
    step's shell), ended: the step was cancelled or its slurmstepd is gone. The unit failed,
    and the run ends there, since the scheduler no longer holds it (``final``)."""
    cause = f"its scheduler's step ended (the process that held it, pid {parent}, is gone)"
    return {"kind": vocab.AbortKind.RANK_FAILED.value, "host": unit["host"], "unit": unit["name"], "final": True,
            "cause": cause, "reason": f"{who(unit)}: {cause}"}


def store_limit(connected: bool, node_timeout: float, start_timeout: float) -> float:
    """How long a guard may go without the store: until the store first answers, the start's
    allowance."""
    return node_timeout if connected else start_timeout


def store_lost(where: dict, silent_s: float, node_timeout: float) -> dict:
    """The abort of a guard that lost the store on ``where`` (a store candidate) for ``silent_s``."""
    return {"kind": vocab.AbortKind.NODE_LOST.value, "host": where["node"], "hosts": [where["node"]], "unit": None,
            "store_lost": True,
            "reason": f"lost the supervision store on {where['node']} ({where['host']}:{where['port']}) for "
                      f"{int(silent_s)}s (launch_node_timeout={node_timeout:g}): the master node stopped answering"}


def moved(host: str, node: str) -> dict:
    """The abort of a master that stood still and was replaced by ``node``."""
    return {"kind": vocab.AbortKind.MOVED.value, "host": host, "unit": None, "moved_to": node,
            "reason": f"{host} stood still as the master and was lost; the run went on with {node} as its master"}


def move_on_s(node_timeout: float) -> float:
    """How long the guards take, at most, to lose a silent store (a node timeout) and to find
    the next one (as long again, and a margin for a starved node)."""
    return 2 * node_timeout + 5


def back_from_standing_still(still_gap: float, since_end: float, node_timeout: float) -> bool:
    """Whether a host that stood still for ``still_gap`` seconds, back ``since_end`` seconds ago,
    was gone as long as the other guards take to lose its store and move on (the units it
    now finds lost were lost to its own absence), and is back just now: within the node
    timeout that their fresh allowance takes to run out (and as much again for a starved host)."""
    return still_gap >= move_on_s(node_timeout) and since_end <= move_on_s(node_timeout)


def inferred_successor(candidates: list[dict], gen: int, own_host: str, min_nodes: int,
                       members: set[str]) -> str | None:
    """The node that the other guards, having lost this host's store, make their master: the
    next in node order among the nodes of the attempt (``members``: only their guards move,
    and only to one of them), where enough of them are left for launch_min_nodes."""
    others = failover_order(candidates, gen, own_host, members)
    if others and len(others) >= min_nodes:
        return candidates[others[0]]["node"]
    return None


def failover_order(candidates: list[dict], gen: int, lost: str, members: set[str]) -> list[int]:
    """The candidates (their indexes) that a guard which lost the store on ``lost`` tries, in
    node order from the one after it, round to those before it (a store that moved on may
    move again): those on a node of the attempt (``members``), since no guard outside it hosts."""
    order = list(range(gen + 1, len(candidates))) + list(range(gen))
    return [g for g in order if candidates[g]["node"] != lost and candidates[g]["node"] in members]


def search_order(candidates: list[dict], gen: int, own_host: str) -> list[int]:
    """Where a guard looks for the run's store once it lost it (it stood still, was cut off,
    or hosts a store that too few nodes reach): the one it knew first, since a node that comes
    back finds it there where the others never moved, then every other in node order; never
    a store on its own node, which is the one it is leaving."""
    order = [gen] + [g for g in range(len(candidates)) if g != gen]
    return [g for g in order if candidates[g]["node"] != own_host]


def own_failure(abort: dict, index: int) -> bool:
    """Whether ``abort`` is unit ``index``'s own failure: only that unit ended on its own account;
    any other was stopped because of it."""
    return abort.get("index") == index and abort.get("kind") == vocab.AbortKind.RANK_FAILED


def attempt_end(restarts_left: bool, abort: dict, member: bool, is_host: bool) -> str:
    """What a guard does once its attempt ended with ``abort``: ``final`` (the run ends), or
    with another attempt possible, ``follow`` (this node stood still as the master and the
    run moved on: it rejoins there), ``failover`` (the store was lost), ``decide`` (the host:
    which nodes go on), or ``await`` (the host's decision)."""
    if restarts_left and member and abort.get("kind") == vocab.AbortKind.MOVED and abort.get("moved_to"):
        return "follow"
    if not restarts_left or not restartable(abort) or not member:
        return "final"
    if abort.get("store_lost"):
        return "failover"
    return "decide" if is_host else "await"


def attempt_entry(attempt: int, ranks: list[int], code: int, abort: dict, own: bool, state: dict) -> dict:
    """A unit's row for the attempt that ``abort`` ended, with what its record said of the
    unit's end (taken out of ``state``, which keeps the record's running fields)."""
    entry = {"attempt": attempt, "ranks": ranks, "exit_code": code,
             "state": (vocab.UnitState.EXITED if own else vocab.UnitState.STOPPED).value,
             "why": None if own else abort["reason"]}
    for key in ("abort_seen_at", "sigterm_at", "sigkill_at", "child_exit_code", "not_started"):
        if key in state:
            entry[key] = state.pop(key)
    return entry


def final_unit_state(attempts: list[dict]) -> tuple[str, str | None]:
    """How a unit ended in the run, from its rows of the attempts: its last one's state and why."""
    last = (attempts or [{}])[-1]
    return last.get("state") or vocab.UnitState.STOPPED.value, last.get("why")


def still_ending(members: set[int], exits: dict, moved_at: dict, started: float, now: float, poll: float,
                 grace: float) -> list[int]:
    """The units whose end the host still waits for: no exit yet, and a guard that beat within
    two polls (a stopped unit's guard beats through its grace), counted from ``started`` for
    one not seen to beat."""
    return [i for i in sorted(members) if i not in exits
            and now - moved_at.get(i, started) < 2 * poll + 1 + (grace if i in moved_at else 0)]


def answering_hosts(nodes: list[dict], units: list[dict], beating: set[int]) -> list[str]:
    """The nodes whose every unit of an attempt has a guard that beats."""
    return [n["host"] for n in nodes if all(i in beating for i in node_units(units, n["host"]))]


def beats_again(looks: dict[int, list[int]], index: int, count: int) -> bool:
    """Whether unit ``index``'s heartbeat counter, now ``count``, moved in two separate looks
    (``looks`` keeps each unit's last count and moves): a guard beats every poll, while the
    beats that a node cut off queued in its connection all arrive at once when its link is
    back, though its guard has moved on (issue 58)."""
    last = looks.setdefault(index, [count, 0])
    if count != last[0]:
        last[0], last[1] = count, last[1] + 1
    return last[1] >= 2


def answering_done(waited: float, least: float, most: float, missing: set[str], lost: set[str],
                   rejoin_timeout: float) -> bool:
    """Whether the host has watched the guards long enough to plan the next attempt: at least
    ``least``; then until each missing node's own wait is over: ``rejoin_timeout`` for a node
    the ended attempt lost (``lost``), ``most`` for any other (slow to say it is there)."""
    if waited < least:
        return False
    return all(waited >= (rejoin_timeout if node in lost else most) for node in missing)


def attempt_row(plan: dict, started_at: str, t: float) -> dict:
    """The run's table's row of the attempt ``plan``, as it starts (``_t``: its start, not shown)."""
    return {"attempt": plan["attempt"], "started_at": started_at, "ended_at": None, "seconds": None,
            "state": vocab.RunState.RUNNING.value, "cause": None, "nodes": plan["nodes"],
            "master": plan["master"], "world_size": plan["world_size"], "ranks": plan["ranks"], "_t": t}


def close_row(row: dict, abort: dict | None, state: str, ended_at: str, t: float) -> None:
    """Close an attempt's row: when, how, and why (its abort, without the run's ``final``)."""
    row.update(ended_at=ended_at, cause={k: v for k, v in abort.items() if k != "final"} if abort else None,
               state=state)
    if "_t" in row:
        row["seconds"] = round(t - row.pop("_t"), 1)


def job_document(config: dict, state: str, abort: dict | None, exits: dict, ages: dict, elapsed: float,
                 updated_at: str) -> dict:
    """job.json: the run's state as the store's host sees it; ``ages``: each unit's heartbeat age."""
    return {"run_id": config["run_id"], "job": config["job"], "state": state, "abort": abort,
            "updated_at": updated_at, "elapsed_s": round(elapsed, 1),
            "units": [{"name": u["name"], "host": u["host"], "role": u["role"], "exit_code": exits.get(i),
                       "heartbeat_age_s": round(ages[i], 1) if i in ages else None}
                      for i, u in enumerate(config["units"])]}
