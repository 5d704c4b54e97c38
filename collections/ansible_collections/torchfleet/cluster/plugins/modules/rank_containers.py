#!/usr/bin/python
"""Report on, or stop and remove, the rank containers of a run on one node."""

from __future__ import annotations

DOCUMENTATION = r"""
module: rank_containers
short_description: Status, stop and removal of a run's rank containers on a node
description:
  - Finds the containers that carry all of I(labels).
  - With I(state=status) it reports each one's state, exit code and the last log line.
  - With I(state=absent) it kills those still running, saves each one's log (stdout and
    stderr merged in time order) into I(log_dir), and removes them.
options:
  labels:
    description: Labels a container must carry, for example C(torchfleet.run); an empty value matches any value.
    type: dict
    required: true
  state:
    description: What to do.
    type: str
    choices: [status, absent]
    default: status
  log_dir:
    description: Where I(state=absent) writes C(rank-N.log); no logs are kept when unset.
    type: path
  tail_lines:
    description: How many log lines to return for a rank that exited non-zero.
    type: int
    default: 15
  exited_only:
    description: With I(state=absent), leave running containers alone (a job's exited leftovers only).
    type: bool
    default: false
  wait_s:
    description: With I(state=absent), seconds to let running containers end by themselves (their guards stop them) before they are killed.
    type: float
    default: 0
  log_root:
    description: Where I(state=absent) writes logs into a folder per run (C(<log_root>/<run>/)) instead of I(log_dir).
    type: path
  image:
    description:
      - With I(state=status), an image to look for as well, returned in C(images), so a launch's
        check reads the node in one module run.
    type: str
  image_uid:
    description:
      - With I(image), a uid whose account in the image comes back as C(image_account), from
        getent in a throwaway container with no network. The mpirun mode runs sshd and its
        ranks as that uid.
    type: int
  image_libraries:
    description:
      - With I(image), shared libraries (sonames) to look up in the image with C(ldconfig -p),
        as LD_PRELOAD would find them there (launch_malloc); they come back as C(libraries).
    type: list
    elements: str
  cache_dir:
    description:
      - With I(image_uid) or I(image_libraries), where the answer is kept per image ID, so a
        launch starts that container once per image rather than on every launch.
    type: path
  keep_answer:
    description:
      - Whether a new answer is written to I(cache_dir). A plan reads a kept answer but
        keeps none, so that it changes nothing on the node; its throwaway container is
        removed as it ends.
    type: bool
    default: true
  docker_cli:
    description: The docker command.
    type: str
    default: docker
author: torchfleet developers (!UNKNOWN)
"""

EXAMPLES = r"""
- name: Read the state of a run's rank containers
  torchfleet.cluster.rank_containers:
    labels: {torchfleet.run: mnist-20260101-120000}
  register: ranks

- name: Stop and remove them, keeping each rank's log
  torchfleet.cluster.rank_containers:
    labels: {torchfleet.run: mnist-20260101-120000}
    state: absent
    wait_s: 10
    log_dir: /var/lib/torchfleet/runs/mnist-20260101-120000
"""

RETURN = r"""
containers:
  description: One entry per container, ordered by rank.
  returned: always
  type: list
  elements: dict
images:
  description: With I(image), that image (its C(Id) and C(RepoTags)) where the node has it; else empty.
  returned: when image is set
  type: list
  elements: dict
image_account:
  description:
    - With I(image_uid), where the node has the image, C(entry) (the passwd fields of that
      uid's account in the image, or null where it has none) and C(error) (getent's error,
      if it could not answer).
  returned: when image_uid is set and the node has the image
  type: dict
libraries:
  description:
    - With I(image_libraries), where the node has the image, each library with its path in
      the image, or null where the image has none; C(error) where ldconfig could not answer.
  returned: when image_libraries is set and the node has the image
  type: dict
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchfleet.cluster.plugins.module_utils import loader_libraries
from ansible_collections.torchfleet.cluster.plugins.module_utils import rank_docker


def _cli(module, *args, check=True):
    return rank_docker.cli(module, module.params["docker_cli"], *args, check=check)


def image_info(module, name):
    """The image ``name`` as a one-item list, or [] where the node lacks it (as docker_image_info)."""
    if not module.get_bin_path(module.params["docker_cli"]):
        return []
    rc, out, err = _cli(module, "image", "inspect", name, check=False)
    if rc != 0:
        if "no such image" in (err + out).lower():
            return []
        module.fail_json(msg=f"docker image inspect {name} failed: {err.strip() or out.strip()}")
    return [{"Id": i["Id"], "RepoTags": i.get("RepoTags") or []} for i in json.loads(out)]


def _asked_once(module, image_id, name, cache_dir, keep, argv, read):
    """What ``argv`` answers in a throwaway container of the image ``image_id`` with no
    network, as ``read(rc, out, err)`` makes it: ``(answer, final)``. An image ID names the
    image's content, so a final answer is kept in ``cache_dir`` (``<id>-<name>.json``, unless
    not ``keep``) and never asked again."""
    cached = os.path.join(cache_dir, f"{image_id.rsplit(':', 1)[-1]}-{name}.json") if cache_dir else None
    if cached and os.path.exists(cached):
        with open(cached) as fh:
            return json.load(fh)
    rc, out, err = _cli(module, "run", "--rm", "--network", "none", "--entrypoint", argv[0], image_id, *argv[1:],
                        check=False)
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


def image_account(module, image_id, uid, cache_dir, keep=True):
    """``{entry, error}``: ``uid``'s passwd fields in the image ``image_id`` (None where it has
    no such account), from getent, asked once per image (_asked_once)."""
    def read(rc, out, err):
        # getent exits 2 for a key it does not find: an answer, and kept like a found one.
        if rc not in (0, 2):
            return {"entry": None, "error": _failure(rc, out, err)}, False
        return {"entry": out.strip().split(":") if rc == 0 and out.strip() else None, "error": None}, True

    return _asked_once(module, image_id, str(uid), cache_dir, keep, ["getent", "passwd", str(uid)], read)


def image_libraries(module, image_id, names, cache_dir, keep=True):
    """Each of ``names`` with its path in the image ``image_id`` (None where it has none),
    from ldconfig; the image's whole listing is asked once per image (_asked_once)."""
    def read(rc, out, err):
        if rc != 0:
            return {"error": _failure(rc, out, err)}, False
        return {"listing": loader_libraries.parse(out)}, True

    got = _asked_once(module, image_id, "ldconfig-listing", cache_dir, keep, ["ldconfig", "-p"], read)
    return loader_libraries.answer(names, got.get("listing") or {}, got.get("error"))


def main():
    module = AnsibleModule(
        argument_spec={
            "labels": {"type": "dict", "required": True},
            "state": {"type": "str", "choices": ["status", "absent"], "default": "status"},
            "log_dir": {"type": "path"},
            "tail_lines": {"type": "int", "default": 15},
            "exited_only": {"type": "bool", "default": False},
            "wait_s": {"type": "float", "default": 0},
            "log_root": {"type": "path"},
            "image": {"type": "str"},
            "image_uid": {"type": "int"},
            "image_libraries": {"type": "list", "elements": "str"},
            "cache_dir": {"type": "path"},
            "keep_answer": {"type": "bool", "default": True},
            "docker_cli": {"type": "str", "default": "docker"},
        },
        supports_check_mode=True,
    )
    docker, labels = module.params["docker_cli"], module.params["labels"]
    containers = rank_docker.find(module, docker, labels)
    if module.params["state"] == "status":
        for c in containers:
            recent = rank_docker.merged_log(module, docker, c["name"], tail=module.params["tail_lines"]).rstrip("\n")
            c["last_line"] = recent.splitlines()[-1] if recent else ""
            if c["exit_code"] not in (None, 0):
                c["log_tail"] = recent
        images = {"images": image_info(module, module.params["image"])} if module.params["image"] else {}
        if images.get("images") and module.params["image_uid"] is not None:
            images["image_account"] = image_account(module, images["images"][0]["Id"], module.params["image_uid"],
                                                    module.params["cache_dir"], module.params["keep_answer"])
        if images.get("images") and module.params["image_libraries"]:
            images["libraries"] = image_libraries(module, images["images"][0]["Id"], module.params["image_libraries"],
                                                  module.params["cache_dir"], module.params["keep_answer"])
        module.exit_json(changed=False, containers=containers, **images)

    if module.params["exited_only"]:
        containers = [c for c in containers if not c["running"]]
    if not containers or module.check_mode:
        module.exit_json(changed=bool(containers), containers=containers)
    finals = rank_docker.remove(module, docker, containers, labels, module.params["wait_s"],
                                module.params["log_dir"], module.params["log_root"])
    module.exit_json(changed=True, containers=finals)


if __name__ == "__main__":
    main()
