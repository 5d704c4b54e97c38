"""The optional kubelet role, checked as configuration: there is no kubelet here.

Its drop-in is held to the kubelet's own KubeletConfiguration Go type (kubernetes/kubelet
v0.36.3, tests/fixtures/kubelet_config_v1beta1_types.go): the kubelet publishes no JSON
schema, and decodes a v1beta1 file leniently, only logging a misspelled field."""

import difflib
import os
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from torchfleet import cpus
from torchfleet.errors import InventoryError
from torchfleet.k8s import kubelet

ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK = ROOT / "tests" / "playbooks" / "kubelet_cpu_manager.yml"
TYPES = ROOT / "tests" / "fixtures" / "kubelet_config_v1beta1_types.go"
ROLE = ROOT / "roles" / "kubelet_cpu_manager"
CONF = "50-torchfleet-cpu-manager.conf"
KUBELET_API = "kubelet.config.k8s.io/v1beta1"


def play(tmp_path, **extra):
    args = [str(Path(sys.executable).parent / "ansible-playbook"), str(PLAYBOOK), "-i", "localhost,",
            "-e", f"kubelet_cpu_manager_config_dir={tmp_path}", "-e", f"ansible_python_interpreter={sys.executable}"]
    for key, value in extra.items():
        args += ["-e", f"{key}={value}"]
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, ANSIBLE_NOCOLOR="1"))


# --- the kubelet's configuration type, read from its Go source ---------------------------------

# A Go type in a json-tagged struct field -> the JSON type its value must have.
_GO_JSON = (
    (re.compile(r"^\*?(bool)$"), "boolean"),
    (re.compile(r"^\*?u?int(8|16|32|64)?$"), "integer"),
    (re.compile(r"^\*?float(32|64)$"), "number"),
    (re.compile(r"^\*?(string|metav1\.Duration)$"), "string"),
    (re.compile(r"^map\["), "object"),
    (re.compile(r"^\[\]"), "array"),
)
_JSON_PY = {"boolean": bool, "integer": int, "number": (int, float), "string": str, "object": dict, "array": list}


@lru_cache(maxsize=None)
def kubelet_fields():
    """KubeletConfiguration's fields, JSON name -> JSON type, from its json tags; a
    struct-typed field is an object."""
    text = TYPES.read_text()
    strings = set(re.findall(r"^type (\w+) string$", text, re.M))
    body = re.search(r"^type KubeletConfiguration struct \{\n(.*?)^\}", text, re.M | re.S)
    fields = {"apiVersion": "string", "kind": "string"}  # metav1.TypeMeta, inline
    for go_type, name in re.findall(r"^\t\w+\s+(\S+)\s+`json:\"(\w+)[,\"]", body[1], re.M):
        bare = go_type.lstrip("*")
        fields[name] = "string" if bare in strings else next((t for rx, t in _GO_JSON if rx.match(go_type)), "object")
    return fields


@lru_cache(maxsize=None)
def kubelet_choices():
    """The values types.go names for the topology manager's fields (its constants)."""
    text = TYPES.read_text()
    return {field: set(re.findall(rf"^\t\w+{suffix}\s*=\s*\"([^\"]+)\"", text, re.M))
            for field, suffix in (("topologyManagerPolicy", "TopologyManagerPolicy"),
                                  ("topologyManagerScope", "TopologyManagerScope"))}


def kubelet_problems(config):
    """(field, why) for each field of ``config`` the kubelet would not take as meant."""
    fields, choices = kubelet_fields(), kubelet_choices()
    problems = []
    if config.get("apiVersion") != KUBELET_API or config.get("kind") != "KubeletConfiguration":
        problems.append(("apiVersion", f"must be {KUBELET_API} with kind KubeletConfiguration"))
    for name, value in config.items():
        if name not in fields:
            close = difflib.get_close_matches(name, fields, 1)
            problems.append((name, "is not a KubeletConfiguration field" + (f" (did you mean {close[0]}?)"
                                                                              if close else "")))
            continue
        expected = _JSON_PY[fields[name]]
        if not isinstance(value, expected) or (fields[name] in ("integer", "number") and isinstance(value, bool)):
            problems.append((name, f"{value!r} is not of type {fields[name]}"))
        elif name in choices and value not in choices[name]:
            problems.append((name, f"{value!r} is not one of {', '.join(sorted(choices[name]))}"))
        elif name == "reservedSystemCPUs":
            try:
                cpus.parse_cpulist(value, variable=name)
            except InventoryError as exc:
                problems.append((name, exc.message))
        elif name == "cpuManagerPolicyOptions" and not all(isinstance(v, str) for v in value.values()):
            problems.append((name, "its values are strings (map[string]string)"))
    return problems


def test_kubelet_fields_come_from_the_kubelets_own_type():
    fields = kubelet_fields()
    assert fields["cpuManagerPolicy"] == "string" and fields["reservedSystemCPUs"] == "string"
    assert fields["maxPods"] == "integer" and fields["failSwapOn"] == "boolean"
    assert fields["kubeReserved"] == "object" and fields["cpuManagerPolicyOptions"] == "object"
    assert kubelet_choices()["topologyManagerPolicy"] == {"none", "best-effort", "restricted", "single-numa-node"}


@pytest.mark.parametrize("field, value", [
    ("cpuManagerPolicyy", "static"),
    ("topologyManagerPolicy", "numa-please"),
    ("reservedSystemCPUs", "0-"),
    ("maxPods", "110"),
    ("cpuManagerPolicyOptions", {"full-pcpus-only": True}),
])
def test_a_bad_kubelet_field_is_found(field, value):
    config = {"apiVersion": KUBELET_API, "kind": "KubeletConfiguration", "cpuManagerPolicy": "static", field: value}
    assert [name for name, _ in kubelet_problems(config)] == [field]


# --- the role -----------------------------------------------------------------------------------


def test_writes_the_static_policy_and_is_idempotent(tmp_path):
    first = play(tmp_path, kubelet_cpu_manager_topology_policy="best-effort", kubelet_cpu_manager_reserved_cpus="0-1")
    assert first.returncode == 0, first.stdout
    conf = yaml.safe_load((tmp_path / CONF).read_text())
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
        ({"kubelet_cpu_manager_reserved_cpus": "0-"}, "a CPU list such as 0-1 (it is \"0-\")"),
        ({"kubelet_cpu_manager_drain_timeout": 0}, "kubelet_cpu_manager_drain_timeout is 1 to 86400 (it is 0)"),
        # No kubelet runs here: the role cannot tell that it reads the drop-in folder.
        ({"kubelet_cpu_manager_restart": "true"}, "the kubelet is not running"),
    ],
)
def test_bad_input_is_refused_before_writing(tmp_path, extra, message):
    result = play(tmp_path, **extra)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
    assert not (tmp_path / CONF).exists()


@pytest.mark.parametrize("extra", [
    {},
    {"kubelet_cpu_manager_policy": "none"},
    {"kubelet_cpu_manager_topology_policy": "restricted", "kubelet_cpu_manager_topology_scope": "container",
     "kubelet_cpu_manager_reserved_cpus": "0-1,8"},
    {"kubelet_cpu_manager_full_pcpus_only": "true"},
], ids=["defaults", "no-static-policy", "restricted", "full-pcpus-only"])
def test_the_written_settings_pass_the_kubelets_own_configuration_type(tmp_path, extra):
    result = play(tmp_path, **extra)
    assert result.returncode == 0, result.stdout
    conf = yaml.safe_load((tmp_path / CONF).read_text())
    assert kubelet_problems(conf) == []
    assert conf["cpuManagerPolicy"] == extra.get("kubelet_cpu_manager_policy", "static")
    assert conf.get("cpuManagerPolicyOptions") == ({"full-pcpus-only": "true"} if extra.get(
        "kubelet_cpu_manager_full_pcpus_only") else None)
    # A misspelled field would only be logged by the kubelet, and do nothing.
    conf["topologyManagerPolicyy"] = conf.pop("topologyManagerPolicy")
    assert kubelet_problems(conf) == [("topologyManagerPolicyy", "is not a KubeletConfiguration field "
                                                                 "(did you mean topologyManagerPolicy?)")]


def test_a_change_is_applied_in_upstreams_order():
    """Kubernetes' "Changing the CPU Manager Policy" (cpu-management-policies.md): drain the
    node, stop the kubelet, remove the old state file, change the settings, start the kubelet."""
    handlers = yaml.safe_load((ROLE / "handlers" / "main.yml").read_text())
    steps = [(next(k for k in h if "." in k), h[next(k for k in h if "." in k)]) for h in handlers]
    assert [(module, args.get("state")) for module, args in steps] == [
        ("kubernetes.core.k8s_drain", "drain"), ("ansible.builtin.systemd_service", "stopped"),
        ("ansible.builtin.file", "absent"), ("ansible.builtin.template", None),
        ("ansible.builtin.systemd_service", "started"), ("kubernetes.core.k8s_drain", "uncordon")]
    assert steps[2][1]["path"] == "{{ kubelet_cpu_manager_state_file }}"
    assert {h["listen"] for h in handlers} == {"Apply the kubelet CPU manager settings"}
    tasks = yaml.safe_load((ROLE / "tasks" / "main.yml").read_text())
    # Only the check notifies, and it writes nothing: the settings change once the kubelet is stopped.
    notifying = [t for t in tasks if t.get("notify")]
    assert len(notifying) == 1 and notifying[0]["check_mode"] is True


# --- the kubelet's own command line -------------------------------------------------------------

# As kubeadm's systemd drop-in starts it (10-kubeadm.conf with kubeadm-flags.env), and with
# the drop-in folder added through KUBELET_EXTRA_ARGS.
KUBEADM = ("/usr/bin/kubelet --bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf "
           "--kubeconfig=/etc/kubernetes/kubelet.conf --config=/var/lib/kubelet/config.yaml "
           "--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock "
           "--pod-infra-container-image=registry.k8s.io/pause:3.10")


@pytest.mark.parametrize("cmdline, folder", [
    (KUBEADM, None),
    (KUBEADM + " --config-dir=/etc/kubernetes/kubelet.conf.d/", "/etc/kubernetes/kubelet.conf.d"),
    (KUBEADM + " --config-dir /etc/kubernetes/kubelet.conf.d", "/etc/kubernetes/kubelet.conf.d"),
    (KUBEADM + " --config-dir=/a --config-dir=/b", "/b"),
])
def test_the_drop_in_folder_is_read_from_the_kubelets_command_line(cmdline, folder):
    assert kubelet.config_dir(cmdline) == folder
    # As /proc/PID/cmdline holds it: NUL-separated.
    assert kubelet.config_dir("\0".join(cmdline.split()).encode() + b"\0") == folder
