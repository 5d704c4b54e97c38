"""The fault matrix: each fault on the local docker hosts, and what the guards did about it.

Each case asserts the outcome and what it names, that the stop came from the guards (the
reason each stopped rank recorded), a loose bound (the configured timeout plus a generous
margin), that no rank is left on any node, and that the logs were kept.
"""

import signal
import subprocess
import time

import pytest

from harness.cluster import NAME

from .conftest import NODE_TIMEOUT, WORKLOAD, ended_at, finish

# Detection and stop happen within NODE_TIMEOUT plus a few polls; this allows for two busy cores.
MARGIN = 30


@pytest.fixture(autouse=True)
def clean_start(faults_cluster):
    """A case that failed may leave ranks behind; the next one starts on clean nodes."""
    f = faults_cluster
    if f.ranks("node-1", running_only=True) or f.ranks("node-2", running_only=True):
        f.cli("down")
    yield


def assert_nothing_left(f, *nodes):
    for node in nodes or ("node-1", "node-2"):
        assert f.ranks(node) == [], f"{node} kept rank containers"


def assert_stopped_within(f, run_id, since, bound, reason_part, names=None):
    """Every rank the guards stopped says why, and stopped within ``bound`` seconds."""
    summary = f.summary(run_id)
    stopped = [r for r in summary["ranks"] if r["outcome"] == "stopped"]
    assert stopped, summary["ranks"]
    for row in stopped:
        assert reason_part in (row["stopped_because"] or ""), row
        assert "[torchfleet guard] stopped" in open(row["log"]).read()
    for name, guard in f.guards(run_id).items():
        if guard["state"] == "stopped" and (names is None or name in names):
            assert ended_at(guard) - since < bound, (name, ended_at(guard) - since)
    return summary


@pytest.mark.parametrize("mode, attached", [("container", False), ("torchrun", False), ("torchrun", True)],
                         ids=["container-detached", "torchrun-detached", "torchrun-attached"])
def test_a_crashed_rank_stops_the_rest(faults_cluster, mode, attached):
    """Rank 1 dies in a compute phase (no collective) and the guards stop rank 0. Detached,
    submit returns and the stop happens with no controller; attach from a new handle then
    reports it. Attached, the launch itself reports it. (Container mode attached: molecule
    default; process mode, attached and detached: molecule bare-metal.)"""
    f = faults_cluster
    from torchfleet import Job, JobFailed

    job = Job(workload=WORKLOAD, name="faults", args=["--crash-rank", "1", "--crash-after", "12"],
              extra_vars={"launch_mode": mode, "launch_node_timeout": NODE_TIMEOUT})
    if attached:
        with pytest.raises(JobFailed) as info:
            f.cluster.launch(job)
    else:
        handle = f.cluster.submit(job)
        assert handle.cluster.run(handle.run_id).status().state == "running"
        # The crash (12 s into the compute phase) and the stop happen while nobody watches.
        f.wait_no_running_ranks("node-1", 90)
        f.wait_no_running_ranks("node-2", 10)
        with pytest.raises(JobFailed) as info:
            f.cluster.run(handle.run_id).attach()
    run = info.value.run
    assert info.value.rank == 1 and "rank 1" in info.value.message
    assert {r.rank: r.outcome for r in run.ranks} == {0: "stopped", 1: "failed"}
    # The guard names the unit that failed (in torchrun mode node-2's agent, which runs rank 1);
    # the rank's own exit code is its SIGKILL's.
    assert "rank 1" in run.ranks[0].stopped_because and "on node-2 exited with code" in run.ranks[0].stopped_because
    assert run.ranks[1].exit_code == 137
    assert "crashing now" in run.ranks[1].log() and "step at" in run.ranks[0].log()
    assert_nothing_left(f)


@pytest.mark.parametrize("lost, other", [("node-2", "node-1"), ("node-1", "node-2")], ids=["worker", "master"])
def test_a_paused_node_stops_every_rank_and_is_named(faults_cluster, lost, other):
    f = faults_cluster
    run_id = f"paused-{lost}"
    launch = f.launch(run_id)
    f.wait_running(run_id, launch=launch)
    since = time.time()
    inner = f.freeze(lost)
    try:
        code, out = finish(launch)
        assert code == 5, out
        assert out["error"]["host"] == lost and f"lost {lost}" in out["error"]["message"] \
            or f"the master node {lost}" in out["error"]["message"]
        # The node that still answers stopped its rank itself, within the node timeout.
        reason = f"lost {lost}" if lost == "node-2" else f"lost the supervision store on {lost}"
        assert_stopped_within(f, run_id, since, NODE_TIMEOUT + MARGIN, reason)
        assert f.ranks(other) == []
        assert "step at" in (f.runs_dir / run_id / f"rank-{1 if other == 'node-2' else 0}.log").read_text()
    finally:
        f.thaw(lost, inner)
    # Back again, the lost node's guard sees the abort (or no store) and stops its rank.
    f.wait_no_running_ranks(lost, NODE_TIMEOUT + MARGIN)


def test_a_node_cut_from_the_network_is_lost(faults_cluster):
    f = faults_cluster
    launch = f.launch("cut")
    f.wait_running("cut", launch=launch)
    since = time.time()
    f.cut("node-2")
    try:
        code, out = finish(launch)
        assert code == 5 and out["error"]["host"] == "node-2", out
        assert_stopped_within(f, "cut", since, NODE_TIMEOUT + MARGIN, "lost node-2")
        assert f.ranks("node-1") == []
    finally:
        f.cut("node-2", connect=True)
    # node-2's guard lost the store too, and stopped its rank without anyone telling it.
    f.wait_no_running_ranks("node-2", NODE_TIMEOUT + MARGIN)
    states = f.node("node-2", "cat /var/lib/torchfleet/runs/cut/guard-1.json")
    assert "lost the supervision store on node-1" in states


def test_a_killed_rank_container_is_named_not_the_rank_that_lost_it(faults_cluster):
    """docker kill of rank 1's container takes its guard with it. Rank 0, in an all_reduce,
    fails on Gloo's lost connection; its guard waits for the peers' guards, the host finds
    rank 1's silent, and the run is reported lost on node-2 with rank 1's SIGKILL, not as
    rank 0's failure."""
    f = faults_cluster
    launch = f.launch("killed", workload_args=["--allreduce"])
    f.wait_running("killed", launch=launch)
    since = time.time()
    (container,) = f.ranks("node-2", running_only=True)
    f.node("node-2", f"docker kill {container}")
    code, out = finish(launch)
    assert code == 5 and out["error"]["host"] == "node-2", out
    assert "rank 1 on node-2 stopped answering" in out["error"]["message"], out
    assert "rank 1 on node-2 exited with code 137" in out["error"]["message"], out
    summary = assert_stopped_within(f, "killed", since, NODE_TIMEOUT + MARGIN, "lost node-2")
    assert {r["rank"]: (r["outcome"], r["exit_code"]) for r in summary["ranks"]}[1] == ("failed", 137)
    rank0 = open(summary["ranks"][0]["log"]).read()
    assert "step at" in rank0 and "lost a peer; waiting for the peers' guards" in rank0
    assert_nothing_left(f)


def test_ctrl_c_on_launch_stops_everything_and_keeps_the_logs(faults_cluster):
    f = faults_cluster
    launch = f.launch("interrupted")
    f.wait_running("interrupted", launch=launch)
    launch.send_signal(signal.SIGINT)
    code, out = finish(launch)
    assert code == 130, out
    summary = f.summary("interrupted")
    assert {r["outcome"] for r in summary["ranks"]} == {"stopped"}
    assert all("interrupted (SIGINT)" in r["stopped_because"] for r in summary["ranks"])
    assert all("step at" in open(r["log"]).read() for r in summary["ranks"])
    assert_nothing_left(f)


def test_a_killed_controller_leaves_the_run_supervised_and_its_job_locked(faults_cluster):
    f = faults_cluster
    launch = f.launch("orphan", workload_args=["--until-file", "finish"])
    f.wait_running("orphan", launch=launch)
    launch.kill()
    launch.wait()
    code, out = f.cli("status", "orphan")
    assert code == 0 and out["status"]["state"] == "running"
    # Each node's part of the view is its own, not the run's whole spec: that grows with the
    # cluster, and at 48 nodes the view outgrew ansible-runner's event limit.
    assert out["status"]["nodes"]["node-2"]["units"] and all("spec" not in r for r in out["status"]["nodes"].values())
    # The cluster is the lock: another launch of the job is refused, naming the run once
    # with every node it runs on.
    code, out = f.cli("launch", "--workload", str(WORKLOAD), "--job", "faults", "--", "--seconds", "5")
    message = out["error"]["message"]
    assert code == 7 and message.count("run orphan") == 1 and "hosts node-1, node-2: " in message, out
    code, out = f.cli("runs")
    assert {"run_id": "orphan", "state": "running"}.items() <= next(
        r for r in out["runs"] if r["run_id"] == "orphan").items()
    # A new process follows it to its end, which comes once the ranks find their file (a few
    # seconds on, to let it start following), and collects it.
    attach = subprocess.Popen(f.args("attach", "--json", "orphan"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=f.env)
    time.sleep(8)
    assert attach.poll() is None, "attach ended while the run still ran"
    for node in ("node-1", "node-2"):
        f.node(node, "touch /var/lib/torchfleet/runs/orphan/finish")
    code, out = finish(attach)
    assert code == 0, out
    assert {r["outcome"] for r in out["run"]["ranks"]} == {"ok"}
    # Steps were made all along, before and after the controller was killed.
    assert (f.runs_dir / "orphan" / "rank-1.log").read_text().count("step at") >= 10
    assert_nothing_left(f)


def test_replace_stops_the_running_run_first_and_keeps_its_logs(faults_cluster):
    f = faults_cluster
    code, out = f.cli("launch", "--detach", "--workload", str(WORKLOAD), "--job", "faults", "--run-id", "old",
                      "--", "--seconds", "300")
    assert code == 0 and out["detached"], out
    f.wait_running("old")
    code, out = f.cli("launch", "--detach", "--replace", "--workload", str(WORKLOAD), "--job", "faults",
                      "--run-id", "new", "--", "--seconds", "300")
    assert code == 0, out
    code, out = f.cli("collect", "old")
    assert code == 1 and out["run"]["abort"]["kind"] == "stopped"
    assert [r["stopped_because"] for r in out["run"]["ranks"]] == ["replaced by run new (launch_replace)"] * 2
    assert all("step at" in (f.runs_dir / "old" / f"rank-{r}.log").read_text() for r in (0, 1))
    # As a start cut short on the master would leave it: the stop reads the spec from node-2.
    f.node("node-1", "rm /var/lib/torchfleet/runs/new/spec.json")
    code, out = f.cli("stop", "new")
    assert code == 0 and {r["outcome"] for r in out["run"]["ranks"]} == {"stopped"}
    assert_nothing_left(f)


@pytest.mark.parametrize("port, variable", [(29510, "launch_guard_port"), (29500, "launch_master_port")])
def test_a_taken_port_on_the_master_starts_nothing(faults_cluster, port, variable):
    f = faults_cluster
    address = f.node("node-1", "hostname -i").split()[0]
    holder = subprocess.Popen(["docker", "exec", f"{NAME}-node-1", "python3", "-c",
                               f"import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('{address}', {port})); s.listen(); "
                               "print('listening', flush=True); time.sleep(120)  # port-holder"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "listening"
        code, out = f.cli("launch", "--workload", str(WORKLOAD), "--job", "faults", "--", "--seconds", "5")
    finally:
        # Killing docker exec leaves its command running in the node.
        f.node("node-1", "pkill -f port-holder", check=False)
        holder.kill()
    assert code == 3 and out["error"]["host"] == "node-1", out
    assert f"{variable} {port} is already in use" in out["error"]["message"]
    assert_nothing_left(f)


def test_a_master_that_fails_before_it_listens_leaves_the_workers_not_started(faults_cluster):
    """Every node's units start at once, a worker's rank waiting in its guard until MASTER_PORT
    listens: rank 0 exits before it listens, so rank 1 never runs, and it is reported as not
    started, with the cause, not blamed."""
    f = faults_cluster
    code, out = f.cli("launch", "--workload", str(WORKLOAD), "--job", "faults", "--run-id", "early", "--",
                      "--fail-before-join", "0")
    assert code == 1, out
    ranks = {r["rank"]: r for r in out["run"]["ranks"]}
    assert (ranks[0]["outcome"], ranks[0]["exit_code"]) == ("failed", 3)
    assert ranks[1]["outcome"] == "not started" and ranks[1]["exit_code"] is None
    assert "rank 0 on node-1 exited with code 3" in ranks[1]["stopped_because"]
    # Its guard never forked it: no pid, and its log holds only the guard's own line.
    record = f.guards("early")["torchfleet-early-rank1"]
    assert record["not_started"] is True and "pid" not in record
    log = (f.runs_dir / "early" / "rank-1.log").read_text().splitlines()
    assert log == ["[torchfleet guard] stopped rank 1 on node-2: rank 0 on node-1 exited with code 3"], log
    assert_nothing_left(f)

def test_a_master_that_does_not_listen_in_time_ends_the_attached_launch_naming_it(faults_cluster):
    """An attached launch follows the run as soon as its units start; rank 0 runs but opens
    MASTER_PORT only after 120 s, so its guard ends the run once launch_master_wait_timeout
    has passed, and rank 1, still waiting for it, never runs."""
    f = faults_cluster
    since = time.time()
    code, out = f.cli("launch", "--workload", str(WORKLOAD), "--job", "faults", "--run-id", "late",
                      "-e", "launch_master_wait_timeout=5", "--", "--join-late", "0", "--seconds", "120")
    assert code == 6, out
    assert "rank 0 on node-1 did not listen on" in out["error"]["message"]
    assert "within 5s (launch_master_wait_timeout)" in out["error"]["message"]
    ranks = {r["rank"]: r for r in out["run"]["ranks"]}
    assert ranks[1]["outcome"] == "not started" and ranks[1]["exit_code"] is None
    record = f.guards("late")["torchfleet-late-rank0"]
    assert record["pid"] and (record["state"], record["exit_code"]) == ("stopped", 143)
    assert "rank 0: joining in 120s" in (f.runs_dir / "late" / "rank-0.log").read_text()
    # Stopped once its allowance was over, not when its 120 s were.
    assert record["sigterm_at"] - since < 60
    assert_nothing_left(f)


def test_a_rank_that_makes_no_progress_is_stopped_as_stalled(faults_cluster):
    f = faults_cluster
    launch = f.launch("stall", "-e", "launch_stall_timeout=6")
    f.wait_running("stall", launch=launch)
    container = f.ranks("node-2", running_only=True)[0]
    # SIGSTOP the rank's own process (the guard's child), by the pid it printed.
    pid = f.node("node-2", "sed -n 's/.*computing alone (pid \\([0-9]*\\)).*/\\1/p' "
                           "/var/lib/torchfleet/runs/stall/rank-1.log").strip()
    assert pid.isdigit()
    f.node("node-2", f"docker exec {container} kill -STOP {pid}")
    since = time.time()
    code, out = finish(launch)
    assert code == 6, out
    assert "rank 1 on node-2 made no progress" in out["error"]["message"]
    assert "launch_stall_timeout=6" in out["error"]["message"]
    assert_stopped_within(f, "stall", since, 6 + MARGIN, "rank 1 on node-2 made no progress")
    assert_nothing_left(f)


def test_a_stop_from_another_shell_gives_the_ranks_the_runs_own_grace(faults_cluster):
    """A run launched with launch_stop_grace=20, stopped from a shell whose variables say 2:
    its ranks, which ignore SIGTERM, get SIGKILL 20 s after SIGTERM, by their guards' records.
    With the stopping shell's settings the stop would have killed them after node timeout + 2
    + 5 s (11 s)."""
    f = faults_cluster
    grace = 20
    code, out = f.cli("launch", "--detach", "--workload", str(WORKLOAD), "--job", "faults", "--run-id", "grace",
                      "-e", f"launch_stop_grace={grace}", "--", "--seconds", "300", "--ignore-sigterm")
    assert code == 0 and out["detached"], out
    f.wait_running("grace")
    code, out = f.cli("stop", "grace", "-e", "launch_stop_grace=2")
    assert code == 0 and {r["outcome"] for r in out["run"]["ranks"]} == {"stopped"}, out
    guards = f.guards("grace")
    assert len(guards) == 2
    for name, guard in guards.items():
        assert guard["state"] == "stopped" and guard["exit_code"] == 128 + signal.SIGKILL, (name, guard)
        assert grace <= guard["sigkill_at"] - guard["sigterm_at"] < grace + MARGIN, (name, guard)
    assert_nothing_left(f)


def test_a_node_the_controller_cannot_reach_keeps_the_clusters_verdict_and_is_named(faults_cluster):
    """node-2's sshd frozen while its rank trains on: the ranks finish, the guards record it,
    and the launch, its message and `runs` all say succeeded, naming node-2 as not reached and
    how to fetch its logs. Once node-2 answers, collect brings them and removes its leftovers."""
    f = faults_cluster
    launch = f.launch("unreached", seconds=20)
    f.wait_running("unreached", launch=launch)
    f.node("node-2", "pkill -STOP -x sshd")
    try:
        code, out = finish(launch)
        assert code == 0, out
        run = out["run"]
        assert run["ok"] and run["unreachable"] == ["node-2"], run
        assert "could not reach node-2" in run["note"] and "`torchfleet collect unreached`" in run["note"]
        assert {r["rank"]: (r["outcome"], r["exit_code"]) for r in run["ranks"]} == {0: ("ok", 0), 1: ("ok", 0)}
        code, out = f.cli("runs")
        assert code == 0 and next(r for r in out["runs"] if r["run_id"] == "unreached")["state"] == "succeeded", out
    finally:
        f.node("node-2", "pkill -CONT -x sshd")
    code, out = f.cli("collect", "unreached")
    assert code == 0 and out["run"]["unreachable"] == [] and out["run"]["note"] is None, out
    assert "step at" in (f.runs_dir / "unreached" / "rank-1.log").read_text()
    assert_nothing_left(f)


def test_a_masters_container_removed_under_its_guard_reads_as_gone(faults_cluster):
    """`docker rm -f` of the master's rank container, as a launch's end that lost the master
    does, takes its guard before it writes how its unit ended: the record still says running.
    The other guard stops its rank for the lost store. Status says failed, with the master's
    unit gone (its guard's lock is free), and collect ends what is left on every node, also
    where the run's folder lacks its own end script."""
    f = faults_cluster
    code, out = f.cli("launch", "--detach", "--workload", str(WORKLOAD), "--job", "faults", "--run-id", "removed",
                      "--", "--seconds", "300")
    assert code == 0 and out["detached"], out
    f.wait_running("removed")
    (container,) = f.ranks("node-1", running_only=True)
    f.node("node-1", f"docker rm -f {container}")
    assert '"state": "running"' in f.node("node-1", "cat /var/lib/torchfleet/runs/removed/guard-0.json")
    f.wait_no_running_ranks("node-2", NODE_TIMEOUT + MARGIN)
    code, out = f.cli("status", "removed")
    assert code == 0 and out["status"]["state"] == "failed", out
    units = {host: node["units"] for host, node in out["status"]["nodes"].items()}
    assert [(u["state"], u["recorded_state"]) for u in units["node-1"]] == [("gone", "running")], units
    assert "lost the supervision store on node-1" in units["node-2"][0]["stopped_because"], units
    # As a run launched before the run folder's scripts would be: node-2 then ends and packs
    # its part through the module.
    f.node("node-2", "rm /var/lib/torchfleet/runs/removed/run_end.py")
    code, out = f.cli("collect", "removed")
    assert code == 5 and out["run"]["abort"]["kind"] == "node_lost", out
    assert "step at" in (f.runs_dir / "removed" / "rank-1.log").read_text()
    assert_nothing_left(f)
