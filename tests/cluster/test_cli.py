"""The torchfleet command against the same docker hosts: exit codes and --json output."""

import json
import os
import subprocess

from .conftest import ENV, NAME, SUBNET, TORCHFLEET, cli, node_sh


def test_cli_commands_exit_codes_and_json(provisioned, inventory_dir, runs_dir, crashing_workload, tmp_path):
    inv = ["-i", str(inventory_dir)]
    run = lambda *a: cli(*a, inventory_dir=inventory_dir, runs_dir=runs_dir)  # noqa: E731

    code, out = run("local", "up", "--nodes", "2", "--name", NAME, "--subnet", SUBNET,
                    "--inventory-dir", str(inventory_dir), "--json")
    assert code == 0 and out["ok"] and out["inventory"] == str(inventory_dir)
    assert all(h["changed"] == 0 for h in out["result"]["hosts"].values()), out["result"]["hosts"]

    code, out = run("plan", *inv, "--json")
    assert code == 0 and out["plan"]["world_size"] == 2
    assert [r["host"] for r in out["plan"]["ranks"]] == ["node-1", "node-2"]

    dup = tmp_path / "dup.yml"
    dup.write_text("all:\n  hosts:\n    node-1: {torchfleet_node_rank: 0}\n    node-2: {torchfleet_node_rank: 0}\n")
    code, out = run("plan", *inv, "-i", str(dup), "--json")
    assert code == 2 and not out["ok"]
    assert out["error"] | {"message": None} == {
        "type": "InventoryError", "host": "node-2", "variable": "torchfleet_node_rank",
        "task": "Number the ranks and pick MASTER_ADDR, each node at its cluster address (or overlay address)",
        "message": None}

    # `torchfleet up` and its document: the provisioned fixture's second run.
    code, out = run("launch", *inv, "--json", "--run-id", "cli-ok", "--", "--epoch", "1", "--no-cuda",
                    "--log-interval", "2")
    assert code == 0 and out["run"]["ok"] and out["run"]["run_id"] == "cli-ok"
    assert [r["exit_code"] for r in out["run"]["ranks"]] == [0, 0]
    assert (runs_dir / "cli-ok" / "summary.json").is_file()

    code, out = run("launch", *inv, "--json", "--workload", str(crashing_workload))
    assert code == 1 and out["error"]["type"] == "JobFailed" and out["error"]["host"] == "node-2"
    assert out["run"]["failed_rank"] == 1

    code, out = run("logs", *inv, "cli-ok", "--tail", "3", "--json")
    assert code == 0 and set(out["logs"]) == {"0", "1"}
    assert all(len(log["text"].splitlines()) == 3 for log in out["logs"].values())
    code, out = run("logs", *inv, "cli-ok", "--rank", "7", "--json")
    assert code == 4 and "no rank 7" in out["error"]["message"]

    node_sh("node-1", "docker run -d --label torchfleet.run=stray torchfleet/train:2.13.0-cpu sleep 600")
    code, out = run("down", *inv, "--json")
    assert code == 0 and out["result"]["hosts"]["node-1"]["changed"] == 1


def test_cli_usage_errors_exit_2():
    done = subprocess.run([TORCHFLEET, "launch", "--master-port", "notaport"], capture_output=True, text=True)
    assert done.returncode == 2 and "invalid int value" in done.stderr


def test_plan_warns_about_names_that_look_like_torchfleets(provisioned, inventory_dir, runs_dir, tmp_path):
    guide = tmp_path / "guide.yml"
    guide.write_text("all:\n  hosts:\n    node-2: {rank: 1, cpuset: '0-1', launch_master_prot: 29511}\n")
    inv = ["-i", str(inventory_dir), "-i", str(guide)]
    code, out = cli("plan", *inv, "--json", inventory_dir=inventory_dir, runs_dir=runs_dir)
    assert code == 0
    meant = {(w["host"], w["variable"]): w["meant"] for w in out["plan"]["warnings"]}
    assert meant == {("node-2", "rank"): "torchfleet_node_rank", ("node-2", "cpuset"): "cpu_pinning_cpusets",
                     ("node-2", "launch_master_prot"): "launch_master_port"}
    # They were ignored, as the warnings say: node-2 is still node rank 1 and unpinned.
    assert [(r["host"], r["cpuset"]) for r in out["plan"]["ranks"]] == [("node-1", None), ("node-2", None)]
    env = dict(os.environ, **ENV, TORCHFLEET_RUNS_DIR=str(runs_dir))
    shown = subprocess.run([TORCHFLEET, "plan", "-q", *inv], capture_output=True, text=True, env=env, timeout=600)
    assert shown.returncode == 0
    assert "rank is not a torchfleet variable and is ignored; did you mean torchfleet_node_rank?" in shown.stderr
    assert "did you mean cpu_pinning_cpusets?" in shown.stderr


def test_errors_are_classed_by_what_failed_not_by_where(provisioned, inventory_dir, runs_dir):
    inv = ["-i", str(inventory_dir)]
    run = lambda *a: cli(*a, inventory_dir=inventory_dir, runs_dir=runs_dir)  # noqa: E731

    # Input: one plain sentence naming the variable the user set, exit 2.
    code, out = run("plan", *inv, "--json", "-e", "cpu_pinning=true", "-e", "cpu_pinning_cpusets=['20-24']")
    assert code == 2 and out["error"]["type"] == "InventoryError"
    assert out["error"]["variable"] == "cpu_pinning_cpusets" and out["error"]["host"] in ("node-1", "node-2")
    message = out["error"]["message"]
    assert message.startswith(f"host {out['error']['host']}: cpu_pinning_cpusets[0]='20-24' names CPUs")
    assert "Task failed" not in message and "filter" not in message and "\n" not in message

    # An option the mode cannot apply is refused before anything starts, naming both.
    code, out = run("plan", *inv, "--json", "-e", "launch_mode=process", "-e", "launch_extra_volumes=['/srv:/srv']")
    assert code == 2 and out["error"]["variable"] == "launch_extra_volumes"
    assert "launch_mode=process" in out["error"]["message"]

    # A node that fails a command: exit 3, naming the node.
    code, out = run("launch", *inv, "--json", "-e", "launch_image=torchfleet/absent:0")
    assert code == 3 and out["error"]["type"] == "TaskFailed"
    assert "launch_image torchfleet/absent:0 is not on this node" in out["error"]["message"]
    node_sh("node-2", "mv /usr/bin/lscpu /usr/bin/lscpu.real && printf '#!/bin/sh\\nexit 1\\n' > /usr/bin/lscpu "
                      "&& chmod +x /usr/bin/lscpu")
    try:
        code, out = run("plan", *inv, "--json", "-e", "cpu_pinning=true")
    finally:
        node_sh("node-2", "mv /usr/bin/lscpu.real /usr/bin/lscpu")
    assert code == 3 and out["error"]["type"] == "TaskFailed" and out["error"]["host"] == "node-2"


def test_a_run_id_is_never_reused(provisioned, inventory_dir, runs_dir):
    (runs_dir / "taken").mkdir()
    (runs_dir / "taken" / "rank-0.log").write_text("an earlier run's log\n")
    code, out = cli("launch", "-i", str(inventory_dir), "--json", "--run-id", "taken",
                    inventory_dir=inventory_dir, runs_dir=runs_dir)
    assert code == 2 and out["error"]["variable"] == "launch_run_id" and "is taken" in out["error"]["message"]
    assert (runs_dir / "taken" / "rank-0.log").read_text() == "an earlier run's log\n"
    assert node_sh("node-1", "ls /var/lib/torchfleet/runs | grep -cx taken || true").strip() == "0"


def test_a_bad_secret_name_is_input_named_without_its_value(provisioned, inventory_dir, runs_dir):
    code, out = cli("plan", "-i", str(inventory_dir), "--json",
                    "-e", 'launch_secret_env={"bad-name": "tfsecret-never-shown"}',
                    inventory_dir=inventory_dir, runs_dir=runs_dir)
    assert code == 2 and out["error"]["variable"] == "launch_secret_env"
    assert "'bad-name' is not an environment variable name" in out["error"]["message"]
    assert "tfsecret-never-shown" not in json.dumps(out)
