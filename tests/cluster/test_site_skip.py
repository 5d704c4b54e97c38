"""site.yml on nodes already provisioned (issue 60): a role in place is skipped, and a role
whose input changed, or whose state a node lost, runs again there alone. Which roles ran on
which node is read from the playbook's own results (ansible.posix.json: each task's file and
each host's outcome), not from site.yml's text."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from harness import ROOT
from harness.cluster import ENV, NAME, node_sh

IMAGE = "torchfleet/train:2.13.0-cpu"
DATASET_FILE = "/var/lib/torchfleet/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"


def site(inventory_dir, *args):
    """site.yml to its end: the roles whose own tasks ran on each node, the nodes that
    gathered facts, and each node's count of changes."""
    env = dict(os.environ, **ENV, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(ROOT / "site.yml"),
                           "-i", str(inventory_dir), *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out = json.loads(done.stdout)
    ran, gathered = {}, set()
    for play in out["plays"]:
        for task in play["tasks"]:
            path = task["task"]["path"] or ""
            for host, result in task["hosts"].items():
                if result.get("skipped") or host == "localhost":  # the inventory's check
                    continue
                if task["task"]["name"] == "Gathering Facts":
                    gathered.add(host)
                if "/roles/" in path and "/tasks/" in path and not path.split(":")[0].endswith("/validate.yml"):
                    ran.setdefault(host, set()).add(path.split("/roles/")[1].split("/")[0])
    changed = {host: stats["changed"] for host, stats in out["stats"].items() if host != "localhost"}
    return ran, gathered, changed


def test_a_second_site_yml_runs_no_role_and_gathers_no_facts(provisioned, inventory_dir):
    ran, gathered, changed = site(inventory_dir)
    assert ran == {} and gathered == set()
    assert changed == {"node-1": 0, "node-2": 0}


def test_a_lost_image_a_stopped_engine_a_changed_file_or_variable_run_their_role_again(provisioned, inventory_dir):
    # node-1 loses the image's name (the image stays, under another); node-2's engine stops.
    node_sh(NAME, "node-1", f"docker tag {IMAGE} torchfleet-test/kept:1 && docker rmi {IMAGE}")
    node_sh(NAME, "node-2", "start-stop-daemon --stop --retry TERM/30/KILL/5 --pidfile /run/torchfleet-dockerd.pid")
    ran, gathered, _ = site(inventory_dir)
    assert ran == {"node-1": {"image"}, "node-2": {"container_runtime", "image"}}
    assert gathered == {"node-1", "node-2"}
    assert node_sh(NAME, "node-1", f"docker image inspect --format '{{{{.Id}}}}' {IMAGE}").stdout.startswith("sha256:")
    assert node_sh(NAME, "node-2", "docker version --format '{{.Server.Version}}'").stdout.strip()
    node_sh(NAME, "node-1", "docker rmi torchfleet-test/kept:1")

    # A dataset file changed on node-2, and a variable of the image role changed for both.
    node_sh(NAME, "node-2", f"echo changed >> {DATASET_FILE}")
    ran, _, _ = site(inventory_dir, "-e", "image_load_timeout=601")
    assert ran == {"node-1": {"image"}, "node-2": {"image", "dataset"}}
    controller = (ROOT / ".torchfleet" / "datasets" / "fashion-mnist" / Path(DATASET_FILE).name).read_bytes()
    assert node_sh(NAME, "node-2", f"sha256sum {DATASET_FILE}").stdout.split()[0] == hashlib.sha256(controller).hexdigest()

    # Back to the variable's old value: its role runs again. Then site_force runs every role,
    # and, everything being in place, changes nothing.
    ran, _, _ = site(inventory_dir)
    assert ran == {"node-1": {"image"}, "node-2": {"image"}}
    ran, _, changed = site(inventory_dir, "-e", "site_force=true")
    assert ran == {node: {"container_runtime", "image", "dataset"} for node in ("node-1", "node-2")}
    assert changed == {"node-1": 0, "node-2": 0}
