"""torchfleet plan --format renders offline: from the inventory's variables and an lscpu
capture of a Kubernetes node, with no playbook, no SSH, no name lookup, and nothing of the
controller's environment in the output.

The inventory's hosts point at loopback ports where nothing listens; an audit hook records
every connection, name lookup and process start that the command tries, and the test fails
on any. Only loopback is named here: never a real machine's address."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# Imported before anything is recorded: on import Ansible asks getaddrinfo about the literal
# 127.0.0.1 (to patch it) and runs ldconfig -p (to find libc), neither of which reaches a node.
import ansible.inventory.manager  # noqa: F401
import ansible.template  # noqa: F401
import ansible.vars.manager  # noqa: F401
from torchfleet import cli
from torchfleet.k8s import admission, schema

ROOT = Path(__file__).resolve().parents[2]
TORCHFLEET = str(Path(sys.executable).parent / "torchfleet")
R710 = ROOT / "tests" / "fixtures" / "lscpu-xeon-e5540-2s-ht-r710.txt"
IMAGE = "registry.example.com/ml/train@sha256:" + "ab" * 32
K8S = ["-e", f"k8s_node_lscpu={R710}", "-e", "k8s_data_claim=fashion-mnist", "-e", "k8s_workload_claim=mnist-code",
       "-e", "k8s_output_claim=runs", "-e", "k8s_memory=4Gi", "-e", "launch_run_id=offline-1"]
# What the command may not do while it renders.
CONTACT = ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyaddr",
           "subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.fork", "os.spawn")
_tried: list[tuple[str, str]] | None = None


def _audit(event, args):
    if _tried is not None and event in CONTACT:
        _tried.append((event, repr(args)[:200]))


sys.addaudithook(_audit)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def inventory(tmp_path):
    """Two nodes at loopback ports that nothing listens on, with the image by digest."""
    hosts = {f"node-{i}": {"ansible_host": "127.0.0.1", "ansible_port": _free_port()} for i in (1, 2)}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {
        "children": {"torchfleet_nodes": {"hosts": hosts}},
        "vars": {"torchfleet_image": IMAGE, "torchfleet_procs_per_node": 2, "ansible_user": "nobody"}}}))
    return tmp_path


def run_in_process(capsys, *argv):
    """torchfleet's main here, every contact it tries recorded."""
    global _tried
    _tried = []
    try:
        code = cli.main(list(argv))
    finally:
        tried, _tried = _tried, None
    return code, capsys.readouterr(), tried


@pytest.mark.parametrize("fmt", ["trainjob", "pytorchjob"])
def test_rendering_contacts_no_node(capsys, inventory, fmt):
    code, out, tried = run_in_process(capsys, "plan", "-q", "--json", "-i", str(inventory), "--format", fmt, *K8S)
    assert tried == []
    assert code == 0, out.out + out.err
    manifest = json.loads(out.out)["manifest"]
    schema.check(manifest)
    assert admission.failures(manifest) == []
    # From the capture: NUMA node 1 of the R710 (4 whole cores, CPU 0's core reserved), 2 ranks
    # of 2 cores, every thread of the 4 cores asked for.
    if fmt == "trainjob":
        assert manifest["spec"]["trainer"]["resourcesPerNode"]["limits"] == {"cpu": "8", "memory": "4Gi"}
    else:
        master = manifest["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        assert master["resources"]["limits"] == {"cpu": "8", "memory": "4Gi"}


def test_the_yaml_alone_is_on_stdout_and_what_it_needs_on_stderr(capsys, inventory):
    code, out, tried = run_in_process(capsys, "plan", "-i", str(inventory), "--format", "pytorchjob", *K8S)
    assert (code, tried) == (0, [])
    assert yaml.safe_load(out.out)["kind"] == "PyTorchJob"
    assert "kind: PersistentVolumeClaim" in out.err and "name: runs" in out.err
    # The v1 operator's init container keeps the Workers from being pinned, and it is said.
    assert "Worker pods are Burstable" in out.err


@pytest.mark.parametrize("extra, variable", [
    (["-e", "launch_mode=mpirun"], "launch_mode"),
    (["-e", "launch_transport=wireguard"], "launch_transport"),
])
def test_kubernetes_refusals_come_from_the_kubernetes_check(capsys, inventory, extra, variable):
    code, out, tried = run_in_process(capsys, "plan", "-q", "--json", "-i", str(inventory), "--format", "trainjob",
                                      *K8S, *extra)
    assert tried == []
    # Bad input (2), named, never an unreachable node (3).
    assert code == 2 and json.loads(out.out)["error"]["variable"] == variable


CANARIES = {"https_proxy": "http://canary-https-7f3a.invalid:3128", "HTTPS_PROXY": "http://canary-HTTPS-91c2.invalid:1",
            "http_proxy": "http://canary-http-5d0e.invalid:3128", "no_proxy": "canary-no-proxy-2b8f.invalid",
            "TORCHFLEET_CANARY": "canary-torchfleet-0c4d"}


def _render(inventory, home, *extra):
    env = dict(os.environ, **CANARIES, HOME=str(home))
    return subprocess.run([TORCHFLEET, "plan", "-i", str(inventory), "--format", "trainjob", *K8S, *extra],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_no_variable_of_the_controllers_environment_reaches_the_output(inventory, tmp_path_factory):
    home = tmp_path_factory.mktemp("canary-home-e61b")
    done = _render(inventory, home)
    assert done.returncode == 0, done.stderr
    for value in [*CANARIES.values(), "canary-home-e61b"]:
        assert value not in done.stdout + done.stderr
    # A variable that asks for the controller's proxy gets it: the check above can fail.
    asked = _render(inventory, home, "-e", '{"launch_proxy_env": {"https_proxy": '
                                               '"{{ lookup(\'ansible.builtin.env\', \'https_proxy\') }}"}}')
    assert asked.returncode == 0, asked.stderr
    assert CANARIES["https_proxy"] in asked.stdout


def test_the_inventorys_k8s_variables_count_and_must_agree(capsys, inventory):
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    group = hosts["all"]["children"]["torchfleet_nodes"]
    group["vars"] = {"k8s_queue_name": "research"}
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    code, out, _ = run_in_process(capsys, "plan", "-q", "--json", "-i", str(inventory), "--format", "trainjob", *K8S)
    assert code == 0, out.out
    assert json.loads(out.out)["manifest"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "research"
    group["hosts"]["node-2"]["k8s_queue_name"] = "other"
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    code, out, _ = run_in_process(capsys, "plan", "-q", "--json", "-i", str(inventory), "--format", "trainjob", *K8S)
    assert code == 2 and json.loads(out.out)["error"]["variable"] == "k8s_queue_name"


def test_another_tools_k8s_variables_are_left_alone_and_a_near_miss_is_said(capsys, inventory):
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    # kubespray's own, and a misspelling of k8s_secret_name.
    hosts["all"]["vars"].update(k8s_image_pull_policy="IfNotPresent", k8s_secret_nam="mnist-secrets")
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    code, out, _ = run_in_process(capsys, "plan", "-q", "--json", "-i", str(inventory), "--format", "trainjob", *K8S)
    assert code == 0, out.out
    assert [w["message"] for w in json.loads(out.out)["warnings"]] == [
        "k8s_secret_nam in the inventory is no torchfleet variable; did you mean k8s_secret_name?"]
    # From -e, a name that is not torchfleet's is refused.
    code, out, _ = run_in_process(capsys, "plan", "-q", "--json", "-i", str(inventory), "--format", "trainjob", *K8S,
                                  "-e", "k8s_secret_nam=x")
    assert code == 2 and json.loads(out.out)["error"]["variable"] == "k8s_secret_nam"
