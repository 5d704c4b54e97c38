"""launch_mode slurm's own part (torchfleet.modes.slurm): the sbatch script made from the launch
spec, run here by bash with stand-ins for srun; Slurm's job states; Slurm's refusals named as
torchfleet's variables. Slurm itself runs in the slurm molecule scenario (docs/slurm.md)."""

import json
import os
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness.inputs import role_guard
from torchfleet import inputs, spec
from torchfleet.errors import InventoryError
from torchfleet.modes.slurm import (
    JOB_STATES, STEP_SHELL, cpu_bind, job_state, parse_squeue, sbatch_error, sbatch_script, squeue_command)

ROOT = Path(__file__).resolve().parents[2]


# --- launching through Slurm: the sbatch script, the job's state, Slurm's refusals ---------------

RUN_ID = "20261127-160000-cafe"
NODE_DIR = "/var/lib/tfnode"
RUN_DIR = f"{NODE_DIR}/runs/{RUN_ID}"
WORKDIR = f"{NODE_DIR}/workloads/mnist"
PYTHON = "/opt/tf/venv/bin/python3"
# name, address, ranks
HOSTS = [("node-1.example", "10.0.0.11", 2), ("node-2.example", "10.0.0.12", 1), ("node-3.example", "10.0.0.13", 1)]
SHORT = {h: h.split(".")[0] for h, _, _ in HOSTS}
PINNING = {"node-1.example": [{"cpuset": "0-2", "cpuset_mems": "0", "omp_num_threads": 3},
                              {"cpuset": "4-7", "cpuset_mems": "1", "omp_num_threads": 4}],
           "node-2.example": [{"cpuset": "5", "cpuset_mems": "", "omp_num_threads": 1}],
           "node-3.example": [{"cpuset": "1,3,5", "cpuset_mems": "0", "omp_num_threads": 3}]}


def launch_spec(pinning=True, secret=None, extra_env=None, command=None, guard=None, hosts=HOSTS):
    """A process-mode spec of the three nodes, as the launch builds it."""
    from torchfleet.ranks import rank_table

    job = {"run_id": RUN_ID, "job": "mnist", "mode": "process", "transport": "tcp", "image": None,
           "command": command or [], "args": ["--epochs", "1"], "workload_argv": ["python3", "mnist.py"],
           "guard": dict(role_guard(), **(guard or {}))}
    table = rank_table([{"name": h, "address": a, "procs": p} for h, a, p in hosts], 29500)
    nodes = {}
    for host, address, _ in hosts:
        settings = {"node_dir": NODE_DIR, "dataset_dir": "/srv/data", "python": PYTHON, "omp_num_threads": 0,
                    "proxy_env": {}, "extra_env": dict(extra_env or {}), "malloc": "default"}
        parts = inputs.split_site_env(settings, secret, host)
        nodes[host] = {"address": address, "interface": "eth0", "nproc": 8,
                       "pinning": PINNING[host] if pinning else [], "settings": settings,
                       "env_public": parts["public"], "env_shown": parts["shown"]}
    return spec.build(job, table, nodes).to_dict()


def header(script):
    """The #SBATCH options as sbatch reads them: name to value (None for a flag)."""
    found = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH --"):
            name, _, value = line[len("#SBATCH --"):].partition("=")
            found[name] = shlex.split(value)[0] if value else None
    return found


def steps(script):
    """Each srun step of the script, in order, as (env, srun options, the step shell's words)."""
    found = []
    for chunk in script.replace("\\\n", " ").splitlines():
        words = shlex.split(chunk, comments=False) if "srun" in chunk and not chunk.startswith("#") else []
        if "srun" not in words:
            continue
        at = words.index("srun")
        env = dict(w.split("=", 1) for w in words[1:at]) if words[0] == "env" else {}
        opts = {}
        i = at + 1
        while words[i].startswith("--"):
            name, _, value = words[i][2:].partition("=")
            opts[name] = value
            i += 1
        found.append((env, opts, words[i:-1] if words[-1] == "&" else words[i:]))
    return found


def test_the_header_asks_for_the_whole_nodes_by_their_slurm_names():
    script = sbatch_script(launch_spec(), partition="cpu", hostnames=SHORT)
    assert script.startswith("#!/bin/bash\n")
    assert header(script) == {
        "job-name": f"torchfleet-mnist-{RUN_ID}", "nodes": "3", "nodelist": "node-1,node-2,node-3",
        "exclusive": None, "wait-all-nodes": "1", "partition": "cpu",
        # node-1 runs two ranks pinned to 0-2 and 4-7: seven CPUs, the most any node needs.
        "mincpus": "7", "no-requeue": None, "chdir": RUN_DIR, "output": f"{RUN_DIR}/sbatch.log"}
    assert "requeue" in header(sbatch_script(launch_spec(), partition="cpu", requeue=True))


def test_one_step_per_unit_on_its_node_all_at_once_master_first():
    script = sbatch_script(launch_spec(), partition="cpu", hostnames=SHORT)
    found = steps(script)
    assert [(o["job-name"], o["nodelist"]) for _, o, _ in found] == [
        ("rank-0", "node-1"), ("rank-1", "node-1"), ("rank-2", "node-2"), ("rank-3", "node-3")]
    for _, opts, _ in found:
        assert (opts["nodes"], opts["ntasks"], opts["kill-on-bad-exit"], opts["chdir"]) == ("1", "1", "1", WORKDIR)
    # cpus-per-task counts the cpuset; --cpu-bind names its CPUs (0-2: 0b111, 1,3,5: 0b101010).
    assert [(o["cpus-per-task"], o["cpu-bind"]) for _, o, _ in found] == [
        ("3", "mask_cpu:0x7"), ("4", "mask_cpu:0xf0"), ("1", "map_cpu:5"), ("3", "mask_cpu:0x2a")]
    # Every step starts at once, the master's first: the guards keep the phases, as in every
    # mode (a later phase's unit waits in its guard until the master listens).
    lines = script.splitlines()
    assert not [line for line in lines if line.startswith("tf_listen")]
    starts = [line for line in lines if line.startswith("tf_start ")]
    assert starts == [f"tf_start $! rank-{r}" for r in range(4)]


def test_each_step_runs_its_rank_with_its_env_and_the_guard_in_the_step_shell():
    script = sbatch_script(launch_spec(extra_env={"MALLOC_CONF": "a:1,b:2", "QUOTED": "it's \"x\" $HOME"}),
                           partition="cpu", hostnames=SHORT)
    env, _, words = steps(script)[3]
    # A value with commas and quotes reaches the step whole (srun --export would split it).
    assert (env["MALLOC_CONF"], env["QUOTED"]) == ("a:1,b:2", "it's \"x\" $HOME")
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["MASTER_ADDR"]) == ("3", "4", "0", "10.0.0.11")
    assert words[:7] == ["/bin/sh", "-c", STEP_SHELL, f"{RUN_DIR}/rank-3.log", WORKDIR, "", "3 rank mnist"]
    # Pinned by taskset too, since the slurm role's task/none ignores --cpu-bind; then the guard.
    assert words[7:10] == ["taskset", "--cpu-list", "1,3,5"]
    assert words[10:15] == [PYTHON, f"{RUN_DIR}/guard.py", f"{RUN_DIR}/guard.json", "3", "--"]
    assert words[15:] == [PYTHON, "mnist.py", "--epochs", "1"]


def test_a_secret_is_named_never_written_and_read_from_the_nodes_file():
    script = sbatch_script(launch_spec(pinning=False, secret={"HF_TOKEN": "hf_s3cr3t_value"}), partition="cpu")
    assert "hf_s3cr3t_value" not in script
    for env, opts, words in steps(script):
        assert words[5] == f"{RUN_DIR}/node.secret.env"
        assert env["HF_TOKEN"] != "hf_s3cr3t_value"
        # Not pinned: the step may use the node, as in the other modes.
        assert opts["cpu-bind"] == "none" and words[7] == PYTHON


def test_the_script_is_valid_bash():
    script = sbatch_script(launch_spec(), partition="cpu")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def run_step_shell(tmp_path, workdir, secrets, *command):
    log = tmp_path / "rank-0.log"
    done = subprocess.run(["/bin/sh", "-c", STEP_SHELL, str(log), str(workdir), str(secrets), "0 rank j", *command],
                          capture_output=True, text=True)
    return done.returncode, log.read_text() if log.exists() else ""


def test_the_step_shell_logs_enters_the_workdir_and_reads_the_secret_file(tmp_path):
    secret = tmp_path / "node.secret.env"
    secret.write_text("HF_TOKEN='a b,c'\n")
    secret.chmod(stat.S_IRUSR)
    code, log = run_step_shell(tmp_path, tmp_path, secret, "sh", "-c", 'echo "$PWD|$HF_TOKEN"; exit 3')
    assert (code, log) == (3, f"{tmp_path}|a b,c\n")


def test_the_step_shell_fails_without_its_workdir_or_secret_file(tmp_path):
    code, log = run_step_shell(tmp_path, tmp_path / "gone", "", "true")
    assert code == 2 and "gone" in log
    code, log = run_step_shell(tmp_path, tmp_path, tmp_path / "no.secret.env", "true")
    assert code != 0 and "no.secret.env" in log


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_batch(tmp_path, units_commands, listen_port, stop_wait=1.0, timeout=60):
    """The batch script run by bash as sbatch would, with a stand-in srun on PATH that runs the
    step on this machine (Slurm itself runs in the slurm molecule scenario, docs/slurm.md):
    what this checks is the script's own order, waits and exit code."""
    hosts = [("node-1", "127.0.0.1", 1), ("node-2", "127.0.0.1", 1), ("node-3", "127.0.0.1", 1)]
    built = launch_spec(pinning=False, guard={"stop_grace": 0.0}, hosts=hosts)
    for unit, command in zip(built["units"], units_commands):
        unit["command"] = command
        unit["env"]["TORCHFLEET_OUT_DIR"] = str(tmp_path)
        unit["workdir"] = str(tmp_path)
    built["units"][0]["listen"] = {"host": "127.0.0.1", "port": listen_port}
    built["guard"]["stop_wait"] = stop_wait
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (bindir / "srun").chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(sbatch_script(built, partition="cpu"))
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    return subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=timeout)


def test_every_step_starts_at_once(tmp_path):
    """The script does not wait for the master's port (its guard does that for the later
    phase): each step writes when it started, and none waits for another."""
    write = f"import os, time; open('{tmp_path}/t' + os.environ['RANK'], 'w').write(str(time.time())); time.sleep(2)"
    done = run_batch(tmp_path, [[sys.executable, "-c", write]] * 3, free_port())
    assert done.returncode == 0, done.stderr
    started = [float((tmp_path / f"t{r}").read_text()) for r in range(3)]
    assert max(started) - min(started) < 1.5, started


def test_a_failed_step_ends_the_job_with_its_code_after_the_stop_wait(tmp_path):
    port = free_port()
    serve = f"import socket, time; s = socket.create_server(('127.0.0.1', {port})); time.sleep(120)"
    done = run_batch(tmp_path, [[sys.executable, "-c", serve], ["sh", "-c", "exit 7"], ["sleep", "120"]], port,
                     stop_wait=1.0, timeout=30)
    assert done.returncode == 7
    assert "step rank-1 ended with exit code 7" in done.stderr
    assert "ending the job" in done.stderr


def test_a_master_that_ends_with_code_0_without_listening_ends_the_job_as_in_the_process_mode(tmp_path):
    """A script with no rendezvous (it prints and exits): the job ends 0, every step having
    run, as it does in the process and container modes; the batch script did wait for a port
    that never listened before (130 s, then exit 3)."""
    done = run_batch(tmp_path, [["sh", "-c", "echo hello; exit 0"], ["true"], ["true"]], free_port(), timeout=30)
    assert done.returncode == 0, done.stderr
    assert all((tmp_path / f"rank-{r}.log").exists() for r in range(3))
    assert (tmp_path / "rank-0.log").read_text() == "hello\n"


def test_what_slurm_cannot_run_is_refused_naming_the_variable():
    built = launch_spec()
    built["units"][2]["env"]["SLURM_CPU_BIND"] = "none"
    with pytest.raises(InventoryError, match="SLURM_CPU_BIND") as err:
        sbatch_script(built, partition="cpu")
    assert (err.value.host, err.value.variable) == ("node-2.example", "launch_extra_env")
    built = launch_spec()
    built["units"][0].update(kind="container", env=dict(built["units"][0]["env"], TORCHFLEET_OUT_DIR="/out"))
    with pytest.raises(InventoryError, match="container") as err:
        sbatch_script(built, partition="cpu")
    assert err.value.variable == "launch_mode"
    with pytest.raises(InventoryError) as err:
        sbatch_script(launch_spec(), partition="No Such")
    assert err.value.variable == "slurm_partition"


def test_cpu_bind():
    assert (cpu_bind(None), cpu_bind("3"), cpu_bind("0-1,8")) == ("none", "map_cpu:3", "mask_cpu:0x103")


# Every state of squeue's JOB STATE CODES (Slurm 22.05's man page), long name and code.
SLURM_STATES = {
    "BOOT_FAIL": "BF", "CANCELLED": "CA", "COMPLETED": "CD", "CONFIGURING": "CF", "COMPLETING": "CG",
    "DEADLINE": "DL", "FAILED": "F", "NODE_FAIL": "NF", "OUT_OF_MEMORY": "OOM", "PENDING": "PD",
    "PREEMPTED": "PR", "RUNNING": "R", "RESV_DEL_HOLD": "RD", "REQUEUE_FED": "RF", "REQUEUE_HOLD": "RH",
    "REQUEUED": "RQ", "RESIZING": "RS", "REVOKED": "RV", "SIGNALING": "SI", "SPECIAL_EXIT": "SE",
    "STAGE_OUT": "SO", "STOPPED": "ST", "SUSPENDED": "S", "TIMEOUT": "TO",
}
ENDED = {"COMPLETED": "succeeded", "CANCELLED": "stopped", "REVOKED": "stopped", "FAILED": "failed",
         "TIMEOUT": "failed", "NODE_FAIL": "failed", "BOOT_FAIL": "failed", "OUT_OF_MEMORY": "failed",
         "DEADLINE": "failed", "PREEMPTED": "failed"}


@pytest.mark.parametrize("name, code", sorted(SLURM_STATES.items()))
def test_every_slurm_job_state_maps_by_name_and_code(name, code):
    expected = ENDED.get(name, "running")
    assert job_state(name)[0] == expected
    assert job_state(code) == job_state(name) == job_state(name.lower())
    assert job_state(name)[1].startswith(name)


def test_every_mapped_state_is_one_of_slurms():
    assert set(JOB_STATES) == set(SLURM_STATES)


def test_an_unknown_or_decorated_state_never_crashes():
    assert job_state("CANCELLED by 0")[0] == "stopped"  # sacct
    assert job_state("FAILED+")[0] == "failed"
    for odd in ("LAUNCH_FAILED", "", None, "???"):
        assert job_state(odd)[0] == "unknown"


def test_squeue_without_accounting():
    # What `squeue --noheader --states=all --format=...` printed on the slurm scenario's
    # cluster (no accounting): a pending job that cannot start, a job ending, one failed.
    text = ("1|PENDING|PartitionNodeLimit|n/a||wrap\n"
            "18|COMPLETING|NonZeroExitCode|node-1|node-[1,3]|torchfleet-mnist-r7\n"
            "19|CANCELLED|None|node-1|node-[1-3]|torchfleet-mnist-r8\n"
            "slurm_load_jobs error: Invalid job id specified\n")
    jobs = parse_squeue(text)
    assert [(j["job_id"], j["state"], j["batch_host"], j["nodes"]) for j in jobs] == [
        ("1", "running", "", ""), ("18", "running", "node-1", "node-[1,3]"), ("19", "stopped", "node-1", "node-[1-3]")]
    assert "cannot start it as asked" in jobs[0]["text"]
    assert squeue_command(19)[-2:] == ["--jobs=19", "--format=%i|%T|%r|%B|%N|%j"]


# sbatch's own words, as the slurm scenario's slurmctld (22.05.8) said them.
REFUSALS = [
    ("sbatch: error: invalid partition specified: nope\n"
     "sbatch: error: Batch job submission failed: Invalid partition name specified", "slurm_partition", None),
    ("sbatch: error: Batch job submission failed: Invalid node name specified", "slurm_group", "node-3.example"),
    ("sbatch: error: CPU count per node can not be satisfied\n"
     "sbatch: error: Batch job submission failed: Requested node configuration is not available",
     "cpu_pinning_cores_per_rank", "node-1.example"),
    ("srun: error: Unable to create step for job 7: More processors requested than permitted",
     "cpu_pinning_cores_per_rank", "node-1.example"),
    ("sbatch: error: Memory specification can not be satisfied\n"
     "sbatch: error: Batch job submission failed: Requested node configuration is not available",
     "slurm_memory_reserve_mib", None),
]


@pytest.mark.parametrize("stderr, variable, host", REFUSALS)
def test_slurms_refusals_name_the_variable(stderr, variable, host):
    err = sbatch_error(stderr, partition="nope", spec=launch_spec(), hostnames={**SHORT, "node-3.example": "node-9"},
                       known=["node-1", "node-2", "node-3"])
    assert (err.variable, err.host) == (variable, host)
    assert stderr.splitlines()[-1] in str(err) and not str(err).startswith(stderr.splitlines()[-1])


def test_an_unknown_refusal_still_names_the_mode():
    err = sbatch_error("sbatch: error: something new")
    assert err.variable == "launch_mode" and "something new" in str(err)
