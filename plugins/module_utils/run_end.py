"""Node-side: a run's end on one node, and what it left there, packed in one archive.

What run_outputs does, in the words of its options: ask the guards to stop the run where
that is asked (``stop_reason``), give the units the run's own wait and end what is left
(``units``), delete ``remove``, then pack the node's files of the run (``wanted``) and the
rest of its ranks' out folder within ``max_bytes`` into one archive, returned inline up to
``inline_max`` bytes.

Two callers share it. The module run_outputs runs it under Ansible's module wrapper, on any
node. And every run's folder carries this file with its modules (run_vocab.SCRIPT_SOURCES),
as it carries the guard, so that collect_run can run it there as a script, with its
options as JSON on stdin: no module wrapper, whose own imports cost a node four times what
the end itself does (0.3 s of CPU against 0.05 s), 48 times over on a 48-node stop.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import rank_docker, rank_files
    from ansible_collections.torchfleet.cluster.plugins.module_utils.out_folder import archive, listing, pick
    from ansible_collections.torchfleet.cluster.plugins.module_utils.run_folder import ask_stop
except ImportError:  # on a node: run as a script from the run's folder, where its modules lie beside it
    import rank_docker
    import rank_files
    from out_folder import archive, listing, pick
    from run_folder import ask_stop

# The options, as run_outputs declares them, with their defaults.
DEFAULTS = {"wanted": [], "own": [], "max_bytes": 0, "pack": True, "inline_max": 4 << 20, "units": None,
            "remove": [], "stop_reason": None}
# How many of the files left behind a result names; the count and bytes cover them all.
LARGEST = 20


def end_units(module, run_dir, units):
    """The units' last states, and whether any had to be stopped here."""
    wait_s, kind = float(units.get("wait_s") or 0), units.get("kind")
    if kind == "process":
        if not os.path.isdir(run_dir):
            return [], False
        return rank_files.end(module, run_dir, wait_s, float(units.get("grace_s") or 0))
    if kind == "container":
        docker, labels = units.get("docker_cli") or "docker", {"torchfleet.run": units["run_id"]}
        containers = rank_docker.find(module, docker, labels)
        if not containers:
            return [], False
        return rank_docker.remove(module, docker, containers, labels, wait_s, log_dir=run_dir), True
    module.fail_json(msg=f"units.kind must be process or container, not {kind!r}")
    return [], False


def end_and_pack(module, p):
    """The whole call, ``p`` being run_outputs' options: its result's fields."""
    asked = p["stop_reason"] is not None and os.path.isdir(p["run_dir"]) and ask_stop(p["run_dir"], p["stop_reason"])
    finals, changed = end_units(module, p["run_dir"], p["units"]) if p["units"] else ([], False)
    changed = changed or asked
    for path in p["remove"]:
        if os.path.lexists(path):
            os.unlink(path)
            changed = True
    result = {"changed": changed, "containers": finals, "archive": None, "archive_b64": None}
    if not os.path.isdir(p["run_dir"]):
        return dict(found=[], total=[0, 0], taken=[0, 0], left=[0, 0], left_largest=[], **result)
    found = [n for n in p["wanted"] if os.path.isfile(os.path.join(p["run_dir"], n))]
    files = listing(p["run_dir"], p["own"])
    taken, left = pick(files, max(p["max_bytes"], 0))
    packed_out = []
    if p["pack"] and (found or taken):
        # Beside the runs, not in the run's folder, where a later collect would count it.
        fd, dest = tempfile.mkstemp(prefix=".collect-", suffix=".tar.gz", dir=os.path.dirname(p["run_dir"]))
        # Readable as the run's files are: a become user's login fetches it.
        os.fchmod(fd, 0o644)
        os.close(fd)
        packed = archive(p["run_dir"], [(n, f"run/{n}") for n in found] + [(f, f"out/{f}") for f, _size in taken],
                         dest)
        found = [n for n in found if f"run/{n}" in packed]
        packed_out = [a[len("out/"):] for a in packed if a.startswith("out/")]
        if os.path.getsize(dest) <= p["inline_max"]:
            with open(dest, "rb") as fh:
                result["archive_b64"] = base64.b64encode(fh.read()).decode()
            os.unlink(dest)
        else:
            result["archive"] = dest
    sizes = dict(taken)
    return dict(found=found, total=[len(files), sum(s for _path, s in files)],
                taken=[len(packed_out), sum(sizes[path] for path in packed_out)],
                left=[len(left), sum(s for _path, s in left)],
                left_largest=[list(f) for f in sorted(left, key=lambda f: (-f[1], f[0]))[:LARGEST]], **result)


class Failed(Exception):
    """The script's fail_json."""


class Node:
    """What the shared code asks of an AnsibleModule, for the script: commands, a failure, a path."""

    @staticmethod
    def run_command(argv):
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        return done.returncode, done.stdout, done.stderr

    @staticmethod
    def fail_json(msg, **_kwargs):
        raise Failed(msg)

    @staticmethod
    def get_bin_path(name):
        return shutil.which(name)


def main():
    """The script: options as JSON on stdin, the result as JSON on stdout, as a module's. A
    run's folder keeps the copy of its launch: one that does not know an option it is given
    answers nothing, and the controller runs the module instead."""
    try:
        given = json.load(sys.stdin)
        if set(given) - set(DEFAULTS) - {"run_dir"}:
            sys.exit(3)
        result = end_and_pack(Node(), dict(DEFAULTS, **given))
    except Failed as exc:
        result = {"failed": True, "msg": str(exc)}
    except Exception as exc:  # pylint: disable=broad-except  # any error is the task's, with its words
        result = {"failed": True, "msg": f"{type(exc).__name__}: {exc}"}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
