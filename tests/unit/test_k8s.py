"""torchfleet.k8s: the launch spec as a Kubeflow TrainJob or PyTorchJob, held to the upstream
CRDs (torchfleet/k8s/schemas/), to the admission rules carried over from Trainer v2.3.0, the
v1 training operator v1.9.4 and the API server (admission.py), and to the kubelet's CPU
manager (kubelet.py).

Each plan is built by torchfleet.k8s.offline.plan from a node's variables (the launch and
cpu_pinning roles' defaults, overridden), as the plan command does, for a Kubernetes node
given by a real lscpu capture or by counts. Expected values are written out here, each
with the rule it follows, never read from the plan that produced them.
"""

import copy
from pathlib import Path

import pytest
import yaml

from torchfleet import k8s
from torchfleet.errors import InventoryError
from torchfleet.k8s import admission, kubelet, offline, schema

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = {**yaml.safe_load((ROOT / "roles" / "cpu_pinning" / "defaults" / "main.yml").read_text()),
            **yaml.safe_load((ROOT / "roles" / "launch" / "defaults" / "main.yml").read_text())}
# A real capture: Dell R710, 2 sockets x 4 cores x 2 threads, NUMA node 0 = socket 0 = the
# even CPUs (cores 0, 2, 4, 6 with siblings 8, 10, 12, 14), NUMA node 1 = the odd ones.
R710 = ROOT / "tests" / "fixtures" / "lscpu-xeon-e5540-2s-ht-r710.txt"
# Written, not captured: 2 sockets x 2 NUMA nodes x 4 cores x 2 threads (AMD NPS2).
EPYC = ROOT / "tests" / "fixtures" / "lscpu-amd-epyc-nps2.txt"
IMAGE = "registry.example.com/ml/train@sha256:" + "0123456789abcdef" * 4
RUN_ID = "20261127-120000-cafe"
SECRET_VALUE = "hf_s3cr3t-value-never-shown"
PROXY_PASSWORD = "pr0xy-pa55word"
HOSTS = ("node-1", "node-2")
CLAIMS = {"k8s_data_claim": "fashion-mnist", "k8s_workload_claim": "mnist-code", "k8s_output_claim": "runs",
          "k8s_memory": "16Gi"}
NODE = dict(CLAIMS, k8s_node_lscpu=str(R710))


def host_values(**over):
    """A node's variables as a play would template them: the roles' defaults (the templated
    ones left out, as node_input then takes their plain defaults), overridden by ``over``."""
    values = {k: v for k, v in DEFAULTS.items() if not (isinstance(v, str) and "{{" in v)}
    values.update(cpu_pinning_enabled=True, launch_image=IMAGE, launch_run_id=RUN_ID, launch_proxy_env={}, launch_job="mnist",
                  launch_workload=str(ROOT / "files" / "workloads" / "mnist.py"),
                  launch_dataset_dir="/var/lib/torchfleet/datasets/fashion-mnist")
    values.update(over)
    return values


def plan(k8s_values=NODE, procs=1, pinned=True, **over):
    """The redacted spec of a 2-node job for the Kubernetes node ``k8s_values`` describe."""
    values = {h: host_values(torchfleet_procs_per_node=procs, cpu_pinning_enabled=pinned, **over) for h in HOSTS}
    return offline.plan(values, k8s_values)


def render(fmt, k8s_values=NODE, **over):
    return k8s.render(fmt, plan(k8s_values, **over), k8s_values)


def env_of(container_env):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container_env}


def pod(manifest, role="Master"):
    """(container, pod spec) of a node: the TrainJob's trainer with its runtime patch, or
    the PyTorchJob's ``role``."""
    if manifest["kind"] == "TrainJob":
        patch = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
        pod_spec = patch["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        return dict(manifest["spec"]["trainer"], **pod_spec["containers"][0]), pod_spec
    pod_spec = manifest["spec"]["pytorchReplicaSpecs"][role]["template"]["spec"]
    return pod_spec["containers"][0], pod_spec


def cpu_of(manifest):
    container, _ = pod(manifest)
    resources = container.get("resources") or container.get("resourcesPerNode") or {}
    assert resources.get("requests") == resources.get("limits")
    return (resources.get("limits") or {}).get("cpu")


JOBS = {
    "default": dict(),
    "unpinned": dict(pinned=False),
    "two-per-node": dict(procs=2),
    "two-per-node-torchrun": dict(launch_mode="torchrun", procs=2),
}


# --- every rendered manifest passes the schema and admission ------------------------------------


@pytest.mark.parametrize("fmt", k8s.FORMATS)
@pytest.mark.parametrize("job", JOBS, ids=list(JOBS))
def test_rendered_manifests_pass_the_crd_and_every_admission_rule(fmt, job):
    manifest = render(fmt, **JOBS[job]).manifest
    schema.check(manifest)
    assert admission.failures(manifest) == []
    text = k8s.to_yaml(manifest)
    assert yaml.safe_load(text) == manifest
    assert manifest["metadata"]["name"] == "mnist"
    container, pod_spec = pod(manifest)
    assert container["image"] == IMAGE
    procs = 2 if "two" in job else 1
    if fmt == "trainjob":
        assert (manifest["apiVersion"], manifest["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
        assert manifest["spec"]["runtimeRef"]["name"] == "torch-distributed"
        assert manifest["spec"]["runtimePatches"][0]["manager"] == "torchfleet.local/plan"
        assert (container["numNodes"], container["numProcPerNode"]) == (2, procs)
        argv = container["command"][4:] + container["args"]
        assert container["command"][:4] == ["/bin/sh", "-c", 'cd "$0" && exec "$@"', "/workload"]
    else:
        assert (manifest["apiVersion"], manifest["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
        replicas = manifest["spec"]["pytorchReplicaSpecs"]
        assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 1)
        assert manifest["spec"]["nprocPerNode"] == str(procs)
        assert container["name"] == "pytorch" and container["workingDir"] == "/workload"
        assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500}]
        argv = container["command"] + container["args"]
    script = ["python3", "-u", "mnist.py"] if job.endswith("torchrun") else ["python3", "mnist.py"]
    assert argv == ["python3", "-m", "torch.distributed.run", "--no-python", *script,
                    "--epoch", "1", "--seed", "42", "--no-cuda", "--save-model"]
    env = env_of(container["env"])
    assert (env["TORCHFLEET_DATA_DIR"], env["TORCHFLEET_OUT_DIR"]) == ("/data", "/out")
    # The operator and torchrun set these per pod and rank; the host's interface is no pod's.
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "GLOO_SOCKET_IFNAME",
                "TORCHFLEET_CPUSETS", "TORCHFLEET_HEARTBEAT", "TORCHFLEET_RESTART_COUNT"} & set(env)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert {p: (m["name"], m["readOnly"]) for p, m in mounts.items()} == {
        "/data": ("data", True), "/workload": ("workload", True), "/out": ("out", False)}
    assert mounts["/out"]["subPath"] == RUN_ID
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod_spec["volumes"]}
    assert claims == {"data": "fashion-mnist", "workload": "mnist-code", "out": "runs"}
    labels = {"torchfleet.job": "mnist", "torchfleet.run": RUN_ID}
    assert manifest["metadata"]["labels"] == labels
    assert next(t for _, _, t in admission.pod_templates(manifest))["metadata"]["labels"] == labels


# --- the CPU requests are what the static CPU manager grants ------------------------------------
#
# The R710 capture with the kubelet_cpu_manager role's settings: reservedSystemCPUs "0",
# static policy, topologyManagerPolicy single-numa-node. CPU 0 is reserved, so its core (CPUs
# 0 and 8) is no whole core a pod can have: NUMA node 0 keeps 3 whole cores, node 1 all 4.


@pytest.mark.parametrize("fmt", k8s.FORMATS)
def test_two_ranks_on_the_two_socket_ht_capture_ask_whole_cores_of_one_numa_node(fmt):
    manifest = render(fmt, procs=2).manifest
    # single-numa-node: the pod's CPUs come from one NUMA node, node 1 (4 whole cores); 2
    # ranks of 2 cores, and the pod asks for every thread of its 4 cores: cpu 8. The ranks
    # leave the siblings idle (hyper-threads off): 2 threads each.
    assert cpu_of(manifest) == "8"
    assert env_of(pod(manifest)[0]["env"])["OMP_NUM_THREADS"] == "2"


def test_without_numa_alignment_the_pod_takes_every_whole_core():
    # topologyManagerPolicy best-effort admits a pod across NUMA nodes: 7 whole cores (all
    # but CPU 0's), 3 per rank for 2 ranks, 6 cores of 2 threads: cpu 12.
    manifest = render("trainjob", dict(NODE, k8s_topology_policy="best-effort"), procs=2).manifest
    assert cpu_of(manifest) == "12"
    assert env_of(pod(manifest)[0]["env"])["OMP_NUM_THREADS"] == "3"


def test_reserved_cpus_are_left_out_of_the_request():
    # 16 CPUs, one socket, no hyper-threads, reservedSystemCPUs 0-1: the static policy never
    # gives CPUs 0 and 1 to a pod (GetAvailableCPUs), so one rank asks for the other 14.
    counts = dict(CLAIMS, k8s_node_cpus=16, k8s_reserved_cpus="0-1", k8s_topology_policy="none")
    assert cpu_of(render("pytorchjob", counts).manifest) == "14"
    # With 2 threads per core (8 cores, CPU 8 the sibling of CPU 0) and full-pcpus-only, the
    # reserved CPU 0 takes its whole core: 7 cores, 14 CPUs, a multiple of 2 as the policy asks.
    ht = dict(CLAIMS, k8s_node_cpus=16, k8s_node_threads_per_core=2, k8s_reserved_cpus="0", k8s_full_pcpus_only=True)
    manifest = render("pytorchjob", ht).manifest
    assert cpu_of(manifest) == "14"
    assert env_of(pod(manifest)[0]["env"])["OMP_NUM_THREADS"] == "7"


def test_a_pod_larger_than_one_numa_node_is_refused_under_single_numa_node():
    # 6 cores (12 CPUs) for one rank, but single-numa-node needs them on one NUMA node, and
    # the largest has 4 whole cores: the kubelet would fail the pod with TopologyAffinityError.
    with pytest.raises(kubelet.KubeletRuleError) as err:
        render("trainjob", cpu_pinning_cores_per_rank=6)
    assert err.value.rule == "topology" and err.value.variable == "cpu_pinning_cores_per_rank"
    assert "policy_single_numa_node.go" in err.value.message
    # Unset, the cores per rank fill the best NUMA node: 4 cores, cpu 8.
    assert cpu_of(render("trainjob").manifest) == "8"
    # best-effort admits the 6 cores across both nodes: cpu 12.
    assert cpu_of(render("trainjob", dict(NODE, k8s_topology_policy="best-effort"),
                         cpu_pinning_cores_per_rank=6).manifest) == "12"


def test_the_kubelets_defaults_here_are_the_kubelet_roles():
    role = yaml.safe_load((ROOT / "roles" / "kubelet_cpu_manager" / "defaults" / "main.yml").read_text())
    ours = {name: default for name, (default, _) in k8s.VARIABLES.items()}
    assert ours["k8s_reserved_cpus"] == role["kubelet_cpu_manager_reserved_cpus"]
    assert ours["k8s_cpu_manager_policy"] == role["kubelet_cpu_manager_policy"]
    assert ours["k8s_topology_policy"] == role["kubelet_cpu_manager_topology_policy"]
    assert ours["k8s_full_pcpus_only"] == role["kubelet_cpu_manager_full_pcpus_only"]


def test_counts_make_the_node_linux_numbers():
    rows = kubelet.counted({"k8s_node_cpus": 16, "k8s_node_sockets": 2, "k8s_node_threads_per_core": 2})
    by_cpu = {r["cpu"]: (r["core"], r["socket"], r["node"]) for r in rows}
    # 8 cores: CPUs 0-7 their first threads, 8-15 their second; cores 0-3 on socket 0.
    assert by_cpu[0] == by_cpu[8] == (0, 0, 0) and by_cpu[4] == by_cpu[12] == (4, 1, 1)
    with pytest.raises(InventoryError) as err:
        kubelet.counted({"k8s_node_cpus": 15, "k8s_node_threads_per_core": 2})
    assert err.value.variable == "k8s_node_cpus"


def test_pinning_without_a_kubernetes_node_is_refused_naming_its_variable():
    with pytest.raises(InventoryError) as err:
        plan(CLAIMS)
    assert err.value.variable == "k8s_node_lscpu"
    # Unpinned, the threads still need the node's CPUs, or launch_omp_num_threads.
    with pytest.raises(InventoryError) as err:
        plan(CLAIMS, pinned=False)
    assert err.value.variable == "launch_omp_num_threads"
    unpinned = render("trainjob", CLAIMS, pinned=False, launch_omp_num_threads=3).manifest
    assert env_of(pod(unpinned)[0]["env"])["OMP_NUM_THREADS"] == "3"


def test_unpinned_pods_take_their_threads_from_the_kubernetes_node_and_claim_no_cpus():
    manifest = render("pytorchjob", dict(NODE, k8s_memory=""), procs=2, pinned=False).manifest
    container, _ = pod(manifest)
    assert "resources" not in container
    # The R710's 16 CPUs shared by 2 ranks, as an unpinned node shares its own.
    assert env_of(container["env"])["OMP_NUM_THREADS"] == "8"


def test_pinning_without_memory_is_refused_naming_k8s_memory():
    with pytest.raises(InventoryError) as err:
        render("trainjob", dict(NODE, k8s_memory=""))
    assert err.value.variable == "k8s_memory"


def test_a_plan_of_another_machines_cpus_is_refused():
    # CPU 20 is no CPU of the R710: cpusets made on an inventory node mean nothing here.
    built = plan()
    for rank in built["ranks"]:
        rank["cpuset"] = "20-23"
    with pytest.raises(InventoryError) as err:
        k8s.render("trainjob", built, NODE)
    assert err.value.variable == "k8s_node_lscpu" and "20-23" in err.value.message


# --- PyTorchJob workers and the operator's init container --------------------------------------


def test_pytorchjob_workers_are_said_to_be_burstable_unless_the_operators_init_container_is_guaranteed():
    rendered = render("pytorchjob", procs=2)
    assert len(rendered.warnings) == 1
    assert "Worker pods are Burstable" in rendered.warnings[0] and "initcontainer.go" in rendered.warnings[0]
    # The Worker as the operator makes it: its container plus init-pytorch.
    container, _ = pod(rendered.manifest, "Worker")
    assert kubelet.qos_class([container["resources"], k8s.INIT_PYTORCH]) == "Burstable"
    assert kubelet.qos_class([container["resources"]]) == "Guaranteed"
    assert render("pytorchjob", dict(NODE, k8s_worker_init_guaranteed=True), procs=2).warnings == []
    # A TrainJob's node pods have no such init container.
    assert render("trainjob", procs=2).warnings == []


def test_qos_follows_the_kubelets_rules():
    whole = {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    assert kubelet.qos_class([whole]) == "Guaranteed"
    # Limits alone: the API server sets the requests to them.
    assert kubelet.qos_class([{"limits": {"cpu": "2", "memory": "1Gi"}}]) == "Guaranteed"
    assert kubelet.qos_class([{"requests": {"cpu": "2"}, "limits": {"cpu": "2"}}]) == "Burstable"
    assert kubelet.qos_class([{}]) == "BestEffort"
    assert kubelet.quantity("1500m") == kubelet.quantity("1.5") and kubelet.quantity("1Ki") == 1024


# --- what a Kubeflow user expects ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", k8s.FORMATS)
def test_labels_queue_placement_and_pull_secrets_reach_the_pods(fmt):
    values = dict(NODE, k8s_labels={"team": "vision"}, k8s_queue_name="research",
                  k8s_node_selector={"node.kubernetes.io/instance-type": "r710"},
                  k8s_tolerations=[{"key": "training", "operator": "Exists", "effect": "NoSchedule"}],
                  k8s_image_pull_secrets=["regcred"], k8s_namespace="ml")
    rendered = render(fmt, values)
    manifest = rendered.manifest
    assert manifest["metadata"]["labels"] == {"torchfleet.job": "mnist", "torchfleet.run": RUN_ID, "team": "vision",
                                              "kueue.x-k8s.io/queue-name": "research"}
    for _, _, template in admission.pod_templates(manifest):
        assert template["metadata"]["labels"] == {"torchfleet.job": "mnist", "torchfleet.run": RUN_ID,
                                                  "team": "vision"}
        spec = template["spec"]
        assert spec["nodeSelector"] == {"node.kubernetes.io/instance-type": "r710"}
        assert spec["tolerations"] == [{"key": "training", "operator": "Exists", "effect": "NoSchedule"}]
        assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    commands = " ".join(n.get("command", "") for n in rendered.needs)
    assert "kubectl create secret docker-registry regcred --namespace ml --docker-server=registry.example.com" \
        in commands


def test_a_bad_label_is_refused_naming_its_variable():
    with pytest.raises(InventoryError) as err:
        render("trainjob", dict(NODE, k8s_labels={"team": "a b"}))
    assert err.value.variable == "k8s_labels"


def test_restarts_map_to_the_operators_retries_with_a_checkpoint_claim():
    with pytest.raises(InventoryError) as err:
        render("pytorchjob", launch_max_restarts=2)
    assert err.value.variable == "k8s_checkpoint_claim"
    manifest = render("pytorchjob", dict(NODE, k8s_checkpoint_claim="ckpt"), launch_max_restarts=2).manifest
    replicas = manifest["spec"]["pytorchReplicaSpecs"]
    assert {r["restartPolicy"] for r in replicas.values()} == {"OnFailure"}
    # The operator sums the running pods' container restarts (pkg/core/job.go): one restart of
    # the job restarts both pods, so 2 restarts are 4, and the 5th restart ends the job.
    assert manifest["spec"]["runPolicy"]["backoffLimit"] == 5
    container, pod_spec = pod(manifest)
    assert {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": False} in container["volumeMounts"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "ckpt", "readOnly": False}} \
        in pod_spec["volumes"]
    assert env_of(container["env"])["TORCHFLEET_CHECKPOINT_DIR"] == "/checkpoints"
    # A TrainJob cannot set retries.
    with pytest.raises(InventoryError) as err:
        render("trainjob", dict(NODE, k8s_checkpoint_claim="ckpt"), launch_max_restarts=2)
    assert err.value.variable == "launch_max_restarts"
    # Without restarts a failed run is not retried, as torchfleet's own is not.
    assert render("pytorchjob").manifest["spec"]["runPolicy"] == {"backoffLimit": 0}


def test_needs_name_the_claims_the_secret_and_the_operator():
    rendered = render("pytorchjob", dict(NODE, k8s_secret_name="mnist-secrets", k8s_namespace="ml"),
                      launch_secret_env={"HF_TOKEN": SECRET_VALUE})
    claims = {n["manifest"]["metadata"]["name"]: n["manifest"] for n in rendered.needs if "manifest" in n}
    assert set(claims) == {"fashion-mnist", "mnist-code", "runs"}
    # Two nodes share each claim.
    assert claims["runs"]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claims["runs"]["metadata"]["namespace"] == "ml"
    secret = next(n["command"] for n in rendered.needs if "secret generic" in n.get("command", ""))
    assert secret == 'kubectl create secret generic mnist-secrets --namespace ml --from-literal=HF_TOKEN="$HF_TOKEN"'
    assert SECRET_VALUE not in k8s.needs_text(rendered)
    assert "overlays/standalone?ref=v1.9.4" in k8s.needs_text(rendered)


def test_a_job_timeout_becomes_the_deadline_and_the_grace_the_pods():
    over = dict(launch_timeout=3600.5, launch_stop_grace=7)
    train = render("trainjob", **over).manifest
    assert train["spec"]["activeDeadlineSeconds"] == 3601
    assert pod(train)[1]["terminationGracePeriodSeconds"] == 7
    torch = render("pytorchjob", **over).manifest
    assert torch["spec"]["runPolicy"] == {"backoffLimit": 0, "activeDeadlineSeconds": 3601}


def test_a_trainer_older_than_v2_3_is_refused():
    with pytest.raises(InventoryError) as err:
        render("trainjob", dict(NODE, k8s_trainer_version="v2.2.1"))
    assert err.value.variable == "k8s_trainer_version"
    assert render("trainjob", dict(NODE, k8s_trainer_version="v2.3.0")).manifest["kind"] == "TrainJob"


# --- each admission and kubelet rule fails its mutated manifest ---------------------------------


def _set(path, value):
    def mutate(manifest):
        node = manifest
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return mutate


PATCH_POD = ["spec", "runtimePatches", 0, "trainingRuntimeSpec", "template", "spec", "replicatedJobs", 0, "template",
             "spec", "template", "spec"]
MASTER = ["spec", "pytorchReplicaSpecs", "Master", "template", "spec", "containers", 0]
MUTATIONS = {
    # rule: (format, mutation, the field the error names)
    "labels": ("trainjob", _set(["metadata", "labels", "torchfleet.job"], "not a label!"), "metadata.labels"),
    "list-map-keys": ("pytorchjob", lambda m: m["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
                      ["containers"][0]["env"].append({"name": "TORCHFLEET_RUN_ID", "value": "x"}),
                      "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].env"),
    # The issue's own: Trainer answers `must be a domain-prefixed path (such as "acme.io/foo")`.
    "runtime-patch-manager": ("trainjob", _set(["spec", "runtimePatches", 0, "manager"], "torchfleet"),
                              "spec.runtimePatches[0].manager"),
    "runtime-patch-jobs": ("trainjob", _set(PATCH_POD + ["containers", 0, "name"], "trainer"), "containers[0].name"),
    "runtime-patch-env": ("trainjob", _set(PATCH_POD + ["containers", 0, "env"], [{"name": "A", "value": "1"}]),
                          "containers[0].env"),
    "trainer-reserved-env": ("trainjob", lambda m: m["spec"]["trainer"]["env"].append(
        {"name": "PET_NNODES", "value": "4"}), "spec.trainer.env"),
    "trainjob-name": ("trainjob", _set(["metadata", "name"], "MNIST_run"), "metadata.name"),
    "pytorchjob-name": ("pytorchjob", _set(["metadata", "name"], "9lives"), "metadata.name"),
    "pytorchjob-replicas": ("pytorchjob", _set(["spec", "pytorchReplicaSpecs", "Master", "replicas"], 2),
                            "spec.pytorchReplicaSpecs.Master.replicas"),
    "pytorchjob-containers": ("pytorchjob", _set(MASTER + ["name"], "main"),
                              "spec.pytorchReplicaSpecs.Master.template.spec.containers"),
    "pytorchjob-operator-env": ("pytorchjob", lambda m: m["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]
                                ["containers"][0]["env"].append({"name": "WORLD_SIZE", "value": "2"}),
                                "spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].env"),
    "pytorchjob-master-port": ("pytorchjob", lambda m: m["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
                               ["containers"][0].pop("ports"), "spec.pytorchReplicaSpecs.Master.template.spec"),
}


def test_every_admission_rule_has_a_mutation_here():
    assert {r.name for r in admission.RULES} == set(MUTATIONS)
    for r in admission.RULES:
        assert r.source.startswith(("kubeflow/trainer v", "kubernetes/kubernetes")) and ".go" in r.source + ".go"


@pytest.mark.parametrize("name", MUTATIONS)
def test_each_admission_rule_fails_its_mutated_manifest(name):
    fmt, mutate, field = MUTATIONS[name]
    manifest = copy.deepcopy(render(fmt).manifest)
    mutate(manifest)
    with pytest.raises(admission.AdmissionError) as err:
        admission.check(manifest)
    assert name in err.value.rules
    assert any(field in f for f in err.value.fields), err.value.message


def test_the_manager_failure_says_what_trainer_says():
    manifest = render("trainjob").manifest
    manifest["spec"]["runtimePatches"][0]["manager"] = "torchfleet"
    with pytest.raises(admission.AdmissionError) as err:
        admission.check(manifest)
    assert 'must be a domain-prefixed path (such as "acme.io/foo")' in err.value.message
    assert "pkg/runtime/framework/plugins/jobset/jobset.go" in err.value.message


def _resources(cpu, memory="16Gi", limit_memory=None):
    return {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": cpu, "memory": limit_memory or memory}}


KUBELET_MUTATIONS = {
    # rule: (the node's variables, the pod's resources)
    "guaranteed": (NODE, _resources("8", "8Gi", "16Gi")),
    "integer-cpu": (NODE, _resources("2500m")),
    # 16 CPUs less the 2 reserved leave 14.
    "reserved-cpus": (dict(CLAIMS, k8s_node_cpus=16, k8s_reserved_cpus="0-1", k8s_topology_policy="none"),
                      _resources("15")),
    # 7 is no multiple of the R710's 2 threads per core.
    "full-pcpus-only": (dict(NODE, k8s_full_pcpus_only=True, k8s_topology_policy="none"), _resources("7")),
    # 10 CPUs, but a NUMA node of the R710 has 8.
    "topology": (NODE, _resources("10")),
}


def test_every_kubelet_rule_has_a_mutation_here():
    assert set(kubelet.RULES) == set(KUBELET_MUTATIONS)


@pytest.mark.parametrize("name", KUBELET_MUTATIONS)
@pytest.mark.parametrize("fmt", k8s.FORMATS)
def test_each_kubelet_rule_fails_its_mutated_manifest(name, fmt):
    values, resources = KUBELET_MUTATIONS[name]
    manifest = copy.deepcopy(render(fmt).manifest)
    if fmt == "trainjob":
        manifest["spec"]["trainer"]["resourcesPerNode"] = resources
    else:
        manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["resources"] = resources
    kube = kubelet.node(k8s.variables(values))
    with pytest.raises(kubelet.KubeletRuleError) as err:
        k8s.check_pods(manifest, kube)
    assert err.value.rule == name


def test_restricted_refuses_a_pod_that_the_fewest_numa_nodes_cannot_hold():
    # 4 NUMA nodes of 8 CPUs, a core of each reserved: 8 CPUs fit one node's total, so
    # restricted prefers a one-node hint, but no node has 8 free (policy_restricted.go).
    values = dict(CLAIMS, k8s_node_lscpu=str(EPYC), k8s_reserved_cpus="0,4,8,12", k8s_topology_policy="restricted")
    kube = kubelet.node(k8s.variables(values))
    with pytest.raises(kubelet.KubeletRuleError) as err:
        kubelet.check_grant(kube, "8")
    assert err.value.rule == "topology"
    # 6 fit one node's free CPUs; 12 need two nodes, whose free CPUs (6 each) hold them.
    kubelet.check_grant(kube, "6")
    kubelet.check_grant(kube, "12")
    # 16 need two nodes too, but no two have 16 free.
    with pytest.raises(kubelet.KubeletRuleError):
        kubelet.check_grant(kube, "16")


def test_the_list_map_check_reads_the_crds_keys_and_defaults():
    manifest = render("pytorchjob").manifest
    ports = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["ports"]
    # containerPort and protocol are the keys; an unset protocol is TCP.
    ports.append({"name": "other", "containerPort": 29500, "protocol": "TCP"})
    assert [f for f, _ in schema.duplicate_keys(manifest)] == [
        "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].ports[1]"]
    ports[1]["protocol"] = "UDP"
    assert schema.duplicate_keys(manifest) == []


# --- the schema check can fail, and names the field --------------------------------------------


def test_a_string_node_count_fails_naming_the_field():
    manifest = render("trainjob").manifest
    manifest["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(schema.SchemaError) as err:
        schema.check(manifest)
    assert err.value.fields == ["spec.trainer.numNodes"]
    assert "spec.trainer.numNodes: '2' is not of type 'integer'" in err.value.message


def test_a_missing_container_fails_naming_the_field():
    manifest = render("pytorchjob").manifest
    del manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    with pytest.raises(schema.SchemaError) as err:
        schema.check(manifest)
    assert err.value.fields == ["spec.pytorchReplicaSpecs.Master.template.spec.containers"]


def test_a_misspelled_field_fails_as_the_api_server_would_prune_it():
    manifest = render("trainjob").manifest
    manifest["spec"]["trainer"]["numProcsPerNode"] = manifest["spec"]["trainer"].pop("numProcPerNode")
    with pytest.raises(schema.SchemaError) as err:
        schema.check(manifest)
    assert err.value.fields == ["spec.trainer.numProcsPerNode"]
    assert "did you mean numProcPerNode?" in err.value.message


def test_k8s_name_is_checked_before_rendering():
    with pytest.raises(InventoryError) as err:
        render("pytorchjob", dict(NODE, k8s_name="9lives"))
    assert err.value.variable == "k8s_name"


def test_a_bad_memory_quantity_fails_naming_the_field():
    with pytest.raises(schema.SchemaError) as err:
        render("pytorchjob", dict(NODE, k8s_memory="16 GB"))
    assert "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].resources.limits.memory" in err.value.fields


# --- secrets ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", k8s.FORMATS)
def test_a_secret_is_a_reference_to_the_named_secret_never_its_value(fmt):
    over = dict(launch_secret_env={"HF_TOKEN": SECRET_VALUE},
                launch_extra_env={"https_proxy": f"http://user:{PROXY_PASSWORD}@proxy.internal:3128", "A": "1"})
    rendered = render(fmt, dict(NODE, k8s_secret_name="mnist-secrets"), **over)
    text = k8s.to_yaml(rendered.manifest) + k8s.needs_text(rendered)
    assert SECRET_VALUE not in text and PROXY_PASSWORD not in text
    env = env_of(pod(rendered.manifest)[0]["env"])
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "mnist-secrets", "key": "HF_TOKEN"}}
    assert env["https_proxy"] == {"secretKeyRef": {"name": "mnist-secrets", "key": "https_proxy"}}
    assert env["A"] == "1"


def test_secrets_without_a_secret_name_are_refused():
    with pytest.raises(InventoryError) as err:
        render("trainjob", launch_secret_env={"HF_TOKEN": SECRET_VALUE})
    assert err.value.variable == "k8s_secret_name"
    assert SECRET_VALUE not in err.value.message


# --- refused by name ----------------------------------------------------------------------------


@pytest.mark.parametrize("over, variable", [
    (dict(launch_mode="mpirun"), "launch_mode"),
    (dict(launch_mode="process"), "launch_mode"),
    (dict(launch_mode="slurm"), "launch_mode"),
    (dict(launch_mode="torchrun", launch_torchrun_runtime="process"), "launch_torchrun_runtime"),
    (dict(launch_sgx_devices=["/dev/sgx/enclave", "/dev/sgx/provision"]), "launch_sgx_devices"),
    (dict(launch_extra_devices=["/dev/fuse"]), "launch_extra_devices"),
    (dict(launch_sgx_enabled=True), "launch_sgx_enabled"),
    (dict(launch_sgx_aesm_socket=True, launch_sgx_aesm_socket_path="/var/run/aesmd/aesm.socket"),
     "launch_sgx_aesm_socket"),
    (dict(launch_gloo_tls=True, launch_tls_node_dir="/etc/torchfleet/pki", launch_tls_mount="/ppml/certs"),
     "launch_gloo_tls"),
    (dict(launch_extra_volumes=["/srv/cache:/cache"]), "launch_extra_volumes"),
    (dict(launch_oom_kill_disable=True), "launch_oom_kill_disable"),
    (dict(launch_stall_timeout=60), "launch_stall_timeout"),
    (dict(launch_checkpoint_dir="/srv/ckpt"), "k8s_checkpoint_claim"),
    (dict(launch_image="torchfleet/train:2.13.0-cpu"), "torchfleet_image"),
    (dict(launch_extra_env={"PET_NNODES": "4"}), "launch_extra_env"),
    (dict(launch_transport="wireguard"), "launch_transport"),
    (dict(cpu_pinning_cpusets=["0-3"]), "cpu_pinning_cpusets"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_variables_without_kubernetes_meaning_are_refused_by_name(over, variable):
    with pytest.raises(InventoryError) as err:
        render("pytorchjob", **over)
    assert err.value.variable == variable
    assert variable in err.value.message


def test_every_refusal_is_named_in_one_message():
    with pytest.raises(InventoryError) as err:
        render("trainjob", dict(NODE, k8s_data_claim="", k8s_output_claim=""),
               launch_image="torchfleet/train:2.13.0-cpu", launch_extra_devices=["/dev/fuse"])
    for variable in ("launch_extra_devices", "torchfleet_image", "k8s_data_claim", "k8s_output_claim"):
        assert variable in err.value.message


def test_a_trainjob_refuses_a_master_port_its_runtime_does_not_use():
    with pytest.raises(InventoryError) as err:
        render("trainjob", launch_master_port=29555)
    assert err.value.variable == "launch_master_port"
    torch = render("pytorchjob", launch_master_port=29555).manifest
    assert pod(torch)[0]["ports"][0]["containerPort"] == 29555


def test_unequal_nodes_are_refused_by_name():
    built = plan()
    built["ranks"][1]["threads"] = 3
    with pytest.raises(InventoryError) as err:
        k8s.render("trainjob", built, NODE)
    assert err.value.variable == "launch_omp_num_threads"


def test_an_unknown_k8s_variable_is_refused_with_the_one_meant():
    with pytest.raises(InventoryError) as err:
        render("trainjob", dict(NODE, k8s_secret="x"))
    assert err.value.variable == "k8s_secret"
    assert "k8s_secret_name" in err.value.message


def test_a_k8s_variable_of_the_wrong_type_is_refused_by_name():
    with pytest.raises(InventoryError) as err:
        k8s.variables({"k8s_tolerations": "NoSchedule"})
    assert err.value.variable == "k8s_tolerations"
    with pytest.raises(InventoryError) as err:
        k8s.variables({"k8s_node_cpus": "many"})
    assert err.value.variable == "k8s_node_cpus"
