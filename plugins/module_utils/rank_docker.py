"""Node-side: a run's rank containers through the docker CLI (their labels say which), and
what a launch asks of the training image.

Shared by rank_containers, which reports on them and removes them, node_probe, which reads
them and the image in a launch's check, run_outputs, which removes a run's containers
before it packs what they left, and run_state, which removes a job's exited leftovers.
"""

from __future__ import annotations

import json
import os
import re
import time

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import loader_libraries
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
except ImportError:  # on a node: a script's in the run's folder (run_vocab.SCRIPT_SOURCES), its modules beside it
    import loader_libraries
    import run_vocab as vocab

# The part of each rank's environment worth keeping in the run report.
REPORTED_ENV = re.compile(r"^(MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|LOCAL_RANK|LOCAL_WORLD_SIZE|NODE_RANK|"
                          r"OMP_NUM_THREADS|LD_PRELOAD|MALLOC_CONF|GLOO_\w+|SGX_\w+|TORCHFLEET_\w+|http_proxy|https_proxy|no_proxy)=")
FRACTION = re.compile(r"^(\S+?T\d\d:\d\d:\d\d)(?:\.(\d+))?Z (.*)$")


def reported_env(env, labels):
    """The part of a container's env worth a report; a secret variable (the launch names
    them in a label, with what may be shown: a redacted URL, or a placeholder) shows that."""
    shown = json.loads(labels.get("torchfleet.secret_env") or "{}")
    pairs = (e.split("=", 1) for e in env if REPORTED_ENV.match(e))
    return {name: shown.get(name, value) for name, value in pairs}


def cli(module, docker, *args, check=True):
    rc, out, err = module.run_command([docker, *args])
    if check and rc != 0:
        module.fail_json(msg=f"docker {' '.join(args[:2])} failed: {err.strip() or out.strip()}")
    return rc, out, err


def merged_log(module, docker, name, tail=None):
    """stdout and stderr of a container, merged by docker's timestamps."""
    args = ["logs", "--timestamps"]
    if tail:
        args += ["--tail", str(tail)]
    rc, out, err = cli(module, docker, *args, name, check=False)
    lines = []
    for stream, text in ((0, out), (1, err)):
        for seq, line in enumerate(text.splitlines()):
            match = FRACTION.match(line)
            if match:
                # Docker trims trailing zeros of the fraction; pad it so text order is time order.
                key = f"{match[1]}.{(match[2] or '').ljust(9, '0')}"
                lines.append((key, stream, seq, match[3]))
            else:
                lines.append(("", stream, seq, line))
    lines.sort()
    return "\n".join(entry[3] for entry in lines) + ("\n" if lines else "")


def find(module, docker, labels):
    """The containers that carry every label of ``labels`` (an empty value matches any), by rank."""
    # A bare-metal node without docker has no rank containers.
    if not module.get_bin_path(docker):
        return []
    filters = []
    for key, value in sorted(labels.items()):
        filters += ["--filter", f"label={key}={value}" if value not in (None, "") else f"label={key}"]
    _rc, out, _err = cli(module, docker, "ps", "--all", "--quiet", "--no-trunc", *filters)
    ids = out.split()
    if not ids:
        return []
    _rc, out, _err = cli(module, docker, "inspect", *ids)
    found = []
    for item in json.loads(out):
        labels_of = item["Config"].get("Labels") or {}
        state = item["State"]
        found.append(
            {
                "id": item["Id"],
                "name": item["Name"].lstrip("/"),
                "rank": int(labels_of.get("torchfleet.rank", -1)),
                "run": labels_of.get("torchfleet.run"),
                # mpirun mode: the launcher's mpirun and the workers' sshd are not ranks.
                "role": labels_of.get("torchfleet.role", "rank"),
                "status": state["Status"],
                "running": state["Running"],
                "exit_code": None if state["Running"] else state["ExitCode"],
                "oom_killed": state.get("OOMKilled", False),
                "started_at": state.get("StartedAt"),
                "finished_at": None if state["Running"] else state.get("FinishedAt"),
                "cpuset": item["HostConfig"].get("CpusetCpus") or None,
                "cpuset_mems": item["HostConfig"].get("CpusetMems") or None,
                "devices": [d["PathOnHost"] for d in item["HostConfig"].get("Devices") or []],
                "mounts": sorted(f"{m['Source']}:{m['Destination']}" + ("" if m.get("RW", True) else ":ro")
                                 for m in item.get("Mounts") or []),
                "oom_kill_disable": bool(item["HostConfig"].get("OomKillDisable")),
                "env": reported_env(item["Config"].get("Env") or [], labels_of),
            }
        )
    return sorted(found, key=lambda c: c["rank"])


def remove(module, docker, containers, labels, wait_s, log_dir=None, log_root=None):
    """Remove ``containers`` (as find gives them): those still running get ``wait_s`` seconds
    to end by themselves (their guards stop them), then are killed; each one's log (stdout
    and stderr in time order) is written first into ``log_dir``, or ``log_root/<run>/``.
    Their last state, with ``stopped_by_torchfleet`` and ``log``, is returned."""
    deadline = time.monotonic() + wait_s
    while any(c["running"] for c in containers) and time.monotonic() < deadline:
        time.sleep(0.5)
        containers = [c for c in find(module, docker, labels) if c["id"] in {x["id"] for x in containers}]
    running = [c["name"] for c in containers if c["running"]]
    if running:
        cli(module, docker, "kill", *running, check=False)
    ids = {c["id"] for c in containers}
    finals = [c for c in find(module, docker, labels) if c["id"] in ids]
    for c in finals:
        c["stopped_by_torchfleet"] = c["name"] in running
        folder = os.path.join(log_root, c["run"] or "unknown") if log_root else log_dir
        if folder:
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, vocab.unit_log(c["role"], c["rank"]))
            with open(path, "w") as fh:
                fh.write(merged_log(module, docker, c["name"]))
            c["log"] = path
    if finals:
        cli(module, docker, "rm", "--force", *[c["id"] for c in finals])
    return finals


def image_info(module, docker, name):
    """The image ``name`` as a one-item list, or [] where the node lacks it (as docker_image_info)."""
    if not module.get_bin_path(docker):
        return []
    rc, out, err = cli(module, docker, "image", "inspect", name, check=False)
    if rc != 0:
        if "no such image" in (err + out).lower():
            return []
        module.fail_json(msg=f"docker image inspect {name} failed: {err.strip() or out.strip()}")
    return [{"Id": i["Id"], "RepoTags": i.get("RepoTags") or []} for i in json.loads(out)]


def _asked_once(module, docker, image_id, name, cache_dir, keep, argv, read):
    """What ``argv`` answers in a throwaway container of the image ``image_id`` with no
    network, as ``read(rc, out, err)`` makes it: ``(answer, final)``. An image ID names the
    image's content, so a final answer is kept in ``cache_dir`` (``<id>-<name>.json``, unless
    not ``keep``) and never asked again."""
    cached = os.path.join(cache_dir, f"{image_id.rsplit(':', 1)[-1]}-{name}.json") if cache_dir else None
    if cached and os.path.exists(cached):
        with open(cached) as fh:
            return json.load(fh)
    rc, out, err = cli(module, docker, "run", "--rm", "--network", "none", "--entrypoint", argv[0], image_id,
                       *argv[1:], check=False)
    answer, final = read(rc, out, err)
    if final and cached and keep:
        os.makedirs(cache_dir, exist_ok=True)
        part = f"{cached}.{os.getpid()}"
        with open(part, "w") as fh:
            json.dump(answer, fh)
        os.replace(part, cached)
    return answer


def _failure(rc, out, err):
    return err.strip() or out.strip() or f"exit {rc}"


def image_account(module, docker, image_id, uid, cache_dir, keep=True):
    """``{entry, error}``: ``uid``'s passwd fields in the image ``image_id`` (None where it has
    no such account), from getent, asked once per image (_asked_once)."""
    def read(rc, out, err):
        # getent exits 2 for a key it does not find: an answer, and kept like a found one.
        if rc not in (0, 2):
            return {"entry": None, "error": _failure(rc, out, err)}, False
        return {"entry": out.strip().split(":") if rc == 0 and out.strip() else None, "error": None}, True

    return _asked_once(module, docker, image_id, str(uid), cache_dir, keep, ["getent", "passwd", str(uid)], read)


def image_libraries(module, docker, image_id, names, cache_dir, keep=True):
    """Each of ``names`` with its path in the image ``image_id`` (None where it has none),
    from ldconfig; the image's whole listing is asked once per image (_asked_once)."""
    def read(rc, out, err):
        if rc != 0:
            return {"error": _failure(rc, out, err)}, False
        return {"listing": loader_libraries.parse(out)}, True

    got = _asked_once(module, docker, image_id, "ldconfig-listing", cache_dir, keep, ["ldconfig", "-p"], read)
    return loader_libraries.answer(names, got.get("listing") or {}, got.get("error"))


def status(module, docker, labels, tail_lines=15, image=None, image_uid=None, libraries=None, cache_dir=None,
           keep=True):
    """The containers that carry ``labels``, each with its last log line (and its tail where
    it exited non-zero); with ``image``, that image (``images``), and where the node has it,
    ``uid``'s account in it (``image_account``) and where it has ``libraries``."""
    containers = find(module, docker, labels)
    for c in containers:
        recent = merged_log(module, docker, c["name"], tail=tail_lines).rstrip("\n")
        c["last_line"] = recent.splitlines()[-1] if recent else ""
        if c["exit_code"] not in (None, 0):
            c["log_tail"] = recent
    found = {"containers": containers}
    if image:
        found["images"] = image_info(module, docker, image)
    if found.get("images") and image_uid is not None:
        found["image_account"] = image_account(module, docker, found["images"][0]["Id"], image_uid, cache_dir, keep)
    if found.get("images") and libraries:
        found["libraries"] = image_libraries(module, docker, found["images"][0]["Id"], libraries, cache_dir, keep)
    return found
