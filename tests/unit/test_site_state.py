"""site.yml's skip (issue 60): each role's digest, the node's record, and which roles run."""

import json
import multiprocessing
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

from ansible_collections.torchfleet.cluster.plugins.module_utils import role_checks
from ansible_collections.torchfleet.cluster.plugins.modules import site_record
from torchfleet import site_state

ROOT = Path(__file__).resolve().parents[2]
KEY = bytes(32)
DATASET = {"dataset_dir": "/var/lib/torchfleet/datasets/fashion-mnist", "dataset_source": "copy",
           "dataset_src": "", "dataset_files": ["train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]}
IMAGE = {"image_name": "torchfleet/train:2.13.0-cpu", "image_mode": "load", "image_archive": "",
         "image_load_timeout": 600, "image_registry_password": ""}


def role_input(role, values, content="c", code=(), key=KEY):
    return site_state.role_input(role, values, key=key, content=content, code=list(code), version="0.1.0")


# --- the digest ---------------------------------------------------------------------------------


def test_a_changed_variable_changes_the_digest_of_its_role():
    base = role_input("image", IMAGE)
    assert role_input("image", dict(IMAGE))["digest"] == base["digest"]
    assert role_input("image", dict(IMAGE, image_load_timeout=601))["digest"] != base["digest"]
    assert role_input("image", dict(IMAGE, image_name="torchfleet/train:other"))["digest"] != base["digest"]


def test_a_changed_role_file_or_dependency_changes_the_content_hash(tmp_path):
    for role in ("dataset", "torchfleet_defaults"):
        shutil.copytree(ROOT / "roles" / role, tmp_path / role)
    folders = site_state.role_folders(tmp_path, "dataset")
    assert [f.name for f in folders] == ["dataset", "torchfleet_defaults"]
    before = site_state.content_hash(folders)
    assert site_state.content_hash(folders) == before
    tasks = tmp_path / "dataset" / "tasks" / "main.yml"
    tasks.write_text(tasks.read_text() + "\n# one more line\n")
    edited = site_state.content_hash(folders)
    assert edited != before
    defaults = tmp_path / "torchfleet_defaults" / "defaults" / "main.yml"
    defaults.write_text(defaults.read_text().replace("runs", "runs2", 1))
    assert site_state.content_hash(folders) != edited
    assert role_input("dataset", DATASET, content=before)["digest"] != role_input("dataset", DATASET, content=edited)["digest"]


def test_a_changed_dataset_on_the_controller_changes_the_digest(tmp_path):
    src = tmp_path / "fashion-mnist"
    src.mkdir()
    for name in DATASET["dataset_files"]:
        (src / name).write_bytes(b"\x1f\x8b" + name.encode())
    values = dict(DATASET, dataset_src=str(src))
    before = role_input("dataset", values)["digest"]
    assert role_input("dataset", values)["digest"] == before
    with open(src / "t10k-labels-idx1-ubyte.gz", "ab") as fh:
        fh.write(b"more")
    grown = role_input("dataset", values)["digest"]
    assert grown != before
    (src / "extra.gz").write_bytes(b"x")
    assert role_input("dataset", values)["digest"] != grown


def test_the_image_archive_counts_by_size_and_time_without_being_read(tmp_path):
    archive = tmp_path / "train.tar"
    archive.write_bytes(b"a" * 10)
    values = dict(IMAGE, image_archive=str(archive))
    before = role_input("image", values)["digest"]
    os.utime(archive, ns=(1, 2))
    assert role_input("image", values)["digest"] != before
    assert site_state.path_state(archive) == [["", 10, 2]]
    assert site_state.path_state(tmp_path / "absent") is None and site_state.path_state("") is None


def test_changed_code_changes_every_digest(tmp_path):
    (tmp_path / "m.py").write_text("x = 1\n")
    code = site_state.code_state([tmp_path])
    (tmp_path / "m.py").write_text("x = 22\n")
    assert role_input("dataset", DATASET, code=code)["digest"] != \
        role_input("dataset", DATASET, code=site_state.code_state([tmp_path]))["digest"]


def test_the_same_code_installed_elsewhere_gives_the_same_digests(tmp_path):
    # A checkout, and the wheel's copy of it: other times, compiled files, and the collection
    # the wheel bundles inside the package (its plugins count as the plugins).
    checkout, installed = tmp_path / "a" / "torchfleet", tmp_path / "b" / "torchfleet"
    for folder in (checkout, installed):
        (folder / "sub").mkdir(parents=True)
        (folder / "m.py").write_text("x = 1\n")
        (folder / "sub" / "n.py").write_text("y = 2\n")
    os.utime(installed / "m.py", ns=(1, 2))
    (installed / "__pycache__").mkdir()
    (installed / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"compiled")
    (installed / "collections" / "plugins").mkdir(parents=True)
    (installed / "collections" / "plugins" / "p.py").write_text("z = 3\n")
    assert site_state.code_state([checkout]) == site_state.code_state([installed])
    (installed / "sub" / "collections").mkdir()  # only the top level's is the bundle
    (installed / "sub" / "collections" / "c.py").write_text("")
    assert site_state.code_state([checkout]) != site_state.code_state([installed])


def _key_in(state_dir, queue):
    queue.put(site_state.digest_key(state_dir).hex())


def test_the_key_is_made_once_private_even_when_every_worker_asks_at_once(tmp_path):
    queue = multiprocessing.get_context("fork").Queue()
    workers = [multiprocessing.get_context("fork").Process(target=_key_in, args=(tmp_path, queue)) for _ in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    keys = {queue.get(timeout=5) for _ in workers}
    assert len(keys) == 1 and len(bytes.fromhex(keys.pop())) == 32
    path = tmp_path / site_state.KEY_NAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [site_state.KEY_NAME]


def test_the_digest_depends_on_the_key_so_a_record_tells_nothing_of_a_password():
    secret = dict(IMAGE, image_registry_password="hunter2")
    one, other = role_input("image", secret, key=b"1" * 32), role_input("image", secret, key=b"2" * 32)
    assert one["digest"] != other["digest"]
    assert role_input("image", dict(secret, image_registry_password="hunter3"), key=b"1" * 32)["digest"] != one["digest"]


def test_the_checks_are_what_shows_each_role_in_place():
    assert role_input("container_runtime", {"container_runtime_manage_config": True})["checks"] == {
        "engine": True, "images": [], "paths": ["/etc/docker/daemon.json"]}
    assert role_input("container_runtime", {"container_runtime_manage_config": False})["checks"]["paths"] == []
    assert role_input("image", IMAGE)["checks"] == {"engine": True, "images": ["torchfleet/train:2.13.0-cpu"], "paths": []}
    assert role_input("dataset", DATASET)["checks"]["paths"] == [
        "/var/lib/torchfleet/datasets/fashion-mnist/train-images-idx3-ubyte.gz",
        "/var/lib/torchfleet/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"]
    venv = role_input("python_env", {"python_env_manager": "venv", "python_env_prefix": "/opt/v"})["checks"]
    assert venv["paths"] == ["/opt/v/bin/python", "/opt/v/pyvenv.cfg", "/opt/v/lib/python3*/site-packages"]
    for role in site_state.ALWAYS:
        assert role_input(role, {}) is None


# --- the decision -------------------------------------------------------------------------------

WANTED = {"container_runtime": True, "image": True, "dataset": True, "overlay": False, "python_env": False}
INPUTS = {"container_runtime": {"digest": "d-engine", "checks": {}}, "image": {"digest": "d-image", "checks": {}},
          "dataset": {"digest": "d-data", "checks": {}}, "overlay": None, "python_env": None}
IMAGE_ID = "sha256:" + "ab" * 32
FILE = "/var/lib/torchfleet/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"


def probe(**observed):
    recorded = {"format": site_state.FORMAT, "roles": {
        "container_runtime": {"digest": "d-engine", "engine": True, "images": {}, "paths": {"/etc/docker/daemon.json": [34, 5]}},
        "image": {"digest": "d-image", "engine": True, "images": {"torchfleet/train:2.13.0-cpu": IMAGE_ID}, "paths": {}},
        "dataset": {"digest": "d-data", "engine": False, "images": {}, "paths": {FILE: [213, 7]}}}}
    now = {"engine": True, "images": {"torchfleet/train:2.13.0-cpu": IMAGE_ID},
           "paths": {"/etc/docker/daemon.json": [34, 5], FILE: [213, 7]}}
    now.update(observed)
    return {"recorded": recorded, "observed": now}


def test_a_node_whose_record_holds_runs_nothing():
    assert site_state.plan(WANTED, INPUTS, probe()) == {"run": [], "why": {}, "record": {}}


def test_a_node_without_a_record_runs_every_role_and_records_the_skippable_ones():
    for given in (None, {"recorded": None, "observed": {}}, dict(probe(), recorded={"format": 0, "roles": {}})):
        planned = site_state.plan(WANTED, INPUTS, given)
        assert planned["run"] == ["container_runtime", "image", "dataset"]
        assert set(planned["why"].values()) == {"the node has no record of it"}
        assert list(planned["record"]) == ["container_runtime", "image", "dataset"]


def test_a_removed_image_runs_the_image_role_alone():
    planned = site_state.plan(WANTED, INPUTS, probe(images={"torchfleet/train:2.13.0-cpu": None}))
    assert planned["run"] == ["image"]
    assert planned["why"]["image"] == f"the image torchfleet/train:2.13.0-cpu is absent, where it was {IMAGE_ID}"
    other = site_state.plan(WANTED, INPUTS, probe(images={"torchfleet/train:2.13.0-cpu": "sha256:" + "cd" * 32}))
    assert other["run"] == ["image"]


def test_a_stopped_engine_runs_the_engine_and_the_image():
    planned = site_state.plan(WANTED, INPUTS, probe(engine=False, images={"torchfleet/train:2.13.0-cpu": None}))
    assert planned["run"] == ["container_runtime", "image"]
    assert planned["why"]["container_runtime"] == "the container engine does not answer"


def test_a_changed_or_removed_dataset_file_on_the_node_runs_the_dataset():
    changed = site_state.plan(WANTED, INPUTS, probe(paths={"/etc/docker/daemon.json": [34, 5], FILE: [214, 8]}))
    assert changed["run"] == ["dataset"] and changed["why"]["dataset"] == f"{FILE} changed (size, modification time)"
    gone = site_state.plan(WANTED, INPUTS, probe(paths={"/etc/docker/daemon.json": [34, 5], FILE: None}))
    assert gone["why"]["dataset"] == f"{FILE} is gone"


def test_a_changed_input_runs_its_role_alone():
    planned = site_state.plan(WANTED, dict(INPUTS, dataset={"digest": "d-data-2", "checks": {}}), probe())
    assert planned["run"] == ["dataset"] and planned["why"]["dataset"] == "its input changed since it last ran here"
    assert planned["record"] == {"dataset": {"digest": "d-data-2", "checks": {}}}


def test_force_runs_every_role_and_a_role_that_spans_nodes_always_runs():
    forced = site_state.plan(WANTED, INPUTS, probe(), force=True)
    assert forced["run"] == ["container_runtime", "image", "dataset"] and set(forced["why"].values()) == {"site_force is set"}
    with_overlay = site_state.plan(dict(WANTED, overlay=True), INPUTS, probe())
    assert with_overlay["run"] == ["overlay"] and with_overlay["why"]["overlay"].startswith("it always runs")
    assert with_overlay["record"] == {}


def test_a_role_left_out_by_the_tags_keeps_its_old_record():
    no_record = {"recorded": None, "observed": {}}
    assert list(site_state.plan(WANTED, INPUTS, no_record, run_tags=["image"])["record"]) == ["image"]
    assert list(site_state.plan(WANTED, INPUTS, no_record, skip_tags=["image"])["record"]) == ["container_runtime", "dataset"]
    assert site_state.plan(WANTED, dict(INPUTS, image=None), no_record)["why"]["image"] == "its input could not be read"


# --- the node's side ------------------------------------------------------------------------------


def test_the_record_module_speaks_the_packages_format():
    assert site_record.FORMAT == site_state.FORMAT


def test_a_record_keeps_what_the_checks_read_and_is_read_back(tmp_path):
    (tmp_path / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (tmp_path / "a.gz").write_bytes(b"abc")
    entry = role_checks.entry(None, "d", {"engine": False, "images": [],
                                          "paths": [str(tmp_path / "a.gz"), str(tmp_path / "lib" / "python3*" / "site-packages"),
                                                    str(tmp_path / "absent")]})
    assert entry["digest"] == "d" and entry["engine"] is False
    assert list(entry["paths"]) == [str(tmp_path / "a.gz"), str(tmp_path / "lib" / "python3.11" / "site-packages"),
                                    str(tmp_path / "absent")]
    assert entry["paths"][str(tmp_path / "a.gz")][0] == 3 and entry["paths"][str(tmp_path / "absent")] is None
    path = tmp_path / "torchfleet" / "site.json"
    role_checks.write(str(path), {"format": 1, "roles": {"dataset": entry}})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    record = role_checks.read(str(path))
    assert role_checks.recorded_checks(record) == (False, [], sorted(entry["paths"]))
    path.write_text("{not json")
    assert role_checks.read(str(path)) is None and role_checks.read(str(tmp_path / "none.json")) is None


# --- the lookup, the modules and the filter, through ansible-playbook on this machine -----------

BOOK = """
- hosts: all
  gather_facts: false
  vars:
    wanted: {dataset: true, image: true, overlay: false}
  tasks:
    - name: Read the record
      torchfleet.cluster.node_probe: {network: false, site_record: "{{ record }}"}
      register: probe
    - name: Decide
      ansible.builtin.set_fact:
        planned: >-
          {{ wanted | torchfleet.cluster.site_plan(lookup('torchfleet.cluster.role_inputs', 'dataset', 'image',
             roles_dir=roles_dir), probe.site_record) }}
    - name: Record
      torchfleet.cluster.site_record: {path: "{{ record }}", roles: "{{ planned.record }}"}
      when: planned.record | length > 0
    - name: Keep the plan
      ansible.builtin.copy: {content: "{{ planned | to_json }}", dest: "{{ record }}.plan"}
"""


def run_book(tmp_path, hosts):
    """Each host's plan: the roles it runs, and the digests it records."""
    inventory = {"all": {"vars": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                                  "roles_dir": str(ROOT / "roles"), "image_mode": "pull"},
                         "hosts": hosts}}
    (tmp_path / "hosts.yml").write_text(json.dumps(inventory))
    (tmp_path / "book.yml").write_text(BOOK)
    done = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), str(tmp_path / "book.yml"),
                           "-i", str(tmp_path / "hosts.yml")], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=dict(os.environ, TORCHFLEET_STATE_DIR=str(tmp_path / "state")))
    assert done.returncode == 0, done.stdout[-3000:]
    plans = {host: json.loads(Path(v["record"] + ".plan").read_text()) for host, v in hosts.items()}
    return {host: (plan["run"], {role: given["digest"] for role, given in plan["record"].items()})
            for host, plan in plans.items()}


def test_the_lookup_sees_the_hosts_values_and_the_record_round_trip(tmp_path):
    """Three hosts on this machine, each with a record file of its own: the host's variables
    (one of the role's own, and one its default is templated from) reach the digest as the
    role sees them, and what the record lists makes its role run again once it changes."""
    hosts = {name: {"record": str(tmp_path / f"{name}.json"), "dataset_dir": str(tmp_path / "data-a"),
                    "dataset_src": str(tmp_path / "src"), "torchfleet_image": "torchfleet-absent/plain:1"}
             for name in ("plain", "timeout", "named")}
    hosts["timeout"]["image_load_timeout"] = 601
    hosts["named"].update(torchfleet_image="torchfleet-absent/named:1", dataset_dir=str(tmp_path / "data-b"))
    (tmp_path / "src").mkdir()
    for data in ("data-a", "data-b"):
        (tmp_path / data).mkdir()
        for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
                     "t10k-labels-idx1-ubyte.gz"):
            (tmp_path / data / name).write_bytes(b"x")

    first = run_book(tmp_path, hosts)
    assert all(run == ["dataset", "image"] for run, _ in first.values())
    digests = {host: d for host, (_, d) in first.items()}
    assert digests["plain"]["dataset"] == digests["timeout"]["dataset"] != digests["named"]["dataset"]
    assert len({d["image"] for d in digests.values()}) == 3

    record = json.loads((tmp_path / "plain.json").read_text())
    assert record["roles"]["dataset"]["digest"] == digests["plain"]["dataset"]
    assert record["roles"]["image"]["images"] == {"torchfleet-absent/plain:1": None}
    assert sorted(record["roles"]["dataset"]["paths"]) == sorted(str(p) for p in (tmp_path / "data-a").iterdir())

    # The image is on no engine here, so it was never in place: it runs again everywhere. The
    # dataset runs again only where one of its files changed.
    with open(tmp_path / "data-b" / "t10k-labels-idx1-ubyte.gz", "ab") as fh:
        fh.write(b"y")
    second = run_book(tmp_path, hosts)
    assert {host: run for host, (run, _) in second.items()} == {
        "plain": ["image"], "timeout": ["image"], "named": ["dataset", "image"]}
