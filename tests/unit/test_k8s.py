"""torchfleet.k8s: the launch spec as a Kubeflow TrainJob or PyTorchJob, checked against the
upstream CRDs shipped in torchfleet/k8s/schemas/.

The spec is built with spec.build from each node's checked input (inputs.node_input over the
launch role's defaults), as the launch_spec action does. Expected values are written out
here, never read from the spec that produced them.
"""

from pathlib import Path

import pytest
import yaml

from torchfleet import inputs as launch_inputs
from torchfleet import k8s, spec
from torchfleet.errors import InventoryError
from torchfleet.k8s import schema
from torchfleet.ranks import rank_table

ROOT = Path(__file__).resolve().parents[2]
DEFAULTS = yaml.safe_load((ROOT / "roles" / "launch" / "defaults" / "main.yml").read_text())
IMAGE = "registry.example.com/ml/train@sha256:" + "0123456789abcdef" * 4
RUN_ID = "20261127-120000-cafe"
SECRET_VALUE = "hf_s3cr3t-value-never-shown"
PROXY_PASSWORD = "pr0xy-pa55word"
# Two nodes of 8 CPUs; pinned, each rank of a node gets its own 4 cores.
HOSTS = [("node-1", "10.0.0.11"), ("node-2", "10.0.0.12")]
PINNING = {1: [{"cpuset": "0-3", "cpuset_mems": "0", "omp_num_threads": 4}],
           2: [{"cpuset": "0-3", "cpuset_mems": "0", "omp_num_threads": 4},
               {"cpuset": "4-7", "cpuset_mems": "0", "omp_num_threads": 4}]}
CLAIMS = {"k8s_data_claim": "fashion-mnist", "k8s_workload_claim": "mnist-code", "k8s_output_claim": "runs"}


def inputs(host, **over):
    """What launch_input hands build for a node: the launch role's defaults (its templated
    ones left out, as node_input then takes their plain defaults), overridden by ``over``."""
    values = {k: v for k, v in DEFAULTS.items() if k in launch_inputs.input_variables() and not (isinstance(v, str) and "{{" in v)}
    values.update(launch_dataset_dir="/var/lib/torchfleet/datasets/fashion-mnist", **over)
    return launch_inputs.node_input(values, host)


def plan(mode="container", procs=1, pinned=False, image=IMAGE, port=29500, **over):
    """The redacted spec of a 2-node job, as torchfleet plan --json shows it."""
    job = {"run_id": RUN_ID, "job": "mnist", "mode": mode, "transport": "tcp", "image": image,
           "torchrun_runtime": over.pop("runtime", "container"), "container_prefix": "torchfleet", "command": [],
           "args": ["--epoch", "1", "--data", "{data_dir}"], "workload_argv": ["python3", "mnist.py"], "warnings": [],
           "guard": {k: DEFAULTS[v] for k, v in spec.GUARD_VARIABLES.items()}}
    job["guard"].update(over.pop("guard", {}))
    table = rank_table([{"name": h, "address": a, "procs": procs} for h, a in HOSTS], port)
    nodes = {}
    for host, address in HOSTS:
        checked = inputs(host, launch_mode=mode, **over)
        nodes[host] = {"address": address, "interface": "eth0", "nproc": 8,
                       "pinning": [dict(p) for p in PINNING[procs]] if pinned else [], "mpi_network": "",
                       "settings": checked["settings"], "env_public": checked["env_public"],
                       "env_shown": checked["env_shown"]}
    return spec.redacted(spec.build(job, table, nodes))


def env_of(container_env):
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container_env}


def pod(manifest):
    """(container, pod spec) of a node: the TrainJob's trainer with its runtime patch, or
    the PyTorchJob's Master."""
    if manifest["kind"] == "TrainJob":
        patch = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
        pod_spec = patch["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        return dict(manifest["spec"]["trainer"], **pod_spec["containers"][0]), pod_spec
    pod_spec = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    return pod_spec["containers"][0], pod_spec


JOBS = {
    "default": dict(),
    "pinned": dict(pinned=True),
    "two-per-node": dict(procs=2),
    "two-per-node-pinned-torchrun": dict(mode="torchrun", procs=2, pinned=True),
}


# --- the three jobs pass the shipped schemas ----------------------------------------------------


@pytest.mark.parametrize("fmt", k8s.FORMATS)
@pytest.mark.parametrize("job", JOBS, ids=list(JOBS))
def test_rendered_manifests_pass_the_shipped_crd(fmt, job):
    manifest = k8s.render(fmt, plan(**JOBS[job]), dict(CLAIMS, k8s_memory="16Gi"))
    schema.check(manifest)  # render checked it already; this says the check is the shipped CRD's
    text = k8s.to_yaml(manifest)
    assert yaml.safe_load(text) == manifest
    assert manifest["metadata"]["name"] == "mnist"
    container, pod_spec = pod(manifest)
    assert container["image"] == IMAGE
    procs = 2 if "two" in job else 1
    if fmt == "trainjob":
        assert (manifest["apiVersion"], manifest["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
        assert manifest["spec"]["runtimeRef"]["name"] == "torch-distributed"
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
    assert argv == ["python3", "-m", "torch.distributed.run", "--no-python", *script, "--epoch", "1", "--data", "/data"]
    env = env_of(container["env"])
    # Threads: 4 pinned cores per rank; unpinned, the node's 8 CPUs shared by its ranks.
    assert env["OMP_NUM_THREADS"] == ("4" if "pinned" in job else str(8 // procs))
    assert (env["TORCHFLEET_DATA_DIR"], env["TORCHFLEET_OUT_DIR"]) == ("/data", "/out")
    # The operator and torchrun set these per pod and rank; the host's interface is no pod's.
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "GLOO_SOCKET_IFNAME",
                "TORCHFLEET_CPUSETS", "TORCHFLEET_HEARTBEAT"} & set(env)
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert {p: (m["name"], m["readOnly"]) for p, m in mounts.items()} == {
        "/data": ("data", True), "/workload": ("workload", True), "/out": ("out", False)}
    assert mounts["/out"]["subPath"] == RUN_ID
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod_spec["volumes"]}
    assert claims == {"data": "fashion-mnist", "workload": "mnist-code", "out": "runs"}


@pytest.mark.parametrize("fmt", k8s.FORMATS)
def test_pinned_pods_ask_for_whole_cpus_with_requests_equal_to_limits(fmt):
    container, _ = pod(k8s.render(fmt, plan(procs=2, pinned=True), dict(CLAIMS, k8s_memory="16Gi")))
    resources = container.get("resources") or container.get("resourcesPerNode")
    # Two ranks of 4 cores each: 8 whole CPUs, Guaranteed QoS.
    assert resources == {"requests": {"cpu": "8", "memory": "16Gi"}, "limits": {"cpu": "8", "memory": "16Gi"}}


@pytest.mark.parametrize("fmt", k8s.FORMATS)
def test_unpinned_pods_claim_no_cpus(fmt):
    container, _ = pod(k8s.render(fmt, plan(), CLAIMS))
    assert "resources" not in container and "resourcesPerNode" not in container


def test_pinning_without_memory_is_refused_naming_k8s_memory():
    with pytest.raises(InventoryError) as err:
        k8s.render("trainjob", plan(pinned=True), CLAIMS)
    assert err.value.variable == "k8s_memory"


def test_a_job_timeout_becomes_the_deadline_and_the_grace_the_pods():
    built = plan(guard={"timeout": 3600.5, "stop_grace": 7})
    train = k8s.render("trainjob", built, CLAIMS)
    assert train["spec"]["activeDeadlineSeconds"] == 3601
    assert pod(train)[1]["terminationGracePeriodSeconds"] == 7
    torch = k8s.render("pytorchjob", built, CLAIMS)
    assert torch["spec"]["runPolicy"] == {"backoffLimit": 0, "activeDeadlineSeconds": 3601}


# --- the check can fail, and names the field ----------------------------------------------------


def test_a_string_node_count_fails_naming_the_field():
    manifest = k8s.render("trainjob", plan(), CLAIMS)
    manifest["spec"]["trainer"]["numNodes"] = "2"
    with pytest.raises(schema.SchemaError) as err:
        schema.check(manifest)
    assert err.value.fields == ["spec.trainer.numNodes"]
    assert "spec.trainer.numNodes: '2' is not of type 'integer'" in err.value.message

    manifest = k8s.render("pytorchjob", plan(), CLAIMS)
    manifest["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "1"
    with pytest.raises(schema.SchemaError) as err:
        schema.check(manifest)
    assert err.value.fields == ["spec.pytorchReplicaSpecs.Worker.replicas"]


def test_a_missing_container_fails_naming_the_field():
    manifest = k8s.render("pytorchjob", plan(), CLAIMS)
    del manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"]
    with pytest.raises(schema.SchemaError) as err:
        schema.check(manifest)
    assert err.value.fields == ["spec.pytorchReplicaSpecs.Master.template.spec.containers"]

    manifest = k8s.render("trainjob", plan(), CLAIMS)
    patched = pod(manifest)[1]["containers"][0]
    del patched["name"]
    with pytest.raises(schema.SchemaError) as err:
        schema.check(manifest)
    assert err.value.fields == ["spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0]"
                                ".template.spec.template.spec.containers[0].name"]


def test_a_misspelled_field_fails_as_the_api_server_would_prune_it():
    manifest = k8s.render("trainjob", plan(), CLAIMS)
    manifest["spec"]["trainer"]["numProcsPerNode"] = manifest["spec"]["trainer"].pop("numProcPerNode")
    with pytest.raises(schema.SchemaError) as err:
        schema.check(manifest)
    assert err.value.fields == ["spec.trainer.numProcsPerNode"]
    assert "did you mean numProcPerNode?" in err.value.message


def test_a_name_the_crd_rule_refuses_fails_and_k8s_name_is_checked_first():
    manifest = k8s.render("trainjob", plan(), CLAIMS)
    manifest["metadata"]["name"] = "MNIST_run"
    with pytest.raises(schema.SchemaError) as err:
        schema.check(manifest)
    assert err.value.fields == ["metadata.name"]
    with pytest.raises(InventoryError) as err:
        k8s.render("pytorchjob", plan(), dict(CLAIMS, k8s_name="9lives"))
    assert err.value.variable == "k8s_name"


def test_a_bad_memory_quantity_fails_naming_the_field():
    with pytest.raises(schema.SchemaError) as err:
        k8s.render("pytorchjob", plan(pinned=True), dict(CLAIMS, k8s_memory="16 GB"))
    assert "spec.pytorchReplicaSpecs.Master.template.spec.containers[0].resources.limits.memory" in err.value.fields


# --- secrets ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", k8s.FORMATS)
def test_a_secret_is_a_reference_to_the_named_secret_never_its_value(fmt):
    built = plan(launch_secret_env={"HF_TOKEN": SECRET_VALUE},
                 launch_extra_env={"https_proxy": f"http://user:{PROXY_PASSWORD}@proxy.internal:3128", "A": "1"})
    manifest = k8s.render(fmt, built, dict(CLAIMS, k8s_secret_name="mnist-secrets"))
    text = k8s.to_yaml(manifest)
    assert SECRET_VALUE not in text and PROXY_PASSWORD not in text
    env = env_of(pod(manifest)[0]["env"])
    assert env["HF_TOKEN"] == {"secretKeyRef": {"name": "mnist-secrets", "key": "HF_TOKEN"}}
    assert env["https_proxy"] == {"secretKeyRef": {"name": "mnist-secrets", "key": "https_proxy"}}
    assert env["A"] == "1"


def test_secrets_without_a_secret_name_are_refused():
    with pytest.raises(InventoryError) as err:
        k8s.render("trainjob", plan(launch_secret_env={"HF_TOKEN": SECRET_VALUE}), CLAIMS)
    assert err.value.variable == "k8s_secret_name"
    assert SECRET_VALUE not in err.value.message


# --- refused by name ----------------------------------------------------------------------------


@pytest.mark.parametrize("over, variable", [
    (dict(mode="mpirun"), "launch_mode"),
    (dict(mode="process"), "launch_mode"),
    (dict(mode="torchrun", runtime="process"), "launch_torchrun_runtime"),
    (dict(launch_sgx_devices=["/dev/sgx/enclave", "/dev/sgx/provision"]), "launch_sgx_devices"),
    (dict(launch_extra_devices=["/dev/fuse"]), "launch_extra_devices"),
    (dict(launch_sgx_enabled=True), "launch_sgx_enabled"),
    (dict(launch_sgx_aesm_socket=True, launch_sgx_aesm_socket_path="/var/run/aesmd/aesm.socket"),
     "launch_sgx_aesm_socket"),
    (dict(launch_gloo_tls=True, launch_tls_node_dir="/etc/torchfleet/pki", launch_tls_mount="/ppml/certs"),
     "launch_gloo_tls"),
    (dict(launch_extra_volumes=["/srv/cache:/cache"]), "launch_extra_volumes"),
    (dict(launch_oom_kill_disable=True), "launch_oom_kill_disable"),
    (dict(guard={"stall_timeout": 60}), "launch_stall_timeout"),
    (dict(guard={"max_restarts": 2}), "launch_max_restarts"),
    (dict(image="torchfleet/train:2.13.0-cpu"), "torchfleet_image"),
    (dict(launch_extra_env={"PET_NNODES": "4"}), "launch_extra_env"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_variables_without_kubernetes_meaning_are_refused_by_name(over, variable):
    if over.get("mode") == "mpirun":
        over = dict(over, launch_ssh_port=12345, launch_ssh_uid=61000, launch_ssh_gid=61000)
    built = plan(**over)
    with pytest.raises(InventoryError) as err:
        k8s.render("pytorchjob", built, dict(CLAIMS, k8s_memory="16Gi"))
    assert err.value.variable == variable
    assert variable in err.value.message


def test_the_wireguard_transport_is_refused_by_name():
    built = dict(plan(), transport="wireguard")
    with pytest.raises(InventoryError) as err:
        k8s.render("trainjob", built, CLAIMS)
    assert err.value.variable == "launch_transport"


def test_every_refusal_is_named_in_one_message():
    built = plan(image="torchfleet/train:2.13.0-cpu", launch_extra_devices=["/dev/fuse"])
    with pytest.raises(InventoryError) as err:
        k8s.render("trainjob", built, {})
    for variable in ("launch_extra_devices", "torchfleet_image", "k8s_data_claim", "k8s_workload_claim",
                     "k8s_output_claim"):
        assert variable in err.value.message


def test_a_trainjob_refuses_a_master_port_its_runtime_does_not_use():
    with pytest.raises(InventoryError) as err:
        k8s.render("trainjob", plan(port=29555), CLAIMS)
    assert err.value.variable == "launch_master_port"
    torch = k8s.render("pytorchjob", plan(port=29555), CLAIMS)
    assert pod(torch)[0]["ports"][0]["containerPort"] == 29555


def test_unequal_nodes_are_refused_by_name():
    built = plan()
    built["ranks"][1]["threads"] = 3
    with pytest.raises(InventoryError) as err:
        k8s.render("trainjob", built, CLAIMS)
    assert err.value.variable == "launch_omp_num_threads"


def test_an_unknown_k8s_variable_is_refused_with_the_one_meant():
    with pytest.raises(InventoryError) as err:
        k8s.render("trainjob", plan(), dict(CLAIMS, k8s_secret="x"))
    assert err.value.variable == "k8s_secret"
    assert "k8s_secret_name" in err.value.message


# --- the kubelet's configuration ----------------------------------------------------------------


def test_kubelet_fields_come_from_the_kubelets_own_type():
    fields = schema.kubelet_fields()
    assert fields["cpuManagerPolicy"] == "string" and fields["reservedSystemCPUs"] == "string"
    assert fields["maxPods"] == "integer" and fields["failSwapOn"] == "boolean"
    assert fields["kubeReserved"] == "object" and fields["cpuManagerPolicyOptions"] == "object"
    assert schema.kubelet_choices()["topologyManagerPolicy"] == {"none", "best-effort", "restricted",
                                                                 "single-numa-node"}


@pytest.mark.parametrize("field, value, named", [
    ("cpuManagerPolicyy", "static", "cpuManagerPolicyy"),
    ("topologyManagerPolicy", "numa-please", "topologyManagerPolicy"),
    ("reservedSystemCPUs", "0-", "reservedSystemCPUs"),
    ("maxPods", "110", "maxPods"),
])
def test_a_bad_kubelet_field_fails_naming_it(field, value, named):
    config = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
              "cpuManagerPolicy": "static", field: value}
    with pytest.raises(schema.SchemaError) as err:
        schema.check_kubelet(config)
    assert err.value.fields == [named]
