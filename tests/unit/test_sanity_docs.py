"""The collection's documentation against the argument specs it describes.

ansible-test's validate-modules compares a module's DOCUMENTATION with the argument spec the
module really builds; these tests show that it fails on a copy whose documented default
differs. An action plugin's documentation lives in a stub under plugins/modules/, which
validate-modules reads but cannot compare (the spec is the action's), so the stubs are
compared with the actions' specs here.
"""

import ast
import importlib
import inspect
import json
import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
COLLECTION = ROOT / "collections" / "ansible_collections" / "torchfleet" / "cluster"
PYTHON = "%d.%d" % sys.version_info[:2]

needs_ansible_test = pytest.mark.skipif(
    shutil.which("ansible-test") is None,
    reason="ansible-test is not on PATH: it comes with ansible-core, in the project's venv (scripts/bootstrap.sh)",
)


def doc_block(path, name="DOCUMENTATION"):
    """A module file's documentation block, parsed as ansible-doc reads it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return yaml.safe_load(node.value.value)
    return None


def validate_modules(collection, target):
    """ansible-test's validate-modules on one file of ``collection``: (exit code, output)."""
    # The sanity venv's pip comes from the stand-in bootstrap (docs/ansible-collection.md).
    subprocess.run([sys.executable, str(ROOT / "scripts" / "ansible_test_pip.py")], check=True,
                   capture_output=True, text=True)
    done = subprocess.run(
        ["ansible-test", "sanity", "--test", "validate-modules", "--python", PYTHON, "--color", "no", target],
        cwd=collection, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture()
def collection_copy(tmp_path):
    """The collection, copied under a folder named as ansible-test requires."""
    dest = tmp_path / "ansible_collections" / "torchfleet" / "cluster"
    shutil.copytree(COLLECTION, dest, ignore=shutil.ignore_patterns("output", "__pycache__"))
    # The checkout's collection is links to the top level, where tests/sanity is the suite's.
    shutil.copytree(ROOT / "tests" / "sanity", dest / "tests" / "sanity")
    return dest


@needs_ansible_test
def test_validate_modules_fails_on_a_documented_default_that_differs_from_the_spec(collection_copy):
    target = "plugins/modules/wireguard_key.py"
    code, out = validate_modules(collection_copy, target)
    assert code == 0, out

    module = collection_copy / target
    text = module.read_text()
    documented = "  rotate:\n    description: Replace an existing key.\n    type: bool\n    default: false\n"
    assert text.count(documented) == 1, "the test's anchor in wireguard_key's DOCUMENTATION moved"
    module.write_text(text.replace(documented, documented.replace("default: false", "default: true")))

    code, out = validate_modules(collection_copy, target)
    assert code != 0
    assert "doc-default-does-not-match-spec" in out
    assert "Argument 'rotate' in argument_spec defines default as (False) but documentation defines default as (True)" in out


def spec_differences(options, spec, where=""):
    """How an option block of a DOCUMENTATION differs from an argument spec, one line each."""
    found = []
    for name in sorted(set(options) | set(spec)):
        doc, arg, at = options.get(name), spec.get(name), f"{where}{name}"
        if doc is None or arg is None:
            found.append(f"{at}: {'not documented' if doc is None else 'documented, not in the spec'}")
            continue
        kind = arg.get("type", "str")
        pairs = {
            "type": (kind, doc.get("type", "str")),
            "required": (bool(arg.get("required")), bool(doc.get("required"))),
            "default": (arg.get("default"), doc.get("default")),
            "choices": (arg.get("choices"), doc.get("choices")),
            "elements": (arg.get("elements"), doc.get("elements")),
        }
        found += [f"{at}: {key} is {s!r} in the spec, {d!r} in the docs" for key, (s, d) in pairs.items() if s != d]
        if arg.get("options") or doc.get("suboptions"):
            found += spec_differences(doc.get("suboptions") or {}, arg.get("options") or {}, f"{at}.")
    return found


def action_specs():
    """Each action plugin's argument spec, where it validates its arguments against one."""
    specs = {}
    for path in sorted((COLLECTION / "plugins" / "action").glob("[!_]*.py")):
        action = importlib.import_module(f"ansible_collections.torchfleet.cluster.plugins.action.{path.stem}")
        spec = getattr(action, "ARGS", None) or getattr(action, "ARGUMENT_SPEC", None)
        if spec is not None:
            specs[path.stem] = spec
    return specs


def test_every_action_plugin_has_a_module_stub_with_its_documentation():
    for path in sorted((COLLECTION / "plugins" / "action").glob("[!_]*.py")):
        stub = COLLECTION / "plugins" / "modules" / path.name
        assert stub.exists(), f"{path.stem}: no plugins/modules/{path.name} to document it"
        for block in ("DOCUMENTATION", "EXAMPLES", "RETURN"):
            assert doc_block(stub, block), f"{path.stem}: no {block} in plugins/modules/{path.name}"
        assert doc_block(path) is None, f"{path.stem}: the action keeps a DOCUMENTATION of its own; it belongs in the stub"


def test_each_action_stub_documents_its_action_argument_spec():
    specs = action_specs()
    assert len(specs) >= 10, sorted(specs)
    differences = {name: spec_differences(doc_block(COLLECTION / "plugins" / "modules" / f"{name}.py")["options"] or {}, spec)
                   for name, spec in specs.items()}
    assert {name: found for name, found in differences.items() if found} == {}


def test_run_state_documents_the_workload_its_action_takes():
    # validate-modules checks run_state's page against the module's spec, whose workload is
    # what the action passes on; the workload a task gives is the action's.
    from ansible_collections.torchfleet.cluster.plugins.plugin_utils.workload_send import WORKLOAD

    options = doc_block(COLLECTION / "plugins" / "modules" / "run_state.py")["options"]
    assert spec_differences(options["workload"]["suboptions"], WORKLOAD) == []
    assert options["role"]["type"] == "path"


def test_spec_differences_names_a_default_a_choice_and_an_undocumented_option():
    spec = {"a": {"type": "int", "default": 1}, "b": {"choices": ["x", "y"]}, "c": {"type": "bool"}}
    docs = {"a": {"type": "int", "default": 2}, "b": {"type": "str", "choices": ["x"]}}
    assert spec_differences(docs, spec) == [
        "a: default is 1 in the spec, 2 in the docs",
        "b: choices is ['x', 'y'] in the spec, ['x'] in the docs",
        "c: not documented",
    ]


# A filter's page is plugins/filter/<name>.yml beside torchfleet.py, which holds them all.
# ansible-test's ansible-doc test skips the filters (tests/sanity/ignore-2.19.txt: its venv
# cannot import torchfleet), so their pages are checked here, against the functions.
FILTERS = COLLECTION / "plugins" / "filter"


def filter_functions():
    """Each filter's name and the function it runs: the ones that _wrap keeps in its closure
    are unwrapped, for _wrap only turns InventoryError into AnsibleFilterError."""
    from ansible_collections.torchfleet.cluster.plugins.filter.torchfleet import FilterModule

    found = {}
    for name, func in FilterModule().filters().items():
        inner = [c.cell_contents for c in func.__closure__ or () if inspect.isfunction(c.cell_contents)]
        found[name] = inner[0] if len(inner) == 1 else func
    return found


def filter_doc_differences(func, doc):
    """How a filter's DOCUMENTATION differs from its function's signature, one line each: the
    first parameter is ``_input`` (the piped value), the others are the options and, in
    order, ``positional``; required where they have no default, the default where they do."""
    params = list(inspect.signature(func).parameters.values())
    wanted = {"_input": params[0].replace(name="_input")} | {p.name: p for p in params[1:]}
    options = doc.get("options") or {}
    positional = doc.get("positional") or []
    if isinstance(positional, str):
        positional = [p.strip() for p in positional.split(",") if p.strip()]
    found = [f"{name}: {'not documented' if name not in options else 'documented, not a parameter'}"
             for name in sorted(set(wanted) ^ set(options))]
    if positional != [p.name for p in params[1:]]:
        found.append(f"positional is {positional} in the docs, {[p.name for p in params[1:]]} in the signature")
    for name in sorted(set(wanted) & set(options)):
        param, option = wanted[name], options[name] or {}
        required = param.default is inspect.Parameter.empty
        if bool(option.get("required")) != required:
            found.append(f"{name}: required is {required} in the signature, {bool(option.get('required'))} in the docs")
        if not required and option.get("default") != param.default:
            found.append(f"{name}: default is {param.default!r} in the signature, {option.get('default')!r} in the docs")
        found += [f"{name}: no {key}" for key in ("description", "type") if not option.get(key)]
    return found


def test_every_filter_has_a_page_whose_options_match_its_signature():
    functions = filter_functions()
    assert len(functions) >= 20, sorted(functions)
    differences = {}
    for name, func in sorted(functions.items()):
        page = FILTERS / f"{name}.yml"
        assert page.exists(), f"filter {name}: no plugins/filter/{name}.yml with its documentation"
        data = yaml.safe_load(page.read_text())
        doc = data["DOCUMENTATION"]
        found = filter_doc_differences(func, doc)
        found += [f"no {key}" for key in ("short_description", "description", "author") if not doc.get(key)]
        if doc.get("name") != name:
            found.append(f"name is {doc.get('name')!r}")
        if f"torchfleet.cluster.{name}" not in data.get("EXAMPLES", ""):
            found.append("EXAMPLES do not use it")
        if not (data.get("RETURN") or {}).get("_value", {}).get("type"):
            found.append("RETURN has no _value with its type")
        differences[name] = found
    assert {name: found for name, found in differences.items() if found} == {}
    pages = {p.stem for p in FILTERS.glob("*.yml")}
    assert pages - set(functions) == set(), "pages of filters that FilterModule does not list"


def test_filter_doc_differences_names_a_changed_default_a_new_parameter_and_the_order():
    def fold(items, key, limit=None, strict=False):  # only its signature is read
        return items, key, limit, strict

    doc = {"positional": "limit, key", "options": {
        "_input": {"description": "d", "type": "list", "required": True},
        "key": {"description": "d", "type": "str", "required": True},
        "limit": {"description": "d", "type": "int", "default": 3}}}
    assert filter_doc_differences(fold, doc) == [
        "strict: not documented",
        "positional is ['limit', 'key'] in the docs, ['key', 'limit', 'strict'] in the signature",
        "limit: default is None in the signature, 3 in the docs",
    ]


@pytest.mark.skipif(shutil.which("ansible-doc") is None, reason="ansible-doc is not on PATH: it comes with "
                    "ansible-core, in the project's venv (scripts/bootstrap.sh)")
def test_ansible_doc_prints_every_filter_page_without_a_warning():
    # From the checkout, whose ansible.cfg puts ./collections on the collections path.
    names = [f"torchfleet.cluster.{name}" for name in sorted(filter_functions())]
    listed = subprocess.run(["ansible-doc", "-t", "filter", "-l", "--json", "torchfleet.cluster"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (listed.returncode, listed.stderr) == (0, ""), listed.stderr
    assert {name: text for name, text in json.loads(listed.stdout).items() if text == "UNDOCUMENTED"} == {}
    assert sorted(json.loads(listed.stdout)) == names
    for fmt in ([], ["--json"]):
        pages = subprocess.run(["ansible-doc", "-t", "filter", *fmt, *names], cwd=ROOT, capture_output=True,
                               text=True, timeout=120)
        assert (pages.returncode, pages.stderr) == (0, ""), pages.stderr
    shown = json.loads(pages.stdout)
    assert sorted(shown) == names
    assert all(shown[name]["doc"]["options"]["_input"]["description"] for name in names)
