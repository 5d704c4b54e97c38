import json
import os
import shlex
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from harness import role_guard
from torchfleet import inputs, spec
from torchfleet.errors import InventoryError
from torchfleet.slurm import (
    JOB_STATES, STEP_SHELL, check_names, conf_nodes, controller, cpu_bind, hardware, job_state, memory_mib, node_line,
    parse_squeue, sbatch_error, sbatch_script, squeue_command, unready)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"  # tests/fixtures/README.md says where each comes from
# /proc/meminfo of this test machine (24 GiB), its first lines.
MEMINFO = "MemTotal:       24684096 kB\nMemFree:        16521388 kB\nMemAvailable:   23748256 kB\n"


def lscpu(name):
    return (FIXTURES / f"lscpu-{name}.txt").read_text()


def node(name, rank=None, machine="1s-2c-noht", hostname=None, address=None):
    return {"name": name, "node_rank": rank, "hostname": hostname or name.split(".")[0],
            "address": address or f"10.0.0.{name.split('.')[0][-1]}", "lscpu": lscpu(machine), "allowed": None, "meminfo": MEMINFO}


@pytest.mark.parametrize("machine, sockets, cores, threads", [
    ("1s-2c-noht", 1, 2, 1),  # this machine: `slurmd -C` on it says Sockets 1, CoresPerSocket 2, ThreadsPerCore 1
    ("intel-2s-ht", 2, 4, 2),
    ("amd-epyc-nps2", 2, 8, 2),  # NPS2: NUMA nodes are not sockets
    ("xeon-e5-2683v3-2s-cod", 2, 14, 1),
    ("opteron-6276-4s-8n", 4, 16, 1),
    ("xeon-x7550-4s-nonode", 4, 8, 2),  # round-robin numbering, half the CPUs in no NUMA node
    ("power7-smt4", 16, 1, 4),
])
def test_hardware_counts_whole_sockets_cores_and_threads(machine, sockets, cores, threads):
    found = hardware("n", lscpu(machine), MEMINFO)
    assert (found["sockets"], found["cores_per_socket"], found["threads_per_core"]) == (sockets, cores, threads)
    assert found["cpus"] == sockets * cores * threads
    assert found["real_memory"] == 24105  # 24684096 kB // 1024


def test_offline_cpus_under_claim_and_never_over():
    # 4 sockets x 2 cores x 2 threads with CPUs 2, 5, 13 and 14 offline: 12 online CPUs on 7
    # cores. slurmd counts 7 // 4 cores per socket and 12 // 7 threads; the line claims no more.
    found = hardware("n", lscpu("xeon-4s-ht-offline"), MEMINFO)
    assert (found["sockets"], found["cores_per_socket"], found["threads_per_core"], found["cpus"]) == (4, 1, 1, 4)


def test_only_the_cpus_the_node_allows_count():
    # A cpuset of one socket's CPUs (socket 0 of the 2-socket machine: CPUs 0-3 and 8-11).
    found = hardware("n", lscpu("intel-2s-ht"), MEMINFO, allowed=[0, 1, 2, 3, 8, 9, 10, 11])
    assert (found["sockets"], found["cores_per_socket"], found["threads_per_core"], found["cpus"]) == (1, 4, 2, 8)


def test_memory_reserve_and_bad_meminfo():
    assert hardware("n", lscpu("1s-2c-noht"), MEMINFO, reserve_mib=1024)["real_memory"] == 24105 - 1024
    assert memory_mib("MemTotal: 2048 kB\n") == 2
    with pytest.raises(InventoryError, match="slurm_memory_reserve_mib=30000 leaves no memory") as err:
        hardware("n", lscpu("1s-2c-noht"), MEMINFO, reserve_mib=30000)
    assert (err.value.host, err.value.variable) == ("n", "slurm_memory_reserve_mib")
    with pytest.raises(InventoryError, match="host n: its /proc/meminfo has no MemTotal"):
        memory_mib("MemFree: 1 kB\n", "n")


def test_controller_is_node_rank_0_unless_chosen():
    hosts = [{"name": "a"}, {"name": "b"}, {"name": "c"}]
    assert controller(hosts) == "a"
    assert controller(hosts, "") == "a"
    assert controller([dict(h, node_rank=r) for h, r in zip(hosts, [2, 0, 1])]) == "b"
    assert controller(hosts, "c") == "c"


def test_a_controller_outside_the_nodes_is_refused_naming_the_variable():
    with pytest.raises(InventoryError) as err:
        controller([{"name": "a"}, {"name": "b"}], "login-1")
    assert err.value.variable == "slurm_controller"
    assert str(err.value) == "slurm_controller='login-1' is not one of the Slurm nodes (a, b)"


@pytest.mark.parametrize("cluster, partition, variable", [
    ("Torchfleet", "batch", "slurm_cluster_name"),
    ("tf", "my batch", "slurm_partition"),
    ("tf", "", "slurm_partition"),
])
def test_names_slurm_would_reject_are_refused(cluster, partition, variable):
    with pytest.raises(InventoryError, match=f"^{variable}=") as err:
        check_names(cluster, partition)
    assert err.value.variable == variable


def test_conf_nodes_in_node_rank_order_with_the_controller():
    nodes = [node("n1.example.org", 1), node("n2.example.org", 0, machine="intel-2s-ht"), node("n3.example.org", 2)]
    conf = conf_nodes(nodes)
    assert conf["controller"] == {"name": "n2.example.org", "hostname": "n2", "address": "10.0.0.2"}
    assert conf["node_list"] == "n2,n1,n3"
    assert conf["lines"][0] == ("NodeName=n2 NodeAddr=10.0.0.2 CPUs=16 Sockets=2 CoresPerSocket=4 ThreadsPerCore=2 "
                                "RealMemory=24105 State=UNKNOWN")
    assert conf_nodes(nodes, "n3.example.org")["controller"]["hostname"] == "n3"
    assert node_line(conf["nodes"][1]).startswith("NodeName=n1 NodeAddr=10.0.0.1 CPUs=2 Sockets=1 ")


def test_two_nodes_with_one_hostname_are_refused():
    with pytest.raises(InventoryError, match="host b: has the hostname 'node', as a does") as err:
        conf_nodes([node("a", hostname="node"), node("b", hostname="node")])
    assert err.value.variable == "slurm_group"


def test_unready_names_each_node_that_does_not_serve_jobs():
    sinfo = "node-1 idle\nnode-2 down*\nnode-1 idle\nnode-4 allocated\nnode-5 mixed\nnode-6 drained\n"
    assert unready(sinfo, ["node-1", "node-4", "node-5"]) == {}
    assert unready(sinfo, ["node-1", "node-2", "node-3", "node-6"]) == {
        "node-2": "down*", "node-3": "missing", "node-6": "drained"}


PLAY = """
- name: Check the slurm role's input as site.yml's first play does
  hosts: torchfleet_nodes
  gather_facts: false
  tasks:
    - name: Check it
      ansible.builtin.include_role:
        name: slurm
        tasks_from: validate
"""


def validate(tmp_path, **variables):
    """site.yml's input check of the slurm role, on two hosts that are never contacted."""
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "hosts.ini").write_text("[torchfleet_nodes]\nn1 ansible_connection=local\nn2 ansible_connection=local\n")
    args = [str(Path(sys.executable).parent / "ansible-playbook"), str(tmp_path / "play.yml"),
            "-i", str(tmp_path / "hosts.ini"),
            "-e", json.dumps({"ansible_python_interpreter": sys.executable, **variables})]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))


@pytest.mark.parametrize("variables, message", [
    ({"slurm_controller": "login-1"}, "slurm_controller='login-1' is not one of the Slurm nodes (n1, n2)"),
    ({"slurm_partition": "My Batch"}, "slurm_partition='My Batch' must be lower-case letters"),
    ({"slurm_slurmd_port": 6817}, "slurm_slurmd_port=6817 is slurm_slurmctld_port too"),
])
def test_bad_input_is_refused_before_any_node_changes(tmp_path, variables, message):
    result = validate(tmp_path, **variables)
    out = " ".join(result.stdout.split())
    assert result.returncode != 0
    assert message in out, out[-2000:]
    assert f'"variable": "{next(iter(variables))}"' in out or f"variable: {next(iter(variables))}" in out, out[-2000:]


def test_good_input_passes(tmp_path):
    result = validate(tmp_path, slurm_controller="n2")
    assert result.returncode == 0, result.stdout[-2000:]


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


def test_one_step_per_unit_on_its_node_master_first_then_the_rest_once_it_listens():
    script = sbatch_script(launch_spec(), partition="cpu", hostnames=SHORT)
    found = steps(script)
    assert [(o["job-name"], o["nodelist"]) for _, o, _ in found] == [
        ("rank-0", "node-1"), ("rank-1", "node-1"), ("rank-2", "node-2"), ("rank-3", "node-3")]
    for _, opts, _ in found:
        assert (opts["nodes"], opts["ntasks"], opts["kill-on-bad-exit"], opts["chdir"]) == ("1", "1", "1", WORKDIR)
    # cpus-per-task counts the cpuset; --cpu-bind names its CPUs (0-2: 0b111, 1,3,5: 0b101010).
    assert [(o["cpus-per-task"], o["cpu-bind"]) for _, o, _ in found] == [
        ("3", "mask_cpu:0x7"), ("4", "mask_cpu:0xf0"), ("1", "map_cpu:5"), ("3", "mask_cpu:0x2a")]
    # The master's ranks start, then the script waits for rank 0's MASTER_PORT, then the others.
    lines = script.splitlines()
    wait = next(i for i, line in enumerate(lines) if line.startswith("tf_listen "))
    assert lines[wait] == "tf_listen 10.0.0.11 29500 rank-0 0 || tf_end 1"
    starts = [i for i, line in enumerate(lines) if line.startswith("tf_start ")]
    assert [lines[i] for i in starts] == [f"tf_start $! rank-{r}" for r in range(4)]
    assert starts[1] < wait < starts[2]


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


def test_a_later_phase_starts_only_once_the_master_listens(tmp_path):
    port = free_port()
    listen = (f"import socket, time; time.sleep(2); open('{tmp_path}/t0', 'w').write(str(time.time())); "
              f"s = socket.create_server(('127.0.0.1', {port})); time.sleep(2)")
    later = f"import time; open('{tmp_path}/t' + __import__('os').environ['RANK'], 'w').write(str(time.time()))"
    done = run_batch(tmp_path, [[sys.executable, "-c", listen]] + [[sys.executable, "-c", later]] * 2, port)
    assert done.returncode == 0, done.stderr
    listened = float((tmp_path / "t0").read_text())
    assert all(float((tmp_path / f"t{r}").read_text()) > listened for r in (1, 2))
    assert (tmp_path / "rank-1.log").exists() and (tmp_path / "rank-2.log").exists()


def test_a_failed_step_ends_the_job_with_its_code_after_the_stop_wait(tmp_path):
    port = free_port()
    serve = f"import socket, time; s = socket.create_server(('127.0.0.1', {port})); time.sleep(120)"
    done = run_batch(tmp_path, [[sys.executable, "-c", serve], ["sh", "-c", "exit 7"], ["sleep", "120"]], port,
                     stop_wait=1.0, timeout=30)
    assert done.returncode == 7
    assert "step rank-1 ended with exit code 7" in done.stderr
    assert "ending the job" in done.stderr


def test_a_master_that_ends_before_it_listens_fails_the_job_at_once(tmp_path):
    done = run_batch(tmp_path, [["sh", "-c", "exit 0"], ["true"], ["true"]], free_port(), timeout=30)
    assert done.returncode == 1 and "rank-0 ended before it listened" in done.stderr
    assert not (tmp_path / "rank-1.log").exists()


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
