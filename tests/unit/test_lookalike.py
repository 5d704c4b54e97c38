from pathlib import Path

import pytest
import yaml

from torchfleet.lookalike import ALIASES, known_names, lookalikes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def known():
    return known_names(ROOT / "roles")


def meant(names, known):
    return {w["variable"]: w["meant"] for w in lookalikes("node-1", names, known)}


def test_known_names_reads_defaults_and_argument_specs(known):
    assert {"launch_master_port", "cpu_pinning_cpusets", "image_archive_on_node"} <= known
    assert {"torchfleet_node_rank", "torchfleet_image", "cpu_pinning", "gloo_tls"} <= known


def test_every_alias_points_at_a_known_name(known):
    assert set(ALIASES.values()) <= known


def test_guide_names_name_the_torchfleet_variable(known):
    warnings = lookalikes("node-1", ["rank", "cpuset"], known)
    assert [(w["variable"], w["meant"]) for w in warnings] == [
        ("cpuset", "cpu_pinning_cpusets"),
        ("rank", "torchfleet_node_rank"),
    ]
    assert warnings[1] == {
        "host": "node-1",
        "hosts": ["node-1"],
        "variable": "rank",
        "meant": "torchfleet_node_rank",
        "message": "host node-1: rank is not a torchfleet variable and is ignored; "
        "did you mean torchfleet_node_rank?",
    }


def test_misspellings_name_the_closest_variable(known):
    assert meant(["launch_master_prot", "launch_omp_num_thread"], known) == {
        "launch_master_prot": "launch_master_port",
        "launch_omp_num_thread": "launch_omp_num_threads",
    }


def test_prefixed_name_with_nothing_close_says_so(known):
    [warning] = lookalikes("node-1", ["launch_zzzzzz"], known)
    assert warning["meant"] is None
    assert "did you mean" not in warning["message"]


@pytest.mark.parametrize(
    "name",
    [
        "launch_master_port",
        "torchfleet_node_rank",
        "cpu_pinning_cpusets",
        "image_mode",
        "ansible_host",
        "foo",
        "launch__plan",
        "cpu_pinning__topology",
        "_private",
    ],
)
def test_real_foreign_and_internal_names_do_not_warn(known, name):
    assert lookalikes("node-1", [name], known) == []


def test_output_is_sorted_and_deduplicated(known):
    warnings = lookalikes("node-1", ["rank", "master_port", "cpuset", "rank"], known)
    assert [w["variable"] for w in warnings] == ["cpuset", "master_port", "rank"]


def _repo_variables():
    files = [
        *ROOT.glob("inventory/*/group_vars/*.yml"),
        *ROOT.glob("molecule/*/group_vars/*.yml"),
        *ROOT.glob("molecule/shared/host_vars/*.yml"),
    ]
    for path in sorted(files):
        yield path, set(yaml.safe_load(path.read_text()) or {})
    for path in sorted(ROOT.glob("inventory/*/hosts.yml")):
        yield path, set(_hosts_yml_vars(yaml.safe_load(path.read_text()) or {}))


def _hosts_yml_vars(group):
    for group_data in group.values():
        group_data = group_data or {}
        yield from group_data.get("vars") or {}
        for host_vars in (group_data.get("hosts") or {}).values():
            yield from host_vars or {}
        yield from _hosts_yml_vars(group_data.get("children") or {})


@pytest.mark.parametrize(
    "path,names", [pytest.param(p, n, id=str(p.relative_to(ROOT))) for p, n in _repo_variables()]
)
def test_repo_inventories_use_only_real_names(known, path, names):
    assert lookalikes(str(path.relative_to(ROOT)), names, known) == []


def test_a_documented_variable_without_its_prefix_is_named(known):
    # Issue 43: command and sgx_aesm_socket went unflagged though launch_command and
    # launch_sgx_aesm_socket exist; nothing lists them by hand.
    assert meant(["command", "sgx_aesm_socket", "stall_timeout", "master_port"], known) == {
        "command": "launch_command",
        "sgx_aesm_socket": "launch_sgx_aesm_socket",
        "stall_timeout": "launch_stall_timeout",
        "master_port": "launch_master_port",
    }


def test_every_documented_variable_is_found_without_its_prefix(known):
    specs = yaml.safe_load((ROOT / "roles" / "launch" / "meta" / "argument_specs.yml").read_text())
    documented = set(specs["argument_specs"]["main"]["options"])
    for name in documented:
        bare = name[len("launch_"):]
        # A name torchfleet reads as it is (sgx_devices, gloo_tls) is no lookalike.
        if name.startswith("launch_") and bare not in known and ("_" in bare or len(bare) >= 6):
            assert meant([bare], known) == {bare: name}


def test_the_bigdl_guides_names_are_named(known):
    assert meant(["rank", "cpuset", "master_port", "image"], known) == {
        "rank": "torchfleet_node_rank", "cpuset": "cpu_pinning_cpusets", "master_port": "launch_master_port",
        "image": "launch_image"}


def test_a_variable_every_node_has_is_one_warning_naming_them_all(known):
    from torchfleet.lookalike import merged

    [warning] = merged([w for h in ("node-1", "node-2") for w in lookalikes(h, ["command"], known)])
    assert warning["hosts"] == ["node-1", "node-2"] and warning["host"] == "node-1"
    assert warning["message"] == ("hosts node-1, node-2: command is not a torchfleet variable and is ignored; "
                                  "did you mean launch_command?")
