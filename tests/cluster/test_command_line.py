"""Issue 59, items 1 and 5, on the shared docker hosts: one command line gives the same spec to
`plan` and to `launch`, the ranks get what that line says, and a job launched without a name
is named after its workload."""

import hashlib
import json

from .conftest import cli, node_sh

# Prints what the rank was given: the open variable, a digest of the secret (never the
# secret itself) and the script's arguments.
PROBE = """
import hashlib, os, sys
print("LINE_VAR=" + os.environ.get("LINE_VAR", "-"))
print("LINE_TOKEN_SHA=" + hashlib.sha256(os.environ.get("LINE_TOKEN", "").encode()).hexdigest())
print("ARGS=" + " ".join(sys.argv[1:]))
"""
TOKEN = "line-token-5f1c"


def test_plan_and_launch_of_one_command_line_give_the_same_spec(provisioned, inventory_dir, runs_dir, tmp_path,
                                                               monkeypatch):
    workload = tmp_path / "line_probe.py"
    workload.write_text(PROBE)
    monkeypatch.setenv("LINE_TOKEN", TOKEN)
    line = ["-i", str(inventory_dir), "--json", "--workload", str(workload), "--run-id", "one-line",
            "--env", "LINE_VAR=from-the-line", "--secret-env", "LINE_TOKEN", "--timeout", "300",
            "--", "--epoch", "1", "--run-id", "inside"]
    code, planned = cli("plan", *line, inventory_dir=inventory_dir, runs_dir=runs_dir)
    assert code == 0, planned
    code, launched = cli("launch", *line, inventory_dir=inventory_dir, runs_dir=runs_dir)
    assert code == 0 and launched["run"]["run_id"] == "one-line", launched

    # The spec the launch wrote on the master, and the files it wrote on each node, against
    # the plan of the same line.
    ran = json.loads(node_sh("node-1", "cat /var/lib/torchfleet/runs/one-line/spec.json"))
    shown = {k: v for k, v in planned["plan"].items() if k not in ("ready", "warnings", "files")}
    assert shown == ran
    for host, files in planned["plan"]["files"].items():
        for name, content in files.items():
            assert node_sh(host, f"cat /var/lib/torchfleet/runs/one-line/{name}") == content, (host, name)
    assert TOKEN not in json.dumps(planned) and TOKEN not in json.dumps(ran)

    # What each rank was given, from its own log; and the guards' limit, from their config.
    for rank in (0, 1):
        log = (runs_dir / "one-line" / f"rank-{rank}.log").read_text()
        assert "LINE_VAR=from-the-line" in log, log
        assert f"LINE_TOKEN_SHA={hashlib.sha256(TOKEN.encode()).hexdigest()}" in log, log
        assert "ARGS=--epoch 1 --run-id inside" in log, log
    guard = json.loads(node_sh("node-2", "cat /var/lib/torchfleet/runs/one-line/guard.json"))
    assert guard["job_timeout"] == 300, guard

    # No --job and no launch_job: the job is the workload's name, on the nodes too, where its
    # workload has a folder of its own.
    assert planned["plan"]["job"] == "line_probe" and guard["job"] == "line_probe"
    assert node_sh("node-2", "ls /var/lib/torchfleet/workloads/line_probe") == "line_probe.py\n"
