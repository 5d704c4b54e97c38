"""The torchfleet command against the same docker hosts: exit codes and --json output."""

import json
import os
import subprocess
import time

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
        "type": "InventoryError", "host": "node-2", "hosts": ["node-2"], "variable": "torchfleet_node_rank",
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


def _text(*args, runs_dir, timeout=600):
    """The torchfleet command in text mode: (exit code, stdout, stderr)."""
    env = dict(os.environ, **ENV, TORCHFLEET_RUNS_DIR=str(runs_dir))
    done = subprocess.run([TORCHFLEET, *args], capture_output=True, text=True, env=env, timeout=timeout)
    return done.returncode, done.stdout, done.stderr


def test_two_names_for_one_machine_are_refused_before_anything_changes(provisioned, inventory_dir, runs_dir, tmp_path):
    """Issue 43, finding 1: a second name for node-2, by another port of its own sshd, which
    the addresses cannot tell: node-2 itself says that it is the same machine."""
    import yaml

    hosts = yaml.safe_load((inventory_dir / "hosts.yml").read_text())
    address = hosts["all"]["children"]["torchfleet_nodes"]["hosts"]["node-2"]["ansible_host"]
    ssh_args = hosts["all"]["vars"]["ansible_ssh_common_args"]
    alias = tmp_path / "alias.yml"
    # HostKeyAlias: the second port serves node-2's own host key, known under its address.
    alias.write_text(yaml.safe_dump({"torchfleet_nodes": {"hosts": {"node-2-again": {
        "ansible_host": address, "ansible_port": 2222,
        "ansible_ssh_common_args": f"{ssh_args} -o HostKeyAlias={address}"}}}}))
    node_sh("node-2", "/usr/sbin/sshd -p 2222 -o PidFile=/run/sshd-2222.pid")
    runs = lambda: {n: node_sh(n, "ls /var/lib/torchfleet/runs 2>/dev/null || true")  # noqa: E731
                    for n in ("node-1", "node-2")}
    runs_before = runs()
    try:
        inv = ["-i", str(inventory_dir), "-i", str(alias), "--json"]
        for command in (["plan"], ["launch", "--run-id", "same-machine"], ["up"]):
            code, out = cli(*command, *inv, inventory_dir=inventory_dir, runs_dir=runs_dir)
            assert code == 2 and out["error"]["variable"] == "ansible_host", (command, out)
            assert out["error"]["hosts"] == ["node-2", "node-2-again"], out
            assert "are one machine" in out["error"]["message"]
        # Apart, the two real nodes are two machines, though their kernel (boot id) is one.
        code, _ = cli("plan", "-i", str(inventory_dir), "--json", inventory_dir=inventory_dir, runs_dir=runs_dir)
        assert code == 0
    finally:
        node_sh("node-2", "kill $(cat /run/sshd-2222.pid)")
    assert runs() == runs_before
    assert not (runs_dir / "same-machine").exists()


def test_a_bad_run_id_touches_no_node(provisioned, inventory_dir, runs_dir):
    """Issue 39, item 4: refused with exit 2 naming launch_run_id, and no folder is made on any node."""
    before = {n: node_sh(n, "ls -a /var/lib/torchfleet/runs /var/lib/torchfleet 2>/dev/null || true")
              for n in ("node-1", "node-2")}
    for args in (["--run-id", "../x"], ["--run-id", "a b"], ["--run-id", "r" * 200], ["-e", "launch_run_id=../x"]):
        code, out = cli("launch", "-i", str(inventory_dir), "--json", *args, inventory_dir=inventory_dir,
                        runs_dir=runs_dir)
        assert code == 2 and out["error"]["variable"] == "launch_run_id", (args, out)
    code, out = cli("stop", "-i", str(inventory_dir), "--json", "../x", inventory_dir=inventory_dir, runs_dir=runs_dir)
    assert code == 2 and out["error"]["variable"] == "launch_run_id"
    assert {n: node_sh(n, "ls -a /var/lib/torchfleet/runs /var/lib/torchfleet 2>/dev/null || true")
            for n in ("node-1", "node-2")} == before
    assert node_sh("node-1", "ls /var/lib/torchfleet | grep -cx x || true").strip() == "0"


def test_a_run_id_that_a_node_holds_is_refused_before_any_rank_starts(provisioned, inventory_dir, runs_dir):
    """A run id this controller has no record of, but a node holds (another controller's
    run, or a runs folder removed here): its stop file or records would be the new run's."""
    node_sh("node-2", "mkdir -p /var/lib/torchfleet/runs/held-elsewhere && touch /var/lib/torchfleet/runs/held-elsewhere/stop")
    try:
        code, out = cli("launch", "-i", str(inventory_dir), "--json", "--run-id", "held-elsewhere",
                        inventory_dir=inventory_dir, runs_dir=runs_dir)
        assert code == 3 and out["error"]["host"] == "node-2", out
        assert "launch_run_id held-elsewhere is taken: /var/lib/torchfleet/runs/held-elsewhere exists on the node" \
            in out["error"]["message"]
        assert node_sh("node-1", "ls /var/lib/torchfleet/runs | grep -cx held-elsewhere || true").strip() == "0"
        assert node_sh("node-2", "docker ps -aq --filter label=torchfleet.run=held-elsewhere").strip() == ""
    finally:
        node_sh("node-2", "rm -rf /var/lib/torchfleet/runs/held-elsewhere")


def test_lookalikes_come_before_a_failing_check_in_every_command(provisioned, inventory_dir, runs_dir, tmp_path):
    """Issue 43, finding 3: the BigDL guide's names, and names without their prefix, are warned
    about even when a later check fails (here a TLS one), in text and JSON alike."""
    guide = tmp_path / "guide.yml"
    guide.write_text("all:\n  hosts:\n    node-2: {rank: 1, cpuset: '0-1', master_port: 29511, image: x, "
                     "command: [python3, t.py], sgx_aesm_socket: true}\n")
    inv = ["-i", str(inventory_dir), "-i", str(guide)]
    meant = {"rank": "torchfleet_node_rank", "cpuset": "cpu_pinning_cpusets", "master_port": "launch_master_port",
             "image": "launch_image", "command": "launch_command", "sgx_aesm_socket": "launch_sgx_aesm_socket"}
    for command in ("plan", "launch"):
        # Bad input that a later check refuses: its warnings still come, first.
        code, out = cli(command, *inv, "--json", "-e", "launch_poll_interval=0", inventory_dir=inventory_dir,
                        runs_dir=runs_dir)
        assert code == 2 and out["error"]["variable"] == "launch_poll_interval", out
        assert {w["variable"]: w["meant"] for w in out["warnings"]} == meant
        code, _, stderr = _text(command, *inv, "-q", "-e", "launch_poll_interval=0", runs_dir=runs_dir)
        assert code == 2 and stderr.index("did you mean launch_command?") < stderr.index("error")
    code, out = cli("up", *inv, "--json", "-e", "image_load_timeout=0", inventory_dir=inventory_dir, runs_dir=runs_dir)
    assert code == 2 and {w["variable"]: w["meant"] for w in out["warnings"]} == meant


def test_an_input_error_of_every_node_is_said_once(provisioned, inventory_dir, runs_dir):
    """Issue 43, finding 4: the hosts, the variable and the sentence, once; Ansible's task with -v."""
    code, _, stderr = _text("plan", "-i", str(inventory_dir), "-e", "launch_poll_interval=0", runs_dir=runs_dir)
    assert code == 2
    assert stderr.count("launch_poll_interval=0 must be between 0.1 and 3600") == 1, stderr
    assert "hosts node-1, node-2: launch_poll_interval=0" in stderr and "variable launch_poll_interval" in stderr
    assert "✗ node-" not in stderr and "Check the launch's input" not in stderr
    code, _, stderr = _text("plan", "-i", str(inventory_dir), "-v", "-e", "launch_poll_interval=0", runs_dir=runs_dir)
    assert code == 2 and "✗ node-1" in stderr and "Check the launch's input" in stderr


# Joins the job (the launch waits for MASTER_PORT), then only waits.
SLEEPER = ("import time\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
           "print(f'rank {dist.get_rank()} joined', flush=True)\ntime.sleep(600)\n")


def test_a_stop_or_a_detach_that_worked_prints_no_failure(provisioned, inventory_dir, runs_dir, tmp_path):
    """Issue 43, finding 7: stop (exit 0) and Ctrl-C on attach (exit 0) print nothing red, no "failed"."""
    import signal

    workload = tmp_path / "sleeper.py"
    workload.write_text(SLEEPER)
    inv = ["-i", str(inventory_dir)]
    code, out = cli("launch", *inv, "--json", "--detach", "--workload", str(workload), "--job", "sleeper",
                    "--run-id", "sleeper-1", inventory_dir=inventory_dir, runs_dir=runs_dir)
    assert code == 0 and out["detached"], out
    env = dict(os.environ, **ENV, TORCHFLEET_RUNS_DIR=str(runs_dir))
    attach = subprocess.Popen([TORCHFLEET, "attach", *inv, "sleeper-1"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env,
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(10)
    attach.send_signal(signal.SIGINT)
    stdout, stderr = attach.communicate(timeout=120)
    assert attach.returncode == 0 and "detached from run sleeper-1" in stdout, stdout + stderr
    assert "failed" not in stderr and "✗" not in stderr, stderr
    code, stdout, stderr = _text("stop", *inv, "sleeper-1", runs_dir=runs_dir)
    assert code == 0, stdout + stderr
    assert "failed" not in stderr and "✗" not in stderr and "✓ stop sleeper-1" in stderr, stderr
    assert "stopped" in stdout
