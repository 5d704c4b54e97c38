"""The torchfleet command against the same docker hosts: exit codes and --json output."""

import json
import os
import subprocess
import sys
from pathlib import Path

from .conftest import ENV, NAME, SUBNET, node_sh

TORCHFLEET = str(Path(sys.executable).parent / "torchfleet")


def cli(*args, inventory_dir, runs_dir):
    env = dict(os.environ, **ENV, TORCHFLEET_RUNS_DIR=str(runs_dir))
    done = subprocess.run([TORCHFLEET, *args], capture_output=True, text=True, env=env, timeout=600)
    assert done.stdout.lstrip().startswith("{"), done.stdout + done.stderr
    return done.returncode, json.loads(done.stdout)


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
        "task": "Number the ranks and pick MASTER_ADDR", "message": None}

    code, out = run("up", *inv, "--json")
    assert code == 0 and out["result"]["changed"] == 0

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
