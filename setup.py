"""The wheel holds the torchfleet package and, inside it, the torchfleet.cluster collection with
the files `ansible-galaxy collection build` takes from this tree: `pip install torchfleet` is
then the whole tool. The package's ansible.cfg names that folder (./collections), as the
checkout's link to it names the checkout's own; Ansible elsewhere does not see it, so that an
ansible-galaxy install of the collection stays the user's own. One version for both,
galaxy.yml's."""

import fnmatch
import shutil
from pathlib import Path

import yaml
from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
# What ansible-galaxy leaves out of every build, besides galaxy.yml's build_ignore
# (ansible.galaxy.collection._build_files_manifest).
IGNORED_DIRS = {"CVS", ".bzr", ".hg", ".git", ".svn", "__pycache__", ".tox"}
IGNORED = ["galaxy.yaml", ".git", "*.pyc", "*.retry", "tests/output",
           f"{GALAXY['namespace']}-{GALAXY['name']}-*.tar.gz", *GALAXY.get("build_ignore", [])]


def collection_files(root: Path = ROOT) -> list[str]:
    """The collection's files, relative to ``root``, as ansible-galaxy's build lists them;
    galaxy.yml itself is kept, for the version `ansible-galaxy collection list` shows."""
    found = []

    def walk(folder: Path) -> None:
        for entry in sorted(folder.iterdir()):
            rel = entry.relative_to(root).as_posix()
            if any(fnmatch.fnmatch(rel, pattern) for pattern in IGNORED):
                continue
            if entry.is_dir():
                if entry.name not in IGNORED_DIRS:
                    walk(entry)
            else:
                found.append(rel)

    walk(root)
    return found


class BuildWithCollection(build_py):
    """build_py, then the collection beside the package (not in an editable install, where
    the checkout's own collection serves)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "torchfleet" / "collections" / "ansible_collections" / GALAXY["namespace"] / GALAXY["name"]
        for rel in collection_files():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            # A link (the vocabulary the nodes get) becomes the file it names.
            shutil.copy2(ROOT / rel, target)


# setuptools runs this file as __main__; tests import it for collection_files.
if __name__ == "__main__":
    setup(version=GALAXY["version"], cmdclass={"build_py": BuildWithCollection})
