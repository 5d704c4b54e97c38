"""launch_mode slurm: one sbatch job whose srun steps are the ranks, each a bare process in
the node's own Python (launch_python) under its guard, as in the process mode.

The mode owns the job's whole life (its Scheduler, which the scheduler_job action drives on
the master): the sbatch script, made from the spec, which starts every unit's step at once
(the guards keep the phases, as in every mode: a later phase's unit waits in its guard until
the master listens); sbatch --test-only in the launch's check; the submission, once every
node's run folder is made; squeue for the job's state; and scancel when the run ends, is
stopped, replaced, or taken down. The guards supervise the run as in every mode; Slurm only
places and runs the steps.
"""

from __future__ import annotations

import re
import shlex
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

from torchfleet import cpus, run_vocab
from torchfleet.errors import InventoryError
from torchfleet.modes import Scheduler, Unsupported, refuse_restarts, register
from torchfleet.modes.process import Process
from torchfleet.slurm import NAME_RE

# --- launching through Slurm (launch_mode: slurm) ---------------------------------------------

# Variables srun and sbatch read as their own options: a unit that set one would change the step.
SLURM_ENV_PREFIXES = ("SLURM_", "SRUN_", "SBATCH_", "SALLOC_")
# The batch script's own output (srun's messages, the script's), in the master's run folder.
BATCH_LOG = "sbatch.log"
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
# The batch script's helpers: watch the steps; after the first failure the others get the
# run's stop_wait to end (their guards stop them) before the script kills what is left, so a
# lost node ends the job then, not after SlurmdTimeout.
_HELPERS = r'''tf_pids=() tf_names=()
tf_start() { tf_pids+=("$1") tf_names+=("$2"); }
# Kills every step still running and ends the job with the given code.
tf_end() { kill -KILL "${tf_pids[@]}" 2>/dev/null; exit "$1"; }
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
    with ``sbatch FILE``: one srun step per unit on its node, all at once (a later phase's
    unit waits in its guard until the earlier phase listens, as in every mode), then the
    steps watched until they end.

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
        ("job-name", job_name(spec["job"], spec["run_id"])), ("nodes", str(len(nodes))),
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
           _HELPERS.replace("{stop_wait}", str(_seconds(guard.get("stop_wait"), 30)))]
    for unit in units:
        out.append(f"# {unit['name']} on {unit['host']}: rank(s) {', '.join(map(str, unit.get('ranks') or [])) or '-'}")
        out.append(_step(unit, node[unit["host"]], str(spec["job"])) + " &")
        out.append(f"tf_start $! {shlex.quote(str(unit['name']))}")
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


# The mode's own files in the master's run folder.
SCRIPT = "sbatch.sh"  # the job as sbatch runs it
JOB_ID = "slurm-job-id"  # the id sbatch gave the job
# Submits the script from the run folder and records the job id beside it ("N;cluster" with
# a federation: the id is N).
SUBMIT = ('cd "$1" || exit 2; out=$(sbatch --parsable "$2") || exit $?; id="${out%%;*}"; '
          'echo "$id" >"$3.tmp" && mv "$3.tmp" "$3" && echo "$id"')
# One look per poll: "started" once the node's first unit has left its files, else squeue's line.
LOOK = 'if [ -e "$1" ]; then echo started; else shift; exec "$@"; fi'
POLL_S = 1.0


class SlurmJobs(Scheduler):
    """The run's sbatch job, on the master: sbatch --test-only, sbatch, squeue, scancel."""

    # Each guard runs under its step's shell (STEP_SHELL runs it without exec).
    parent_holds_unit = True

    def test(self, sh, spec, nodes):
        """sbatch --test-only on the script (on its stdin): Slurm checks the request against its
        partitions and nodes and says when it would start, creating no job."""
        script = spec["files"][spec["master_host"]][SCRIPT]
        done = sh("exec sbatch --test-only", stdin=script)
        if done.get("rc") != 0:
            self._refused(sh, spec, nodes, done)
        return (done.get("stderr") or "").strip()

    def submit(self, sh, spec, nodes, run_dir, timeout):
        """sbatch the run folder's script, then wait until the master's first unit has started
        (its step shell's files are there). A job that Slurm ends first, holds for a reason no
        wait cures, or that does not start within ``timeout``, is cancelled and fails the start."""
        done = sh(SUBMIT, run_dir, SCRIPT, JOB_ID)
        if done.get("rc") != 0:
            self._refused(sh, spec, nodes, done)
        job_id = done["stdout"].strip()
        first = next(u for u in spec["units"] if u["host"] == spec["master_host"])
        meta = run_vocab.process_file(f"{run_dir}/{first['name']}", run_vocab.ProcessFile.META)
        deadline = time.monotonic() + timeout
        job: dict[str, Any] = {}
        while True:
            look = sh(LOOK, meta, *squeue_command(job_id))
            if look.get("stdout", "").strip() == "started":
                return job_id
            job = next(iter(parse_squeue(look.get("stdout", ""))), job)
            if job.get("state") not in (None, run_vocab.RunState.RUNNING.value) \
                    or job.get("reason") in HOPELESS_REASONS or time.monotonic() > deadline:
                break
            time.sleep(POLL_S)
        self.cancel(sh, run_dir, timeout)
        batch = sh('tail -n 20 "$1" 2>/dev/null', f"{run_dir}/{BATCH_LOG}")
        said = f"{job.get('text', 'not in squeue')}\n{batch.get('stdout', '')}"
        if "error" in said.lower():
            raise sbatch_error(said, partition=_partition(spec, nodes), spec=spec, hostnames=_hostnames(nodes))
        raise InventoryError(f"Slurm job {job_id} did not start {first['name']} on {first['host']} within "
                             f"{timeout:g} s: {said.strip()}", first["host"], "launch_master_wait_timeout")

    def describe(self, sh, run_dir):
        job_id = self._job_id(sh, run_dir)
        if not job_id:
            return None
        look = sh('squeue --noheader --states=all --jobs="$1" --format="$2" 2>/dev/null || true', job_id, SQUEUE_FORMAT)
        return next(iter(parse_squeue(look.get("stdout", ""))), None)

    def cancel(self, sh, run_dir, timeout):
        """scancel the run's job, if it has one, and wait until squeue no longer lists it among
        the jobs that hold nodes (squeue forgets a job MinJobAge after it ended)."""
        job_id = self._job_id(sh, run_dir)
        if not job_id:
            return {"changed": False, "job_id": None, "listed": []}

        def listed():
            look = sh('squeue --noheader --jobs="$1" --format="$2" 2>/dev/null || true', job_id, SQUEUE_FORMAT)
            return parse_squeue(look.get("stdout", ""))

        found = left = listed()
        if found:
            sh('exec scancel "$1"', job_id)
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            time.sleep(POLL_S)
            left = listed()
        return {"changed": bool(found), "job_id": job_id, "listed": left}

    @staticmethod
    def _job_id(sh, run_dir):
        """The id the run folder recorded at the submission; from a node that does not hold it
        (a lost master's successor, a down), the queued job named after the run (job_name)."""
        recorded = sh('cat "$1" 2>/dev/null || true', f"{run_dir}/{JOB_ID}").get("stdout", "").strip()
        if recorded:
            return recorded
        run_id = run_dir.rstrip("/").rsplit("/", 1)[-1]
        look = sh('squeue --noheader --format="%i|%j" 2>/dev/null || true').get("stdout", "")
        return next((line.split("|", 1)[0] for line in look.splitlines()
                     if "|" in line and job_name_matches(line.split("|", 1)[1].strip(), run_id)), "")

    @staticmethod
    def _refused(sh, spec, nodes, done):
        if "not found" in str(done.get("stderr") or "") or "No such file" in str(done.get("msg") or ""):
            host = spec["master_host"]
            raise InventoryError(f"launch_mode=slurm but sbatch is not on {host}; run site.yml with "
                                 "slurm_enabled: true (the slurm role)", host, "launch_mode")
        known = sh("exec sinfo -h -N -o %N")
        raise sbatch_error(done.get("stderr") or done.get("msg") or "", partition=_partition(spec, nodes), spec=spec,
                           hostnames=_hostnames(nodes), known=known.get("stdout_lines") if known.get("rc") == 0 else None)


def job_name(job: str, run_id: str) -> str:
    """The Slurm job's name (sbatch --job-name): found by it where the job's id is not at hand."""
    return f"torchfleet-{job}-{run_id}"


def job_name_matches(name: str, run_id: str) -> bool:
    return name.startswith("torchfleet-") and name.endswith(f"-{run_id}")


def _partition(spec: Mapping[str, Any], nodes: Mapping[str, Any]) -> str:
    return str(((nodes.get(spec["master_host"]) or {}).get("settings") or {}).get("slurm_partition") or "")


def _hostnames(nodes: Mapping[str, Any]) -> dict[str, str]:
    """Each inventory host's Slurm node name (slurm.conf's NodeName, the short hostname)."""
    return {h: str(n["slurm_node"]) for h, n in nodes.items() if n.get("slurm_node")}


class Slurm(Process):
    name = "slurm"
    SETTINGS = {"slurm_partition": ("launch_slurm_partition", str)}
    scheduler = SlurmJobs()
    # The steps' shells read the secret environment from the run folder: srun passes no
    # value that is not on the script's command lines.
    secret_env_file = True

    def unsupported(self, job: Mapping[str, Any]) -> tuple[Unsupported, ...]:
        why = "the job's allocation is Slurm's: requeue it with sbatch --requeue instead"
        return super().unsupported(job) + (refuse_restarts(job, why),)

    def node_facts(self, host: str, table: Mapping[str, Any], probe: Mapping[str, Any]) -> dict[str, Any]:
        # slurm.conf names each node by its short hostname (the slurm role's NodeName).
        return {"slurm_node": str(probe.get("hostname") or host)}

    def spec_files(self, spec: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, str]]:
        """The whole job as one sbatch script, in the master's run folder, where its start
        submits it; the same file runs unchanged by hand with ``sbatch``."""
        script = sbatch_script(spec, partition=_partition(spec, nodes), hostnames=_hostnames(nodes))
        return {spec["master_host"]: {SCRIPT: script}}

    def run_files(self, host: str, master: bool) -> list[tuple[str, str]]:
        return [(name, name) for name in (SCRIPT, JOB_ID, BATCH_LOG)] if master else []

    def summary(self, run_dir: Path) -> dict[str, Any]:
        path = Path(run_dir) / JOB_ID
        out: dict[str, Any] = {"slurm_job_id": path.read_text().strip() if path.is_file() else None}
        said = steps_ended(Path(run_dir) / BATCH_LOG)
        if said:
            out["note"] = "Slurm: " + "; ".join(said)
        return out


# slurmstepd's words on a step it ended itself (scancel, a time limit, memory), in the batch log.
_STEP_ENDED = re.compile(r"^slurmstepd\S*: error: \*\*\* (.+?) \*\*\*\s*$", re.MULTILINE)


def steps_ended(batch_log: Path) -> list[str]:
    """What Slurm said of the steps it ended, from the batch log collected with the run."""
    try:
        return _STEP_ENDED.findall(batch_log.read_text(errors="replace"))
    except OSError:
        return []


register(Slurm())
