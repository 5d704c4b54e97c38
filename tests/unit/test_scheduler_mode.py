"""A scheduler mode added through the interface alone: tests/fixtures/modes/toybatch.py, a
package's module that names its mode in the entry point group torchfleet.modes, with a toy
batch scheduler (torchfleet.modes.Scheduler). The launch role's generic action, scheduler_job,
tests, submits, describes and cancels its job on a node without knowing of it: nothing of
torchfleet names the mode, and Ansible's process finds it only by its entry point."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import ROOT
from harness.inputs import launch_values, role_guard
from torchfleet import inputs, modes, spec
from torchfleet.ranks import rank_table

FIXTURE = ROOT / "tests" / "fixtures" / "modes"


@pytest.fixture
def toybatch():
    found = importlib.util.spec_from_file_location("toybatch", FIXTURE / "toybatch.py")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)  # registers the mode here, as the entry point does in Ansible's
    yield module
    modes._MODES.pop("toybatch")


def build(tmp_path):
    hosts = [("node-1", "10.0.0.11", 1), ("node-2", "10.0.0.12", 1)]
    table = rank_table([{"name": h, "address": a, "procs": p} for h, a, p in hosts], 29500)
    nodes = {}
    for host, address, _ in hosts:
        checked = inputs.node_input(launch_values(launch_mode="toybatch", launch_python=sys.executable,
                                                  launch_node_dir=str(tmp_path)), host)
        nodes[host] = {"address": address, "interface": "eth0", "nproc": 2, "pinning": [],
                       "settings": checked["settings"], "env_public": checked["env_public"],
                       "env_shown": checked["env_shown"]}
    job = {"run_id": "r1", "job": "toy", "mode": "toybatch", "image": None, "args": [],
           "workload_argv": ["python3", "t.py"], "guard": role_guard()}
    return spec.build(job, table, nodes).to_dict()


PLAY = """
- hosts: localhost
  gather_facts: false
  vars_files: [SPEC]
  tasks:
    - name: Ask the scheduler whether it would take the job
      torchfleet.cluster.scheduler_job: {state: tested, run_dir: RUN, spec: "{{ spec }}"}
      register: tested
    - name: Submit it
      torchfleet.cluster.scheduler_job: {state: submitted, run_dir: RUN, spec: "{{ spec }}", timeout: 10}
      register: submitted
    - name: Look at it
      torchfleet.cluster.scheduler_job: {state: described, run_dir: RUN, mode: toybatch}
      register: described
    - name: Cancel it
      torchfleet.cluster.scheduler_job: {state: cancelled, run_dir: RUN, mode: toybatch, timeout: 10}
      register: cancelled
    - name: Look again
      torchfleet.cluster.scheduler_job: {state: described, run_dir: RUN, mode: toybatch}
      register: gone
    - name: Keep what each step said
      ansible.builtin.copy:
        content: "{{ {'tested': tested, 'submitted': submitted, 'described': described, 'cancelled': cancelled,
                      'gone': gone} | to_json }}"
        dest: OUT
        mode: "0644"
"""


def test_a_scheduler_mode_added_through_the_interface_alone_is_tested_submitted_and_cancelled(toybatch, tmp_path):
    built = build(tmp_path)
    assert built["unit_kind"] == "scheduler" and toybatch.SCRIPT in built["files"]["node-1"]
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    # The job the toy scheduler runs: a process that outlives the submission, until cancelled.
    (run / toybatch.SCRIPT).write_text("exec sleep 300\n")
    (tmp_path / "spec.json").write_text(json.dumps({"spec": built}))
    (tmp_path / "play.yml").write_text(PLAY.replace("SPEC", str(tmp_path / "spec.json")).replace("RUN", str(run))
                                       .replace("OUT", str(tmp_path / "out.json")))
    (tmp_path / "inventory.ini").write_text(f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n")
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               PYTHONPATH=os.pathsep.join([str(FIXTURE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(tmp_path / "inventory.ini"),
                           str(tmp_path / "play.yml")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = json.loads((tmp_path / "out.json").read_text())
    pid = (run / "toybatch-job-id").read_text().strip()
    assert said["tested"]["said"] == "would run 2 units"
    assert said["submitted"]["job_id"] == pid and said["submitted"]["changed"]
    assert said["described"]["job"] == {"job_id": pid, "state": "running", "text": "running"}
    assert said["cancelled"]["changed"] and said["cancelled"]["listed"] == []
    assert said["gone"]["job"] is None
    # The job's process is gone, as ps sees it.
    assert subprocess.run(["ps", "-p", pid], capture_output=True).returncode != 0


def test_nothing_of_torchfleet_names_the_toy_mode():
    tree = [p for folder in ("torchfleet", "plugins", "roles", "playbooks") for p in (ROOT / folder).rglob("*")
            if p.is_file() and p.suffix in (".py", ".yml")]
    assert [str(p.relative_to(ROOT)) for p in tree if "toybatch" in p.read_text()] == []


def test_the_launch_role_reaches_a_scheduler_only_through_its_generic_action():
    tasks = ROOT / "roles" / "launch" / "tasks"
    text = "\n".join(p.read_text() for p in sorted(tasks.glob("*.yml")))
    assert "slurm" not in text.lower()
    assert text.count("torchfleet.cluster.scheduler_job:") >= 4  # check, start, end, down (and replace)
