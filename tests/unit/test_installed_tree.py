"""What an installed torchfleet needs is inside what it installs: no module of the package or
the collection reaches a file by a path that climbs out of its own installed tree (the
package's folder, or the collection's root), and the wheel and the collection agree on what
they ship and on their version."""

import ast
from pathlib import Path

import pytest
from harness import ROOT

# Each installed tree, and the Python modules it holds.
TREES = {"the package": ROOT / "torchfleet", "the collection": ROOT / "plugins"}


def _climb(node: ast.AST) -> int | None:
    """How many folders above a module's own folder ``node`` reaches, where it is a path made
    from ``__file__`` (Path(__file__).parent, .parents[N], os.path.dirname, "..") or from
    importlib.resources' files(); None where it is no such path."""
    if isinstance(node, ast.Name) and node.id == "__file__":
        return -1  # the file itself: its folder is one .parent up
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name)):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        if name == "files" and node.args:
            return 0
        inner = [c for c in (_climb(a) for a in node.args) if c is not None]
        if isinstance(node.func, ast.Attribute):
            base = _climb(node.func.value)
            if base is not None:
                inner.append(base)
        if not inner:
            return None
        level = max(inner)
        if name == "dirname":
            return level + 1
        if name in ("join", "joinpath", "Path", "resolve", "absolute", "realpath", "abspath", "normpath"):
            ups = sum(1 for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                      for part in a.value.split("/") if part == "..")
            return level + ups
        return level
    if isinstance(node, ast.Attribute):
        base = _climb(node.value)
        if base is None:
            return None
        return base + 1 if node.attr == "parent" else base
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "parents":
        base = _climb(node.value.value)
        index = node.slice.value if isinstance(node.slice, ast.Constant) else 99
        return None if base is None else base + 1 + index
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        base = _climb(node.left)
        if base is None:
            return None
        ups = sum(1 for part in (node.right.value.split("/") if isinstance(node.right, ast.Constant)
                                 and isinstance(node.right.value, str) else []) if part == "..")
        return base + ups
    return None


def climbs_out(path: Path, tree: Path) -> list[str]:
    """Each line of ``path`` with a path expression that reaches above ``tree``, and its
    largest such expression."""
    depth = len(path.relative_to(tree).parts) - 1  # folders between the tree's root and the file's
    found: dict[int, str] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        level = _climb(node)
        if level is not None and level > depth and len(ast.unparse(node)) > len(found.get(node.lineno, "")):
            found[node.lineno] = ast.unparse(node)
    return [f"{path.relative_to(tree.parent)}:{line}: {code}" for line, code in sorted(found.items())]


@pytest.mark.parametrize("name", TREES)
def test_no_module_reaches_above_its_installed_tree(name):
    tree = TREES[name]
    assert [line for path in sorted(tree.rglob("*.py")) for line in climbs_out(path, tree)] == []


@pytest.mark.parametrize("code, depth, out", [
    ("Path(__file__).parent / 'schemas'", 1, False),
    ("Path(__file__).resolve().parents[1] / 'collections'", 0, True),
    ("Path(__file__).resolve().parents[1] / 'schemas'", 1, False),
    ("Path(__file__).parent.parent.parent", 1, True),
    ("os.path.join(os.path.dirname(__file__), '..', '..', 'x')", 1, True),
    ("os.path.dirname(os.path.dirname(__file__))", 1, False),
    ("resources.files('torchfleet') / 'ansible.cfg'", 0, False),
    ("resources.files('torchfleet') / '../../etc'", 0, True),
])
def test_the_check_sees_a_climb(code, depth, out, tmp_path):
    tree = tmp_path / "pkg"
    module = tree.joinpath(*(["sub"] * depth), "m.py")
    module.parent.mkdir(parents=True)
    module.write_text(f"x = {code}\n")
    assert bool(climbs_out(module, tree)) is out


def test_one_version_for_the_wheel_the_collection_and_the_changelog():
    import yaml

    version = yaml.safe_load((ROOT / "galaxy.yml").read_text())["version"]
    pins = [line for line in (ROOT / "meta" / "ee-requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")]
    assert pins == [f"torchfleet=={version}"]
    assert version in yaml.safe_load((ROOT / "changelogs" / "changelog.yaml").read_text())["releases"]
    assert f"v{version}\n" in (ROOT / "CHANGELOG.rst").read_text()


def test_the_wheel_carries_the_files_the_collection_build_takes(tmp_path):
    """setup.py lists the collection's files by galaxy.yml's build_ignore, as ansible-galaxy
    does: the two lists are one."""
    import importlib.util
    import shutil
    import subprocess
    import sys
    import tarfile

    spec = importlib.util.spec_from_file_location("torchfleet_setup", ROOT / "setup.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    galaxy = shutil.which("ansible-galaxy") or str(Path(sys.executable).parent / "ansible-galaxy")
    done = subprocess.run([galaxy, "collection", "build", str(ROOT), "--output-path", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    (tarball,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(tarball) as tar:
        built = {m.name for m in tar.getmembers() if not m.isdir()} - {"MANIFEST.json", "FILES.json"}
    assert set(module.collection_files(ROOT)) - {"galaxy.yml"} == built


def test_the_changelog_and_its_fragments_are_what_antsibull_changelog_reads():
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    tool = shutil.which("antsibull-changelog") or str(Path(sys.executable).parent / "antsibull-changelog")
    done = subprocess.run([tool, "lint"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr
