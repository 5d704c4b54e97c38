"""node_probe's readings, from captured kernel and ip output, and the checks built from them."""

import json
from pathlib import Path

from ansible_collections.torchfleet.cluster.plugins.filter import torchfleet as filters
from ansible_collections.torchfleet.cluster.plugins.modules import node_probe
from torchfleet import preflight
from torchfleet import settings as node_settings
from torchfleet.modes import mpirun

ADDR = (Path(__file__).parents[1] / "fixtures" / "ip-addr-dind-master.json").read_text()

# /proc/net/tcp as the kernel writes it: 29500 listens on all addresses, 29510 only
# connected (ESTABLISHED, 01), 22 listens on 172.29.0.2.
TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:733C 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
   1: 02001DAC:7346 03001DAC:C350 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1
   2: 02001DAC:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1 0 100 0 0 10 0
"""
TCP6 = """  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4 1 0 100 0 0 10 0
"""


def test_listening_ports_are_those_in_listen_state_only():
    assert node_probe.listening_ports([TCP, TCP6]) == {29500, 22, 8080}
    assert 29510 not in node_probe.listening_ports([TCP])


def test_ipv4_addresses_leave_out_the_loopback_as_setup_does():
    found = node_probe.ipv4_addresses(ADDR)
    assert "127.0.0.1" not in found and "172.17.0.1" in found
    expected = [a["local"] for link in json.loads(ADDR) for a in link["addr_info"] if a["family"] == "inet"]
    assert sorted(found) == sorted(a for a in expected if a != "127.0.0.1")


def test_default_ipv4_is_the_source_and_device_of_the_route_out():
    route = json.dumps([{"dst": "8.8.8.8", "gateway": "172.29.0.1", "dev": "eth0", "prefsrc": "172.29.0.2"}])
    assert node_probe.default_ipv4(route) == {"address": "172.29.0.2", "interface": "eth0"}
    assert node_probe.default_ipv4("[]") == {}


def test_sha256_of_a_file_and_of_none(tmp_path):
    (tmp_path / "w.tar").write_bytes(b"abc")
    assert node_probe.sha256(str(tmp_path / "w.tar")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert node_probe.sha256(str(tmp_path / "absent.tar")) is None


def test_node_paths_name_the_variable_that_asks_for_each():
    settings = {"sgx_devices": ["/dev/sgx/enclave", "/dev/sgx/provision:/dev/p"], "extra_devices": ["/dev/fuse"],
                "sgx_aesm_socket": True, "sgx_aesm_socket_path": "/var/run/aesmd"}
    assert node_settings.node_paths(settings) == [
        {"path": "/dev/sgx/enclave", "variable": "launch_sgx_devices"},
        {"path": "/dev/sgx/provision", "variable": "launch_sgx_devices"},
        {"path": "/dev/fuse", "variable": "launch_extra_devices"},
        {"path": "/var/run/aesmd", "variable": "launch_sgx_aesm_socket_path"},
    ]
    assert node_settings.node_paths({"sgx_aesm_socket": False, "sgx_aesm_socket_path": "/x"}) == []


def test_routes_keep_what_a_lookup_needs_with_their_family():
    raw = {"dst": "default", "gateway": "fd00::1", "dev": "eth0", "metric": 1024, "flags": [], "pref": "medium"}
    assert node_probe.route_fields(raw, 6) == {"dst": "default", "dev": "eth0", "metric": 1024, "family": 6}
    multipath = {"dst": "10.0.0.0/8", "nexthops": [{"gateway": "10.0.0.1", "dev": "bond0", "weight": 1}]}
    assert node_probe.route_fields(multipath, 4)["nexthops"] == [{"dev": "bond0"}]
    assert not node_probe.routable({"type": "broadcast", "dst": "10.0.0.255"})
    assert not node_probe.routable({"type": "multicast", "dst": "ff00::/8"})
    assert not node_probe.routable({"dst": "fe80::/64", "dev": "veth1"})
    assert node_probe.routable({"type": "local", "dst": "10.0.0.2"}) and node_probe.routable({"dst": "default"})


def test_a_missing_path_fails_naming_it_and_its_variable():
    check = preflight.missing_path_check({"path": "/dev/sgx/provision", "variable": "launch_sgx_devices"})
    assert check["that"] is False and check["kind"] == "node" and check["variable"] == "launch_sgx_devices"
    assert check["msg"].startswith("/dev/sgx/provision does not exist on the node")


def test_a_taken_port_names_its_variable_unless_skipped():
    table = {"master_port": 29500, "master_addr": "10.0.0.1"}
    master = filters.taken_port_check(29500, table)
    guard = filters.taken_port_check(29510, table)
    assert (master["variable"], guard["variable"]) == ("launch_master_port", "launch_guard_port")
    assert "launch_guard_port 29510 is already in use on 10.0.0.1" in guard["msg"] and guard["that"] is False
    assert filters.taken_port_check(29500, table, skip=True)["that"] is True


def test_plan_lines_show_each_nodes_ranks_interface_and_cpusets():
    table = {"ranks": [{"rank": 0, "host": "a"}, {"rank": 1, "host": "b"}, {"rank": 2, "host": "b"}]}
    nodes = [{"interface": "eth0", "pinning": [], "settings": {"malloc": "default"}},
             {"interface": "eth1", "pinning": [{"cpuset": "0-1"}, {"cpuset": "2-3"}], "settings": {"malloc": "jemalloc"}}]
    assert filters.plan_lines(nodes, ["a", "b"], table) == [
        "a runs ranks 0 on eth0, cpusets unpinned, preloads nothing (glibc malloc)",
        "b runs ranks 1,2 on eth1, cpusets 0-1 2-3, preloads libjemalloc.so.2"]


def _checks(**kw):
    args = {"host": "node-2", "reading": {"missing": [], "listening": []}, "ready": True, "running": [],
            "table": {"master_port": 29500, "master_addr": "10.0.0.1", "master_host": "node-2"}}
    opts = {"bare": True, "runtime": "/opt/venv/bin/python3", "settings": {"extra_devices": ["/dev/fuse"]},
            "job": "train", "planning": False, "replace": False}
    for k, v in kw.items():
        (args if k in args else opts)[k] = v
    return [c for c in preflight.node_checks(args["host"], args["reading"], args["ready"], args["running"],
                                        args["table"], **opts) if not c["that"]]


def test_a_ready_idle_node_passes_every_check():
    assert _checks() == []


def test_each_node_state_failure_is_named_with_its_variable_and_kind():
    failed = _checks(ready=False, reading={"missing": ["/dev/fuse"], "listening": [29510]}, running=["r1", "r2"])
    assert [(c["variable"], c["kind"]) for c in failed] == [
        ("launch_python", "node"), ("launch_extra_devices", "node"), ("launch_job", "running")]
    assert "job train is still running as run r1, r2; stop it (torchfleet stop r1)" in failed[2]["msg"]
    # A running job takes its ports: the refusal says so, not the ports.
    assert _checks(reading={"missing": [], "listening": [29510]})[0]["variable"] == "launch_guard_port"


def test_a_run_id_that_a_node_already_holds_is_refused_naming_the_folder():
    taken = {"missing": [], "listening": [], "run_taken": "/var/lib/torchfleet/runs/r7"}
    failed = _checks(reading=taken)
    assert [(c["variable"], c["kind"]) for c in failed] == [("launch_run_id", "node")]
    assert failed[0]["msg"].startswith("launch_run_id r7 is taken: /var/lib/torchfleet/runs/r7 exists on the node")
    assert _checks(reading=taken, planning=True) == []


def test_only_the_masters_taken_ports_fail():
    # Every node's probe reads both ports; a worker's own listeners are no one's business.
    worker = {"master_port": 29500, "master_addr": "10.0.0.1", "master_host": "node-1"}
    assert _checks(reading={"missing": [], "listening": [29500, 29510]}, table=worker) == []
    taken = _checks(reading={"missing": [], "listening": [29500, 29510]})
    assert [c["variable"] for c in taken] == ["launch_master_port", "launch_guard_port"]


def test_a_container_node_without_the_image_names_launch_image():
    failed = _checks(bare=False, runtime="torchfleet/train:x", ready=False)
    assert failed[0]["variable"] == "launch_image" and "torchfleet/train:x is not on this node" in failed[0]["msg"]


def test_a_plan_fails_only_on_missing_paths_and_a_replace_skips_the_running_job_and_its_ports():
    state = {"ready": False, "reading": {"missing": ["/dev/fuse"], "listening": [29500]}, "running": ["r1"]}
    assert [c["variable"] for c in _checks(planning=True, **state)] == ["launch_extra_devices"]
    assert [c["variable"] for c in _checks(replace=True, **state)] == ["launch_python", "launch_extra_devices"]


def test_every_nodes_checks_come_from_its_own_readings_and_name_it():
    table = {"master_port": 29500, "master_addr": "10.0.0.1", "master_host": "node-1"}
    ok = {"launch__input": {"settings": {"python": "/venv/bin/python"}},
          "launch__node_state": {"python_ok": True, "missing": [], "listening": [], "running_runs": []}}
    bad = {"launch__input": {"settings": {"python": "/other/python", "extra_devices": ["/dev/fuse"]}},
           "launch__node_state": {"python_ok": False, "missing": ["/dev/fuse"], "listening": [], "running_runs": ["r9"]}}
    checks = filters.node_checks([ok, bad], ["node-1", "node-2"], table, True, None, "train")
    failed = [(c["host"], c["variable"]) for c in checks if not c["that"]]
    assert failed == [("node-2", "launch_python"), ("node-2", "launch_extra_devices"), ("node-2", "launch_job")]
    assert "launch_python /other/python does not exist" in next(c["msg"] for c in checks if not c["that"])
    # Container modes: the image as node_probe found it (launch_input's fact), and the job's running containers.
    image = {"launch__input": {"settings": {}}, "launch__node_state": {},
             "launch__job_containers": {"images": [{"Id": "sha256:1"}],
                                        "containers": [{"run": "r7", "running": True}, {"run": "r6", "running": False}]}}
    failed = [c for c in filters.node_checks([image], ["node-3"], table, False, "img:1", "train") if not c["that"]]
    assert [(c["host"], c["variable"], c["kind"]) for c in failed] == [("node-3", "launch_job", "running")]
    assert "as run r7;" in failed[0]["msg"]


MESH = {"ssh_uid": 61000, "ssh_user": "torchfleet", "ssh_client_dir": "/etc/tf/ssh-client", "ssh_node_dir": "/etc/tf/ssh"}
IMAGE_USER = {"entry": ["torchfleet", "x", "61000", "61000", "", "/home/torchfleet", "/bin/bash"], "error": None}


def _mesh(reading=None, image_account=IMAGE_USER, master=False, **settings):
    reading = {"missing": [], "account": None, **(reading or {})}
    return [c for c in mpirun.mesh_checks(reading, image_account, {**MESH, **settings}, master, "img:1") if not c["that"]]


def test_a_node_with_its_mesh_file_a_free_uid_and_an_image_with_the_user_passes():
    assert _mesh() == [] and _mesh(master=True) == []
    # An account with that uid is fine where no one can log in with it.
    assert _mesh({"account": ["torchfleet", "x", "61000", "61000", "", "/home/t", "/usr/sbin/nologin"]}) == []


def test_the_mesh_file_checked_is_the_launchers_on_the_master_and_sshds_elsewhere():
    gone = {"missing": ["/etc/tf/ssh-client/config", "/etc/tf/ssh/sshd_config"]}
    master, worker = _mesh(gone, master=True), _mesh(gone)
    assert master[0]["variable"] == "launch_mode" and "/etc/tf/ssh-client/config is missing" in master[0]["msg"]
    assert "/etc/tf/ssh/sshd_config is missing; run site.yml with launch_mode: mpirun" in worker[0]["msg"]
    assert _mesh({"missing": ["/etc/tf/ssh/sshd_config"]}, master=True) == []


def test_a_login_account_with_the_mesh_uid_is_refused():
    failed = _mesh({"account": ["ubuntu", "x", "1000", "1000", "", "/home/ubuntu", "/bin/bash"]}, ssh_uid=1000)
    assert [c["variable"] for c in failed] == ["launch_ssh_uid"]
    assert "ssh_mesh_uid 1000 belongs to the login account ubuntu (shell /bin/bash)" in failed[0]["msg"]


def test_an_image_without_the_mesh_user_is_refused_with_what_getent_said():
    failed = _mesh(image_account={"entry": None, "error": None}, ssh_uid=61001)
    assert "the image img:1 has no user torchfleet with ssh_mesh_uid 61001 (getent passwd 61001: nothing)" \
        in failed[0]["msg"]
    other = _mesh(image_account={"entry": ["app", "x", "61000", "61000", "", "/app", "/bin/sh"], "error": None})
    assert "(getent passwd 61000: app:x:61000:61000::/app:/bin/sh)" in other[0]["msg"]
    broken = _mesh(image_account={"entry": None, "error": "exec: getent: not found"})
    assert "(getent passwd 61000: exec: getent: not found)" in broken[0]["msg"]
    # A node without the image has no answer: its missing image is the runtime check's.
    assert _mesh(image_account=None) == []


def test_the_mesh_checks_come_with_the_node_checks_under_mpirun_only():
    table = {"master_port": 29500, "master_addr": "10.0.0.1", "master_host": "node-1"}
    node = {"launch__input": {"settings": MESH}, "launch__node_state": {"missing": ["/etc/tf/ssh/sshd_config"]},
            "launch__job_containers": {"images": [{"Id": "sha256:1"}], "containers": [],
                                       "image_account": {"entry": None, "error": None}}}
    failed = [(c["host"], c["variable"]) for c in filters.node_checks([node], ["node-2"], table, False, "img:1", "t",
                                                                      mode="mpirun") if not c["that"]]
    assert failed == [("node-2", "launch_mode"), ("node-2", "launch_ssh_uid")]
    assert [c for c in filters.node_checks([node], ["node-2"], table, False, "img:1", "t") if not c["that"]] == []


def test_the_probe_reads_the_nodes_account_of_a_uid():
    import os
    import pwd

    from ansible_collections.torchfleet.cluster.plugins.modules import node_probe

    mine = node_probe.account(os.getuid())
    assert mine[0] == pwd.getpwuid(os.getuid()).pw_name and mine[2] == str(os.getuid()) and len(mine) == 7
    free = next(u for u in range(64000, 65000) if u not in {p.pw_uid for p in pwd.getpwall()})
    assert node_probe.account(free) is None


def test_the_cpu_pinning_roles_checks_are_the_launchs_rules():
    assert filters.pinning_checks({"cpu_pinning_cores_per_rank": 0}, "n") == []
    bad = filters.pinning_checks({"cpu_pinning_cores_per_rank": -2}, "n")
    assert bad == [{"that": False, "variable": "cpu_pinning_cores_per_rank",
                    "msg": "cpu_pinning_cores_per_rank=-2 must be 0 (split the cores evenly) or more"}]


def test_only_the_files_the_node_lacks_or_holds_otherwise_are_copied():
    src = [{"path": "/c/a.gz", "checksum": "1"}, {"path": "/c/b.gz", "checksum": "2"}, {"path": "/c/c.gz", "checksum": "3"}]
    dest = [{"path": "/n/a.gz", "checksum": "1", "mode": "0644"},   # the same: left alone
            {"path": "/n/b.gz", "checksum": "9", "mode": "0644"},   # another content
            {"path": "/n/c.gz", "checksum": "3", "mode": "0600"}]   # another mode
    names = ["a.gz", "b.gz", "c.gz", "d.gz", "e.gz"]
    src.append({"path": "/c/d.gz", "checksum": "4"})                # d.gz: not on the node yet
    # e.gz: the controller's find did not return it, so copy is left to report it
    assert filters.files_to_copy(names, src, dest, "0644") == ["b.gz", "c.gz", "d.gz", "e.gz"]
    assert filters.files_to_copy(["a.gz"], src, dest, "0644") == []
    assert filters.files_to_copy(["a.gz"], src, [], "0644") == ["a.gz"]


def test_where_an_owner_is_asked_a_file_held_by_another_uid_or_gid_is_copied_again():
    src = [{"path": "/c/k", "checksum": "1"}, {"path": "/c/k.pub", "checksum": "2"}]
    dest = [{"path": "/n/k", "checksum": "1", "mode": "0600", "uid": 61000, "gid": 61000},
            {"path": "/n/k.pub", "checksum": "2", "mode": "0600", "uid": 0, "gid": 61000}]
    assert filters.files_to_copy(["k", "k.pub"], src, dest, "0600", 61000, 61000) == ["k.pub"]
    assert filters.files_to_copy(["k", "k.pub"], src, dest, "0600", "61000", 0) == ["k", "k.pub"]
    assert filters.files_to_copy(["k", "k.pub"], src, dest, "0600") == []


def test_the_probe_reads_the_image_and_the_jobs_containers_and_an_engine_that_fails_is_an_answer(tmp_path):
    """node_probe's containers part against a docker CLI that knows one image and one exited
    container of the job (train:1), or whose daemon is down (down:1): a plan before
    site.yml must get an answer, not a failed task."""
    from types import SimpleNamespace

    docker = tmp_path / "docker"
    inspect = [{"Id": "c1", "Name": "/tfjob-r1-rank0", "Config": {"Labels": {"torchfleet.rank": "0", "torchfleet.run": "r1"},
                                                              "Env": ["RANK=0"]},
                "State": {"Status": "exited", "Running": False, "ExitCode": 0}, "HostConfig": {}}]
    docker.write_text(
        "#!/bin/sh\n"
        'case "$1 $2 $3" in\n'
        '  "image inspect train:1") echo \'[{"Id": "sha256:abc", "RepoTags": ["train:1"]}]\' ;;\n'
        '  "image inspect down:1") echo "Cannot connect to the Docker daemon" >&2; exit 1 ;;\n'
        '  ps*) echo c1 ;;\n'
        f"  inspect*) echo '{json.dumps(inspect)}' ;;\n"
        '  logs*) echo "2026-01-01T00:00:00.5Z done" ;;\n'
        "  *) exit 3 ;;\n"
        "esac\n")
    docker.chmod(0o755)

    def run_command(argv, **_kw):
        import subprocess

        done = subprocess.run(argv, capture_output=True, text=True)
        return done.returncode, done.stdout, done.stderr

    module = SimpleNamespace(run_command=run_command, get_bin_path=lambda name, *a, **k: name)
    found = node_probe.containers(module, {"docker_cli": str(docker), "labels": {"torchfleet.job": "train"},
                                           "image": "train:1"})
    assert found["images"] == [{"Id": "sha256:abc", "RepoTags": ["train:1"]}]
    assert [(c["run"], c["running"], c["exit_code"], c["last_line"]) for c in found["containers"]] == \
        [("r1", False, 0, "done")]
    down = node_probe.containers(module, {"docker_cli": str(docker), "labels": {}, "image": "down:1"})
    assert down["failed"] and "Cannot connect to the Docker daemon" in down["msg"]
