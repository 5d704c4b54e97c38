"""launch_mode slurm (torchfleet.modes.slurm): its input, its spec with the sbatch script in
the master's files, its start in one phase, its files collected and its summary. The script
itself is test_slurm_script.py's; Slurm runs it in the slurm molecule scenario."""

import shlex
import subprocess
from pathlib import Path

import pytest

from harness.inputs import launch_values, role_guard
from ansible_collections.torchfleet.cluster.plugins.module_utils import rank_files
from torchfleet import inputs, modes, report, spec
from torchfleet.errors import InventoryError
from torchfleet.ranks import rank_table
from torchfleet.modes.slurm import JOB_ID, SCRIPT, STEP_SHELL
from torchfleet import run_vocab

HOSTS = [("node-1.example", "10.0.0.11", 2), ("node-2.example", "10.0.0.12", 1)]
SLURM_NAMES = {"node-1.example": "n1", "node-2.example": "n2"}


def values(**over):
    return launch_values(**{"launch_mode": "slurm", "launch_omp_num_threads": 1, "launch_slurm_partition": "cpu",
                            "launch_python": "/opt/torchfleet/venv/bin/python", **over})


def build(run_id="r1", **over):
    table = rank_table([{"name": h, "address": a, "procs": p} for h, a, p in HOSTS], 29500)
    nodes = {}
    for host, address, _ in HOSTS:
        checked = inputs.node_input(values(**over), host)
        probe = {"hostname": SLURM_NAMES[host]}
        nodes[host] = {"address": address, "interface": "eth0", "nproc": 2, "pinning": [],
                       **modes.get("slurm").node_facts(host, table, probe),
                       "settings": checked["settings"], "env_public": checked["env_public"],
                       "env_shown": checked["env_shown"]}
    job = {"run_id": run_id, "job": "mnist", "mode": "slurm", "image": "img", "args": ["--epochs", "1"],
           "workload_argv": ["python3", "mnist.py"], "guard": role_guard()}
    return spec.build(job, table, nodes)


def step_commands(script):
    """Each srun step's command, the words after the step shell's four."""
    found = []
    for chunk in script.replace("\\\n", " ").splitlines():
        words = shlex.split(chunk) if not chunk.startswith("#") and " srun " in f" {chunk} " else []
        if words:
            at = words.index(STEP_SHELL)
            found.append(words[at + 5:-1])
    return found


def test_the_input_asks_the_launch_role_to_start_a_scheduler_job_of_bare_processes():
    checked = inputs.node_input(values(), "node-1.example")
    assert (checked["unit_kind"], checked["bare"], checked["settings"]["slurm_partition"]) == ("scheduler", True, "cpu")
    assert "launch_slurm_partition" in inputs.input_variables()


def test_the_spec_runs_one_guarded_process_per_rank_in_the_nodes_python():
    built = build()
    assert (built.mode, built.unit_kind, built.image, built.secret_env_file) == ("slurm", "scheduler", None, True)
    assert [(u.name, u.host, u.kind, u.ranks, u.phase) for u in built.units] == [
        ("rank-0", "node-1.example", "process", [0], 0), ("rank-1", "node-1.example", "process", [1], 0),
        ("rank-2", "node-2.example", "process", [2], 1)]
    unit = built.units[2]
    assert unit.command[:2] == ["/opt/torchfleet/venv/bin/python", "/var/lib/torchfleet/runs/r1/guard.py"]
    assert unit.argv == ["/opt/torchfleet/venv/bin/python", "mnist.py", "--epochs", "1"]
    assert (unit.env["RANK"], unit.env["WORLD_SIZE"], unit.env["MASTER_ADDR"]) == ("2", "3", "10.0.0.11")


def test_the_masters_run_folder_gets_the_sbatch_script_of_the_whole_spec():
    built = build()
    script = built.files["node-1.example"][SCRIPT]
    assert SCRIPT not in built.files["node-2.example"]
    # Every unit's guarded command, on its node by its Slurm name, in the given partition.
    assert step_commands(script) == [u.command for u in built.units]
    assert "#SBATCH --nodelist=n1,n2" in script and "#SBATCH --partition=cpu" in script
    assert "#SBATCH --output=/var/lib/torchfleet/runs/r1/sbatch.log" in script
    # The same run id gives the same script: the plan's is the one that runs.
    assert build().files["node-1.example"][SCRIPT] == script
    assert build("r2").files["node-1.example"][SCRIPT] != script
    # The plan (the redacted spec) shows it as it runs.
    assert spec.redacted(built)["files"]["node-1.example"][SCRIPT] == script


def test_a_partition_slurm_cannot_have_is_refused_naming_the_variable():
    with pytest.raises(InventoryError) as err:
        build(launch_slurm_partition="Not A Partition")
    assert err.value.variable == "slurm_partition"


def test_every_node_starts_at_once_and_the_worker_after_the_master_listens():
    """The script orders the steps, and the worker's guard waits for the master's listen too."""
    built = spec.redacted(build())
    assert spec.unit_index(built["units"]) == {"node-1.example": [0, 1], "node-2.example": [2]}
    assert [u["after"] for u in built["guard"]["units"]] == [[], [], [0]]


def test_the_run_brings_back_the_script_its_job_id_and_the_batch_log_and_the_summary_names_the_job(tmp_path):
    view = spec.redacted(build())
    master = report.run_files(view, "node-1.example")
    for name in (SCRIPT, JOB_ID, "sbatch.log", "rank-0.log", "rank-1.log"):
        assert (name, name) in master
    assert (SCRIPT,) * 2 not in report.run_files(view, "node-2.example")
    assert modes.get("slurm").summary(tmp_path) == {"slurm_job_id": None}
    (tmp_path / JOB_ID).write_text("42\n")
    assert modes.get("slurm").summary(tmp_path) == {"slurm_job_id": "42"}


def test_a_step_leaves_the_files_a_bare_process_leaves_so_the_node_sees_it_as_one(tmp_path):
    """What the node-side modules (rank_processes, wait_ranks, the stop) read of a step."""
    log = tmp_path / "rank-2.log"
    done = subprocess.run(["/bin/sh", "-c", STEP_SHELL, str(log), str(tmp_path), "", "2 rank mnist",
                           "sh", "-c", "echo trained; exit 3"], capture_output=True, text=True)
    assert done.returncode == 3
    [entry] = rank_files.find(None, str(tmp_path))
    assert (entry["name"], entry["rank"], entry["role"], entry["exit_code"], entry["running"]) == (
        "rank-2", 2, "rank", 3, False)
    assert Path(entry["log"]).read_text() == "trained\n"
    assert rank_files.find(None, str(tmp_path), job="other") == []


def test_the_start_knows_every_kind_of_unit_a_mode_asks_for():
    from ansible_collections.torchfleet.cluster.plugins.action import start_units

    jobs = [{"torchrun_runtime": runtime} for runtime in ("container", "process")]
    kinds = {modes.get(name).unit_kind(job) for name in modes.names() for job in jobs}
    assert "scheduler" in kinds
    assert kinds <= set(start_units.KINDS)
    # A mode's units are a scheduler's exactly when the mode has a scheduler.
    assert {name for name in modes.names() if modes.get(name).unit_kind(jobs[0]) == "scheduler"} == \
        {name for name in modes.names() if modes.get(name).scheduler is not None}


def test_the_roles_launch_mode_choices_are_the_registered_modes():
    import yaml

    root = Path(__file__).resolve().parents[2] / "roles" / "launch" / "meta" / "argument_specs.yml"
    options = yaml.safe_load(root.read_text())["argument_specs"]["main"]["options"]
    assert sorted(options["launch_mode"]["choices"]) == sorted(modes.names())
