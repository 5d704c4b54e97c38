"""What a launch asks of each node, counted as it happens: every command the controller's SSH
runs on a node (a wrapper around ssh logs each), and every task that Ansible's callback
reports for a node (ansible-runner's events, skipped ones included: each costs the
controller a process per node). The launch's goal is one check, one start and one collect on
every node, and one follow on the master; the counts fail the test above what was reached."""

import collections
import os
import stat
import sys

import yaml

import torchfleet
from torchfleet import Job

# What was reached (docs/performance.md): module runs on a worker and on the master, and the
# tasks the callback reports for a worker.
WORKER_RUNS, MASTER_RUNS, WORKER_TASKS = 3, 4, 6


def test_a_launch_asks_each_node_one_check_one_start_one_collect_and_the_master_one_follow(provisioned, tmp_path):
    cluster = provisioned[0]
    log = tmp_path / "ssh.log"
    wrapper = tmp_path / "ssh"
    # The node's address is ssh's last word before the remote command; each call is one line.
    wrapper.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >>{log}\nexec /usr/bin/ssh \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    tasks = collections.Counter()

    def count(event):
        data = event.get("event_data") or {}
        if event.get("event") in ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable") \
                and data.get("host") and not data.get("delegate_to"):
            tasks[data["host"]] += 1

    counted = torchfleet.Cluster(cluster.inventory, runs_dir=cluster.runs_dir, progress=count,
                                 env=dict(cluster.env, ANSIBLE_SSH_EXECUTABLE=str(wrapper)),
                                 # One follow round: the run is shorter than a progress line's interval.
                                 extra_vars={**cluster.extra_vars, "launch_progress_interval": 600})
    run = counted.launch(Job(args=["--epoch", "1", "--no-cuda", "--log-interval", "50"]))
    assert run.ok
    hosts = yaml.safe_load((cluster.inventory[0] / "hosts.yml").read_text())["all"]["children"]["torchfleet_nodes"]["hosts"]
    by_address = {v["ansible_host"]: name for name, v in hosts.items()}
    runs = collections.Counter()
    for line in log.read_text().splitlines():
        words = line.split()
        address = next(w.split("@")[-1] for w in reversed(words) if w.split("@")[-1] in by_address)
        runs[by_address[address]] += 1
    print(f"module runs per node {dict(runs)}, tasks per node {dict(tasks)}", file=sys.stderr)
    assert runs["node-2"] <= WORKER_RUNS, runs
    assert runs["node-1"] <= MASTER_RUNS, runs
    assert tasks["node-2"] <= WORKER_TASKS, tasks
