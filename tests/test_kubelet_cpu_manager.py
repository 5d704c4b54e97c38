"""The optional kubelet role, checked as configuration: there is no kubelet here."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from torchfleet.k8s import schema

ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK = ROOT / "tests" / "playbooks" / "kubelet_cpu_manager.yml"


def play(tmp_path, **extra):
    args = [str(Path(sys.executable).parent / "ansible-playbook"), str(PLAYBOOK), "-i", "localhost,",
            "-e", f"kubelet_cpu_manager_config_dir={tmp_path}", "-e", f"ansible_python_interpreter={sys.executable}"]
    for key, value in extra.items():
        args += ["-e", f"{key}={value}"]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))


def test_writes_the_static_policy_and_is_idempotent(tmp_path):
    first = play(tmp_path, kubelet_cpu_manager_topology_policy="best-effort", kubelet_cpu_manager_reserved_cpus="0-1")
    assert first.returncode == 0, first.stdout
    conf = yaml.safe_load((tmp_path / "50-torchfleet-cpu-manager.conf").read_text())
    assert conf == {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cpuManagerPolicy": "static",
        "topologyManagerPolicy": "best-effort",
        "topologyManagerScope": "pod",
        "reservedSystemCPUs": "0-1",
    }
    second = play(tmp_path, kubelet_cpu_manager_topology_policy="best-effort", kubelet_cpu_manager_reserved_cpus="0-1")
    assert "changed=0" in second.stdout


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"kubelet_cpu_manager_topology_policy": "numa-please"}, "kubelet_cpu_manager_topology_policy"),
        ({"kubelet_cpu_manager_reserved_cpus": "''"}, "kubelet_cpu_manager_policy=static needs kubelet_cpu_manager_reserved_cpus"),
    ],
)
def test_bad_input_is_refused_before_writing(tmp_path, extra, message):
    result = play(tmp_path, **extra)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert not (tmp_path / "50-torchfleet-cpu-manager.conf").exists()


@pytest.mark.parametrize("extra", [
    {},
    {"kubelet_cpu_manager_policy": "none"},
    {"kubelet_cpu_manager_topology_policy": "restricted", "kubelet_cpu_manager_topology_scope": "container",
     "kubelet_cpu_manager_reserved_cpus": "0-1,8"},
], ids=["defaults", "no-static-policy", "restricted"])
def test_the_written_settings_pass_the_kubelets_own_configuration_type(tmp_path, extra):
    """Checked against KubeletConfiguration's Go type as the kubelet v0.36.3 ships it
    (torchfleet/k8s/schemas); with no kubelet here, that type is the kubelet's word."""
    result = play(tmp_path, **extra)
    assert result.returncode == 0, result.stdout
    path = tmp_path / "50-torchfleet-cpu-manager.conf"
    conf = yaml.safe_load(path.read_text())
    schema.check_kubelet(conf, str(path))
    assert conf["cpuManagerPolicy"] == extra.get("kubelet_cpu_manager_policy", "static")
    # The kubelet decodes v1beta1 leniently: a misspelled field is only logged, and has no effect.
    conf["topologyManagerPolicyy"] = conf.pop("topologyManagerPolicy")
    with pytest.raises(schema.SchemaError) as err:
        schema.check_kubelet(conf, str(path))
    assert err.value.fields == ["topologyManagerPolicyy"]
    assert "did you mean topologyManagerPolicy?" in err.value.message
