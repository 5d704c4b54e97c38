"""What the slurm role writes into slurm.conf, from the inventory and each node's readings.

slurmd compares the hardware a node line claims with what it finds itself (hwloc: the
CPUs its cpuset allows; sysconf: the physical memory), and slurmctld drains a node that
claims more than it has. So each line is computed from the node's own readings, counted
the way slurmd counts: sockets, cores per socket as whole cores over sockets, threads per
core as CPUs over cores, and memory in MiB rounded down.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Iterable, Mapping

from torchfleet import cpus, ranks
from torchfleet.errors import InventoryError
from torchfleet import run_vocab

CONTROLLER_VAR = "slurm_controller"
# Slurm's own rule for ClusterName (lower case, as slurmctld folds it) and partition names.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
# Node states (sinfo %T) in which a node serves jobs; anything else (down, drained, not
# responding, unknown) means the node is not ready.
SERVING = {"idle", "allocated", "mixed", "completing"}


def controller(hosts: Iterable[Mapping[str, Any]], chosen: str | None = None) -> str:
    """The host that runs slurmctld: ``chosen`` (slurm_controller) when set, else the master,
    node rank 0 in the launch's order. Each host mapping has ``name`` and optionally
    ``node_rank`` (torchfleet_node_rank)."""
    order = ranks.node_order(hosts)
    names = [h["name"] for h in order]
    if chosen in (None, ""):
        return names[0]
    if chosen not in names:
        raise InventoryError(
            f"{CONTROLLER_VAR}={chosen!r} is not one of the Slurm nodes ({', '.join(names)})",
            None, CONTROLLER_VAR)
    return str(chosen)


def check_names(cluster_name: str, partition: str) -> None:
    """Refuse a cluster or partition name that Slurm would reject or rewrite."""
    for variable, value in (("slurm_cluster_name", cluster_name), ("slurm_partition", partition)):
        if not NAME_RE.match(str(value)):
            raise InventoryError(
                f"{variable}={value!r} must be lower-case letters, digits, '-' or '_', starting with a "
                "letter or digit, at most 40 characters", None, variable)


def memory_mib(meminfo: str, host: str | None = None) -> int:
    """MemTotal of ``/proc/meminfo`` in MiB, rounded down, as slurmd reads RealMemory."""
    match = re.search(r"^MemTotal:\s+(\d+)\s+kB", meminfo, re.MULTILINE)
    if not match:
        raise InventoryError("its /proc/meminfo has no MemTotal line", host, "slurm_memory_reserve_mib")
    return int(match.group(1)) // 1024


def hardware(host: str, lscpu: str, meminfo: str, allowed: Iterable[int] | None = None,
             reserve_mib: int = 0) -> dict[str, int]:
    """A node's CPUs, Sockets, CoresPerSocket, ThreadsPerCore and RealMemory, from its
    ``lscpu -p`` table, the CPUs it lets processes use (``allowed``: none means all) and
    ``/proc/meminfo``; ``reserve_mib`` is kept back from RealMemory."""
    allowed_set = set(allowed or [])
    rows = [r for r in cpus.parse_lscpu(lscpu) if r["online"] and (not allowed_set or r["cpu"] in allowed_set)]
    if not rows:
        raise InventoryError("has no online CPU it may use", host, "slurm_group")
    cores = {(r["socket"], r["core"]) for r in rows}
    sockets = {r["socket"] for r in rows}
    real = memory_mib(meminfo, host) - int(reserve_mib)
    if real < 1:
        raise InventoryError(f"slurm_memory_reserve_mib={reserve_mib} leaves no memory for jobs "
                             f"(the node has {memory_mib(meminfo, host)} MiB)", host, "slurm_memory_reserve_mib")
    per_socket = max(1, len(cores) // len(sockets))
    threads = max(1, len(rows) // len(cores))
    # slurmctld replaces a CPUs that is not the product; on a node whose sockets or cores
    # differ (some CPUs offline) the product under-claims, which Slurm accepts, never over.
    return {"cpus": len(sockets) * per_socket * threads, "sockets": len(sockets), "cores_per_socket": per_socket,
            "threads_per_core": threads, "real_memory": real}


def node_line(node: Mapping[str, Any]) -> str:
    """A NodeName line of slurm.conf from a node of ``conf_nodes``."""
    return (f"NodeName={node['hostname']} NodeAddr={node['address']} CPUs={node['cpus']} "
            f"Sockets={node['sockets']} CoresPerSocket={node['cores_per_socket']} "
            f"ThreadsPerCore={node['threads_per_core']} RealMemory={node['real_memory']} State=UNKNOWN")


def conf_nodes(nodes: Iterable[Mapping[str, Any]], chosen: str | None = None, reserve_mib: int = 0) -> dict[str, Any]:
    """The controller and node lines of slurm.conf.

    Each node has ``name`` (inventory name), ``node_rank`` (or None), ``hostname`` (the
    short name slurmd knows itself by), ``address`` (its cluster address), ``lscpu``,
    ``allowed`` and ``meminfo`` (its readings). Returns ``controller`` (name, hostname,
    address), ``nodes`` (each with its hardware), ``lines`` and ``node_list``.
    """
    nodes = [dict(n) for n in nodes]
    name = controller(nodes, chosen)
    seen: dict[str, str] = {}
    out = []
    for node in ranks.node_order(nodes):
        host = node["name"]
        if not node.get("hostname"):
            raise InventoryError("has no hostname in its facts (ansible_hostname)", host, "slurm_group")
        if node["hostname"] in seen:
            raise InventoryError(f"has the hostname {node['hostname']!r}, as {seen[node['hostname']]} does; "
                                 "slurmd finds its node line by hostname, so each needs its own", host, "slurm_group")
        seen[node["hostname"]] = host
        out.append({"name": host, "hostname": node["hostname"], "address": node["address"],
                    **hardware(host, node["lscpu"], node["meminfo"], node.get("allowed"), reserve_mib)})
    head = next(n for n in out if n["name"] == name)
    return {
        "controller": {"name": name, "hostname": head["hostname"], "address": head["address"]},
        "nodes": out,
        "lines": [node_line(n) for n in out],
        "node_list": ",".join(n["hostname"] for n in out),
    }


def unready(sinfo: str, hostnames: Iterable[str]) -> dict[str, str]:
    """The nodes of ``hostnames`` that do not serve jobs, with their state, from
    ``sinfo -h -N -o '%N %T'`` (a node in several partitions is listed once per partition);
    a node sinfo does not list is "missing"."""
    states: dict[str, str] = {}
    for line in sinfo.splitlines():
        fields = line.split()
        if len(fields) >= 2:
            states[fields[0]] = fields[1].lower()
    return {h: states.get(h, "missing") for h in hostnames if states.get(h, "missing") not in SERVING}


# --- launching through Slurm (launch_mode: slurm) ---------------------------------------------

# Variables srun and sbatch read as their own options: a unit that set one would change the step.
SLURM_ENV_PREFIXES = ("SLURM_", "SRUN_", "SBATCH_", "SALLOC_")
# The batch script's own output (srun's messages, the script's), in the master's run folder.
BATCH_LOG = run_vocab.SBATCH_LOG
# Each step on its node, before its unit: its output to the rank's log in the node's run folder
# (srun's own --output writes on the node running srun, the batch host, unless the name holds
# %t or %N), then into its workdir (srun --chdir falls back to /tmp with only a warning), then
# the node's secret file into the env where the unit has secrets. It leaves the files a bare
# process's start leaves (rank_processes: NAME.pid, then NAME.meta holding $3, and NAME.exit
# once it ends), so that the node's own view of its units, its stop and its report are the
# process mode's.
_PF = run_vocab.ProcessFile
STEP_SHELL = (f'exec >>"$0" 2>&1 || exit 2; b="${{0%{_PF.LOG}}}"; echo $$ >"$b{_PF.PID}"; echo "$3" >"$b{_PF.META}"; '
              f'tf_exit() {{ echo "$1" >"$b{_PF.EXIT}.tmp" && mv "$b{_PF.EXIT}.tmp" "$b{_PF.EXIT}"; exit "$1"; }}; '
              'cd -- "$1" || tf_exit 2; '
              'if [ -n "$2" ]; then [ -r "$2" ] || { echo "cannot read $2"; tf_exit 2; }; '
              'set -a; . "$2"; set +a; fi; shift 3; "$@"; tf_exit $?')
# The batch script's helpers: wait for a listening unit, then watch the steps; after the first
# failure the others get the run's stop_wait to end (their guards stop them) before the script
# kills what is left, so a lost node ends the job then, not after SlurmdTimeout.
_HELPERS = r'''tf_pids=() tf_names=()
tf_start() { tf_pids+=("$1") tf_names+=("$2"); }
# Kills every step still running and ends the job with the given code.
tf_end() { kill -KILL "${tf_pids[@]}" 2>/dev/null; exit "$1"; }
# Waits until host:port answers, while the step of unit $3 (the $4th started) still runs.
tf_listen() {
  local deadline=$((SECONDS + {listen_timeout}))
  until (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; do
    kill -0 "${tf_pids[$4]}" 2>/dev/null || { echo "torchfleet: $3 ended before it listened on $1:$2" >&2; return 1; }
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "torchfleet: $3 did not listen on $1:$2 within {listen_timeout} s" >&2; return 1
    fi
    sleep 1
  done
}
tf_watch() {
  local rc=0 deadline="" left i s
  while :; do
    left=0
    for i in "${!tf_pids[@]}"; do
      if kill -0 "${tf_pids[$i]}" 2>/dev/null; then left=1; continue; fi
      wait "${tf_pids[$i]}"; s=$?
      if [ "$s" -ne 0 ] && [ "$rc" -eq 0 ]; then
        rc=$s deadline=$((SECONDS + {stop_wait}))
        echo "torchfleet: step ${tf_names[$i]} ended with exit code $s; the others get {stop_wait} s to end" >&2
      fi
      unset "tf_pids[$i]"
    done
    [ "$left" -eq 1 ] || return "$rc"
    if [ -n "$deadline" ] && [ "$SECONDS" -ge "$deadline" ]; then
      echo "torchfleet: steps still running {stop_wait} s after the first failure; ending the job" >&2
      tf_end "$rc"
    fi
    sleep 1
  done
}
'''


def cpu_bind(cpuset: str | None, host: str | None = None) -> str:
    """srun's --cpu-bind for a unit's cpuset: map_cpu for one CPU, mask_cpu for several,
    none where nothing is pinned (the unit may use the whole node, as in the other modes)."""
    listed = cpus.parse_cpulist(cpuset, host, "cpu_pinning_cpusets")
    if not listed:
        return "none"
    if len(listed) == 1:
        return f"map_cpu:{listed[0]}"
    return f"mask_cpu:{sum(1 << c for c in listed):#x}"


def unit_cpus(unit: Mapping[str, Any]) -> int:
    """The CPUs a unit's step asks for: its cpuset's, else its ranks' threads."""
    if unit.get("cpuset"):
        return len(cpus.parse_cpulist(unit["cpuset"], unit["host"], "cpu_pinning_cpusets"))
    threads = int((unit.get("env") or {}).get("OMP_NUM_THREADS") or 1)
    return max(1, threads) * max(1, len(unit.get("ranks") or [0]))


def unit_run_dir(unit: Mapping[str, Any]) -> str:
    """The run's folder on the unit's node, where its log and the secret file go: the
    TORCHFLEET_OUT_DIR its builder set (a bare process's; a container's is its mount)."""
    out = str((unit.get("env") or {}).get("TORCHFLEET_OUT_DIR") or "")
    if unit.get("kind") == "container" or not out.startswith("/") or out == "/out":
        raise InventoryError(f"unit {unit['name']} runs in a container; Slurm runs bare processes in the node's "
                             "Python (launch_python), so set launch_torchrun_runtime: process or use the "
                             "process builder", unit["host"], "launch_mode")
    return out


def unit_log(unit: Mapping[str, Any]) -> str:
    """The unit's log on its node, named as the process mode names it."""
    return f"{unit_run_dir(unit)}/{unit['name']}.log"


def _check_unit_env(unit: Mapping[str, Any]) -> None:
    taken = sorted(k for k in unit.get("env") or {} if k.startswith(SLURM_ENV_PREFIXES))
    if taken:
        raise InventoryError(f"launch_extra_env sets {', '.join(taken)}, which srun reads as its own options under "
                             "launch_mode=slurm; remove them", unit["host"], "launch_extra_env")


def _seconds(value: Any, default: float) -> int:
    return max(1, int(-(-float(value if value not in (None, "") else default) // 1)))


def _step(unit: Mapping[str, Any], node: str, job: str) -> str:
    """One srun step, as lines of the script: the unit alone on its node with its env
    (one assignment a line), its CPUs, log and folder, then its command under the step shell."""
    run_dir = unit_run_dir(unit)
    secrets = f"{run_dir}/{run_vocab.SECRET_ENV}" if unit.get("secret_env") else ""
    # task/none (the slurm role's TaskPlugin) ignores --cpu-bind, so taskset pins as the process mode does.
    pin = ["taskset", "--cpu-list", str(unit["cpuset"])] if unit.get("cpuset") else []
    # Not srun --export=NAME=VALUE: srun splits its list at every comma and keeps quotes in values.
    env = [["env"]] + [[f"{k}={v}"] for k, v in sorted((unit.get("env") or {}).items())] if unit.get("env") else []
    srun = ["srun", f"--job-name={unit['name']}", "--nodes=1", "--ntasks=1", f"--nodelist={node}", "--overlap",
            f"--cpus-per-task={unit_cpus(unit)}", f"--cpu-bind={cpu_bind(unit.get('cpuset'), unit['host'])}",
            "--kill-on-bad-exit=1", f"--chdir={unit['workdir']}", "--export=ALL"]
    meta = f"{(unit.get('ranks') or [0])[0]} {unit.get('role', 'rank')} {job}"
    lines = env + [srun, ["/bin/sh", "-c", STEP_SHELL, unit_log(unit), str(unit["workdir"]), secrets, meta],
                   [*pin, *[str(c) for c in unit["command"]]]]
    return " \\\n  ".join(" ".join(shlex.quote(w) for w in line) for line in lines if line)


def sbatch_script(spec: Mapping[str, Any], *, partition: str, hostnames: Mapping[str, str] | None = None,
                  requeue: bool = False) -> str:
    """The whole launch spec (``LaunchSpec.to_dict()``) as one sbatch script that runs as is
    with ``sbatch FILE``: one srun step per unit on its node, phase by phase, each later phase
    once the earlier units' ``listen`` ports answer, then the steps watched until they end.

    ``partition``: slurm_partition. ``hostnames``: each inventory host's Slurm node name
    (its NodeName, the short hostname), where it differs from the host's name.
    ``requeue``: let Slurm requeue the job after a node failure (off: a run ends once)."""
    if not NAME_RE.match(str(partition)):
        raise InventoryError(f"slurm_partition={partition!r} is not a Slurm partition name", None, "slurm_partition")
    hostnames = dict(hostnames or {})
    units = [u for _, u in sorted(enumerate(spec["units"]), key=lambda iu: (int(iu[1]["phase"]), iu[0]))]
    if not units:
        raise InventoryError("the launch spec has no units to run", None, "launch_mode")
    for unit in units:
        _check_unit_env(unit)
    node = {u["host"]: str(hostnames.get(u["host"], u["host"])) for u in units}
    nodes = list(dict.fromkeys(node[u["host"]] for u in units))
    need: dict[str, int] = {}
    for unit in units:
        need[unit["host"]] = need.get(unit["host"], 0) + unit_cpus(unit)
    master = next((u for u in units if u["host"] == spec.get("master_host")), units[0])
    batch_dir = unit_run_dir(master)
    guard = spec.get("guard") or {}
    header = [
        ("job-name", f"torchfleet-{spec['job']}-{spec['run_id']}"), ("nodes", str(len(nodes))),
        ("nodelist", ",".join(nodes)), ("exclusive", None), ("wait-all-nodes", "1"), ("partition", partition),
        # sbatch refuses at once a node that has fewer CPUs than its units ask for.
        ("mincpus", str(max(need.values()))), ("requeue" if requeue else "no-requeue", None),
        ("chdir", batch_dir), ("output", f"{batch_dir}/{BATCH_LOG}"),
    ]
    out = ["#!/bin/bash",
           f"# torchfleet run {spec['run_id']} of job {spec['job']}: {spec.get('world_size', '?')} ranks in "
           f"{len(units)} units on {len(nodes)} nodes.",
           "# Written by torchfleet (launch_mode: slurm); it runs unchanged with sbatch. Secret values are not",
           "# here: a unit with secrets reads its node's file in the run folder.",
           *[f"#SBATCH --{k}" + (f"={shlex.quote(v)}" if v is not None else "") for k, v in header],
           "set -u",
           _HELPERS.replace("{listen_timeout}", str(_seconds(guard.get("start_timeout"), 60)))
                   .replace("{stop_wait}", str(_seconds(guard.get("stop_wait"), 30)))]
    started: list[Mapping[str, Any]] = []
    for phase in sorted({int(u["phase"]) for u in units}):
        listening = [(i, u) for i, u in enumerate(started) if u.get("listen")]
        if listening:
            out.append(f"# Phase {phase} starts once the earlier units listen.")
            out += [f"tf_listen {shlex.quote(str(u['listen']['host']))} {int(u['listen']['port'])} "
                    f"{shlex.quote(str(u['name']))} {i} || tf_end 1" for i, u in listening]
        for unit in (u for u in units if int(u["phase"]) == phase):
            out.append(f"# {unit['name']} on {unit['host']}: rank(s) {', '.join(map(str, unit.get('ranks') or [])) or '-'}")
            out.append(_step(unit, node[unit["host"]], str(spec["job"])) + " &")
            out.append(f"tf_start $! {shlex.quote(str(unit['name']))}")
            started.append(unit)
    out.append("tf_watch")
    return "\n".join(out) + "\n"


# --- the job's state, from squeue alone (no accounting: sacct then says "Slurm accounting
# storage is disabled" and exits 1) -----------------------------------------------------------

RunState, AbortKind = run_vocab.RunState, run_vocab.AbortKind
# Every job state of squeue's JOB STATE CODES (its long name and short code), as the run state
# it queues, runs or completes in, or the kind of abort its end amounts to (run_vocab.run_state
# decides how that reads), and what it means for the run. A state not here reads "unknown",
# never an error.
JOB_STATES: dict[str, tuple[str, str, str]] = {
    "PENDING": ("PD", RunState.RUNNING, "waiting in the queue for its nodes"),
    "CONFIGURING": ("CF", RunState.RUNNING, "its nodes are being readied"),
    "RUNNING": ("R", RunState.RUNNING, "running"),
    "COMPLETING": ("CG", RunState.RUNNING, "ending: Slurm is cleaning up its steps"),
    "RESIZING": ("RS", RunState.RUNNING, "its allocation is being resized"),
    "SIGNALING": ("SI", RunState.RUNNING, "being signaled"),
    "STAGE_OUT": ("SO", RunState.RUNNING, "staging out its files"),
    "SUSPENDED": ("S", RunState.RUNNING, "suspended: its CPUs were given to other jobs"),
    "STOPPED": ("ST", RunState.RUNNING, "stopped by a signal: it keeps its CPUs"),
    "REQUEUED": ("RQ", RunState.RUNNING, "requeued: it will start again"),
    "REQUEUE_FED": ("RF", RunState.RUNNING, "requeued by its federation: it will start again"),
    "REQUEUE_HOLD": ("RH", RunState.RUNNING, "requeued and held: scontrol release it, or torchfleet stop"),
    "SPECIAL_EXIT": ("SE", RunState.RUNNING, "held after a special exit: scontrol release it, or torchfleet stop"),
    "RESV_DEL_HOLD": ("RD", RunState.RUNNING, "held because its reservation was deleted"),
    "COMPLETED": ("CD", RunState.SUCCEEDED, "every step exited 0"),
    "FAILED": ("F", AbortKind.RANK_FAILED, "a step or the batch script exited non-zero"),
    "TIMEOUT": ("TO", AbortKind.TIMEOUT, "it reached its time limit"),
    "NODE_FAIL": ("NF", AbortKind.NODE_LOST, "one of its nodes failed"),
    "BOOT_FAIL": ("BF", AbortKind.NODE_LOST, "its nodes failed to boot"),
    "OUT_OF_MEMORY": ("OOM", AbortKind.RANK_FAILED, "a step ran out of memory"),
    "DEADLINE": ("DL", AbortKind.TIMEOUT, "it passed its deadline"),
    "PREEMPTED": ("PR", AbortKind.RANK_FAILED, "another job preempted it"),
    "CANCELLED": ("CA", AbortKind.STOPPED, "cancelled (scancel)"),
    "REVOKED": ("RV", AbortKind.STOPPED, "revoked: a sibling job of its federation runs it elsewhere"),
}
_BY_CODE = {code: name for name, (code, _, _) in JOB_STATES.items()}
# Reasons of a pending job that no wait will cure: the request itself is wrong.
HOPELESS_REASONS = {"PartitionNodeLimit", "PartitionDown", "PartitionInactive", "BadConstraints",
                    "ReqNodeNotAvail", "InvalidAccount", "InvalidQOS", "AssocMaxNodesPerJobLimit"}
# What parse_squeue reads: job id, state, reason, batch host, nodes, then the name (it may hold '|').
SQUEUE_FORMAT = "%i|%T|%r|%B|%N|%j"


def job_state(slurm_state: str) -> tuple[str, str]:
    """A Slurm job state (long name or short code, as squeue, scontrol or sacct print it:
    "CANCELLED by 0", "CANCELLED+", "cd") as a run state and a sentence. Unknown: "unknown"."""
    word = str(slurm_state or "").strip().split(" ")[0].rstrip("+").upper()
    name = _BY_CODE.get(word, word)
    if name not in JOB_STATES:
        return RunState.UNKNOWN.value, f"Slurm state {slurm_state!r} is not one torchfleet knows"
    _, word, text = JOB_STATES[name]
    return run_vocab.run_state(scheduler=word), f"{name}: {text}"


def squeue_command(job_id: str | int) -> list[str]:
    """squeue for one job, finished ones included (squeue shows them for MinJobAge, 300 s by
    default); afterwards squeue refuses the id and the run's folders tell how it ended."""
    return ["squeue", "--noheader", "--states=all", f"--jobs={job_id}", f"--format={SQUEUE_FORMAT}"]


def parse_squeue(text: str) -> list[dict[str, Any]]:
    """squeue_command's lines as jobs: job_id, slurm_state, reason, batch_host, nodes,
    name, and the run state and sentence (job_state). Lines that do not parse are skipped."""
    jobs = []
    for line in text.splitlines():
        fields = line.strip().split("|", 5)
        if len(fields) != 6 or not fields[0]:
            continue
        job_id, slurm_state, reason, batch_host, nodes, name = fields
        state, sentence = job_state(slurm_state)
        if slurm_state.upper() in ("PENDING", "PD") and reason in HOPELESS_REASONS:
            sentence += f" ({reason}: Slurm cannot start it as asked; torchfleet stop, then fix the request)"
        elif reason not in ("", "None"):
            sentence += f" ({reason})"
        jobs.append({"job_id": job_id, "slurm_state": slurm_state, "reason": reason,
                     "batch_host": "" if batch_host == "n/a" else batch_host, "nodes": nodes, "name": name,
                     "state": state, "text": sentence})
    return jobs


# --- Slurm's refusals as torchfleet errors -----------------------------------------------------

# (what sbatch or srun says, the variable to change, why). The first six were captured from
# slurmctld 22.05.8 (docs/slurm.md); the rest are Slurm's error strings, not seen here.
_REFUSALS: tuple[tuple[str, str, str], ...] = (
    ("Invalid partition name specified", "slurm_partition",
     "slurm_partition={partition!r} is not a partition of this Slurm cluster (sinfo lists them)"),
    ("Invalid node name specified", "slurm_group",
     "Slurm knows no node {unknown}: run site.yml with slurm_enabled: true so that slurm.conf lists every "
     "node of the inventory"),
    ("CPU count per node can not be satisfied", "cpu_pinning_cores_per_rank",
     "a node's units ask for more CPUs than Slurm gives that node ({need}); lower cpu_pinning_cores_per_rank, "
     "cpu_pinning_cpusets or launch_omp_num_threads, or the ranks per node"),
    ("More processors requested than permitted", "cpu_pinning_cores_per_rank",
     "a step asks for more CPUs than its node has in Slurm ({need}); lower cpu_pinning_cores_per_rank, "
     "cpu_pinning_cpusets or launch_omp_num_threads"),
    ("Memory specification can not be satisfied", "slurm_memory_reserve_mib",
     "the job asks for more memory than Slurm gives a node"),
    ("Requested node configuration is not available", "slurm_group",
     "no set of nodes in slurm_partition={partition!r} matches the request ({need})"),
    ("Unable to contact slurm controller", "slurm_controller",
     "slurmctld does not answer; run site.yml --tags slurm, which starts it and checks scontrol ping"),
    ("User's group not permitted to use this partition", "slurm_partition",
     "the submitting user may not use slurm_partition={partition!r}"),
    ("Access/permission denied", "slurm_partition",
     "Slurm refuses the submitting user in slurm_partition={partition!r}"),
    ("Job violates accounting/QOS policy", "slurm_partition",
     "the job breaks a limit of slurm_partition={partition!r} or of its QOS"),
)


def sbatch_error(stderr: str, *, partition: str = "", spec: Mapping[str, Any] | None = None,
                 hostnames: Mapping[str, str] | None = None, known: Iterable[str] | None = None) -> InventoryError:
    """What sbatch (or an srun step, in the batch log) said when Slurm refused the job, as an
    InventoryError naming the variable to change and, where it can, the host. ``spec`` and
    ``hostnames`` are sbatch_script's; ``known``: the node names Slurm lists (sinfo -h -N -o %N),
    which pins an invalid node name to its inventory host. Slurm's own line stays at the end."""
    lines = [line.strip() for line in str(stderr).splitlines() if line.strip()]
    said = next((line for line in reversed(lines) if "error" in line.lower()), lines[-1] if lines else "")
    hostnames = dict(hostnames or {})
    hosts = list(dict.fromkeys(u["host"] for u in (spec or {}).get("units", [])))
    need: dict[str, int] = {}
    for unit in (spec or {}).get("units", []):
        need[unit["host"]] = need.get(unit["host"], 0) + unit_cpus(unit)
    known_set = set(known) if known is not None else None
    unknown = [h for h in hosts if known_set is not None and hostnames.get(h, h) not in known_set]
    for words, variable, why in _REFUSALS:
        if any(words in line for line in lines):
            message = why.format(partition=partition, need=", ".join(f"{h}: {n} CPUs" for h, n in need.items()),
                                 unknown=", ".join(f"{hostnames.get(h, h)} (host {h})" for h in unknown)
                                 or "of the job's node list")
            named = unknown if words == "Invalid node name specified" else \
                [max(need, key=need.get)] if need and "CPUs" in why else []
            return InventoryError(f"{message} [{said}]", named[0] if len(named) == 1 else None, variable,
                                  hosts=named or None)
    return InventoryError(f"Slurm refused the run's job under launch_mode=slurm: [{said or 'no message'}]",
                          None, "launch_mode")
