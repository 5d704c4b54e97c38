"""The release as a new user gets it: the wheel and the collection tarball, built from this
checkout, installed into a new venv and an empty collections path in a folder outside the
checkout (no PYTHONPATH, no -e). From there, with nothing but an inventory of the local
cluster, the installed command plans, launches and lists runs, and the installed collection
provisions the nodes with ansible-playbook."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness import ROOT
from harness.cluster import ENV


def run(argv, cwd, env, timeout=600):
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, argv))} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """The built artifacts, the new venv, and a user's environment that knows nothing of the checkout."""
    base = tmp_path_factory.mktemp("release")
    assert ROOT not in base.parents
    dist = base / "dist"
    subprocess.run([str(ROOT / "scripts" / "release.sh"), str(dist)], cwd=ROOT, check=True, capture_output=True,
                   env=dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"))
    (wheel,) = dist.glob("torchfleet-*.whl")
    (tarball,) = dist.glob("torchfleet-cluster-*.tar.gz")
    venv = base / "venv"
    subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "ANSIBLE_CONFIG", "ANSIBLE_COLLECTIONS_PATH", "TORCHFLEET_PROJECT",
                        "TORCHFLEET_RUNS_DIR") and not k.startswith("PYTEST")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}/usr/local/bin:/usr/bin:/bin"
    run([venv / "bin" / "pip", "install", "--quiet", "--disable-pip-version-check", wheel], base, env)
    collections = base / "collections"
    collections.mkdir()
    run([venv / "bin" / "ansible-galaxy", "collection", "install", "--no-deps", "-p", collections, tarball], base, env)
    # The local cluster's state (the image archive, the dataset, the SSH key its inventory
    # names) stays where the suite made it: the documented TORCHFLEET_STATE_DIR.
    env["TORCHFLEET_STATE_DIR"] = ENV["TORCHFLEET_STATE_DIR"]
    work = base / "work"
    work.mkdir()
    site = next((venv / "lib").glob("python3*/site-packages"))
    return {"venv": venv, "env": env, "work": work, "collections": collections, "wheel": wheel, "site": site,
            "installed": installed(site)}


def installed(site):
    """Every path of the installed package (its collection included), as a set."""
    return {str(p.relative_to(site)) for p in (site / "torchfleet").rglob("*") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def user_inventory(release, provisioned, inventory_dir):
    """The local cluster's inventory, copied into the user's folder: hosts.yml and its settings."""
    dest = release["work"] / "inventory"
    (dest / "group_vars").mkdir(parents=True)
    shutil.copy(inventory_dir / "hosts.yml", dest / "hosts.yml")
    shutil.copy(inventory_dir / "group_vars" / "all.yml", dest / "group_vars" / "all.yml")
    return dest


def test_the_installed_wheel_plans_launches_and_lists_runs_from_any_folder(release, user_inventory):
    tf = [str(release["venv"] / "bin" / "torchfleet")]
    env, work = release["env"], release["work"]
    version = run(tf + ["--version"], work, env).split()[-1]
    assert version == yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]

    plan = json.loads(run(tf + ["plan", "-i", "inventory", "--json"], work, env))["plan"]
    assert plan["world_size"] == 2 and [r["host"] for r in plan["ranks"]] == ["node-1", "node-2"]

    launched = json.loads(run(tf + ["launch", "-i", "inventory", "--json", "--", "--epoch", "1", "--no-cuda",
                                    "--seed", "7", "--log-interval", "50"], work, env))
    run_id = launched["run"]["run_id"]
    # The run came back into the user's folder: each rank's log and checksum, equal on both.
    run_dir = work / "runs" / run_id
    sums = {p.read_text() for p in run_dir.glob("checksum-rank-*.txt")}
    assert len(list(run_dir.glob("checksum-rank-*.txt"))) == 2 and len(sums) == 1
    assert "Train Epoch: 1" in (run_dir / "rank-1.log").read_text()

    runs = json.loads(run(tf + ["runs", "-i", "inventory", "--json"], work, env))
    (entry,) = [r for r in runs["runs"] if r["run_id"] == run_id]
    assert entry["state"] == "succeeded" and entry["local"]

    # Nothing of the user's went into the installed package: it holds what it was installed with.
    assert installed(release["site"]) == release["installed"]
    assert (work / "runs").is_dir() and not (release["site"] / "torchfleet" / "runs").exists()


def test_the_installed_collection_provisions_the_nodes_with_ansible_playbook(release, user_inventory):
    env = dict(release["env"], ANSIBLE_COLLECTIONS_PATH=str(release["collections"]))
    bin_ = release["venv"] / "bin"
    listed = run([bin_ / "ansible-galaxy", "collection", "list", "torchfleet.cluster"], release["work"], env)
    assert f"# {release['collections'] / 'ansible_collections'}" in listed
    version = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    assert re.search(rf"torchfleet\.cluster\s+{re.escape(version)}\b", listed)
    # Every role of the installed collection runs (site_force: the records on the nodes are
    # the checkout's, for the same code, and would skip them); the nodes were provisioned by
    # the suite already, and the installed roles agree.
    out = run([bin_ / "ansible-playbook", "torchfleet.cluster.site", "-i", "inventory", "-e", "site_force=true"],
              release["work"], env)
    recap = re.findall(r"^(node-\d)\s+: ok=\d+\s+changed=(\d+)\s+unreachable=0\s+failed=0", out, re.M)
    assert sorted(recap) == [("node-1", "0"), ("node-2", "0")], out[-2000:]


def test_the_installed_wheel_alone_drives_this_machines_docker_engine(release):
    # What the local cluster (torchfleet.local, the demo) needs of the controller: community.docker's
    # modules on localhost, with the venv's Python and only the wheel's own requirements.
    venv = release["venv"]
    out = run([venv / "bin" / "ansible", "localhost", "-c", "local", "-m", "community.docker.docker_host_info",
               "-e", f"ansible_python_interpreter={venv / 'bin' / 'python'}"], release["work"], release["env"])
    assert '"host_info"' in out and '"ServerVersion"' in out, out[-2000:]
