"""torchfleet plan --format: the plan of the docker hosts as a Kubernetes manifest, through the
command, with the k8s_* variables from -e. No Kubernetes cluster is here to apply it: the
manifest is checked against the shipped CRD, and what it says against the nodes' own CPUs."""

import os
import subprocess

import yaml

from torchfleet import cpus
from torchfleet.k8s import schema

from .conftest import ENV, TORCHFLEET, cli, node_sh

IMAGE = "registry.example.com/ml/train@sha256:" + "ab" * 32
K8S = ["-e", f"k8s_image={IMAGE}", "-e", "k8s_data_claim=fashion-mnist", "-e", "k8s_workload_claim=mnist-code",
       "-e", "k8s_output_claim=runs", "-e", "k8s_memory=4Gi"]


def test_plan_prints_a_trainjob_and_a_pytorchjob_that_pass_their_crds(provisioned, inventory_dir, runs_dir):
    inv = ["-i", str(inventory_dir)]
    code, out = cli("plan", *inv, "--json", "--format", "trainjob", *K8S, "--", "--epoch", "1",
                    inventory_dir=inventory_dir, runs_dir=runs_dir)
    assert code == 0, out
    manifest = out["manifest"]
    schema.check(manifest)
    trainer = manifest["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"], trainer["image"]) == (2, 1, IMAGE)
    assert trainer["args"][-2:] == ["--epoch", "1"]
    # The local inventory sets one thread per rank and no pinning: no CPUs are claimed.
    assert {e["name"]: e.get("value") for e in trainer["env"]}["OMP_NUM_THREADS"] == "1"
    assert "resourcesPerNode" in trainer and "cpu" not in trainer["resourcesPerNode"]["limits"]

    # Without --json the YAML alone is on stdout, for kubectl apply -f -.
    env = dict(os.environ, **ENV, TORCHFLEET_RUNS_DIR=str(runs_dir))
    done = subprocess.run([TORCHFLEET, "plan", "-q", *inv, "--format", "pytorchjob", *K8S,
                           "-e", "cpu_pinning=true", "-e", "launch_omp_num_threads=0"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    pytorchjob = yaml.safe_load(done.stdout)
    schema.check(pytorchjob)
    container = pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    # Pinned: whole CPUs, requests equal to limits; as many as a node lets its one rank have.
    resources = container["resources"]
    assert resources["requests"] == resources["limits"] and resources["limits"]["memory"] == "4Gi"
    allowed = node_sh("node-1", "grep Cpus_allowed_list /proc/self/status").split()[-1]
    assert 1 <= int(resources["limits"]["cpu"]) <= len(cpus.parse_cpulist(allowed))


def test_plan_refuses_an_image_by_tag_naming_torchfleet_image(provisioned, inventory_dir, runs_dir):
    code, out = cli("plan", "-i", str(inventory_dir), "--json", "--format", "trainjob", *K8S[2:],
                    inventory_dir=inventory_dir, runs_dir=runs_dir)
    assert code == 2 and out["error"]["variable"] == "torchfleet_image"
    assert "torchfleet/train:2.13.0-cpu" in out["error"]["message"]
