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

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.torchfleet.cluster.plugins.module_utils import rank_docker


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
    if module.params["state"] == "status":
        module.exit_json(changed=False, **rank_docker.status(
            module, docker, labels, module.params["tail_lines"], module.params["image"], module.params["image_uid"],
            module.params["image_libraries"], module.params["cache_dir"], module.params["keep_answer"]))
    containers = rank_docker.find(module, docker, labels)
    if module.params["exited_only"]:
        containers = [c for c in containers if not c["running"]]
    if not containers or module.check_mode:
        module.exit_json(changed=bool(containers), containers=containers)
    finals = rank_docker.remove(module, docker, containers, labels, module.params["wait_s"],
                                module.params["log_dir"], module.params["log_root"])
    module.exit_json(changed=True, containers=finals)


if __name__ == "__main__":
    main()
