import json

from ansible_collections.torchfleet.cluster.plugins.module_utils.rank_docker import reported_env


def test_a_secret_variable_is_reported_as_its_label_shows_it():
    env = ["RANK=1", "http_proxy=http://u:pw@proxy:3128", "TORCHFLEET_TOKEN=tok-123", "PATH=/usr/bin",
           "no_proxy=10.0.0.0/8"]
    labels = {"torchfleet.secret_env": json.dumps({"http_proxy": "http://***@proxy:3128",
                                                   "TORCHFLEET_TOKEN": "<secret>"})}
    assert reported_env(env, labels) == {"RANK": "1", "http_proxy": "http://***@proxy:3128",
                                         "TORCHFLEET_TOKEN": "<secret>", "no_proxy": "10.0.0.0/8"}


def test_a_container_without_the_label_reports_its_env_as_is():
    assert reported_env(["RANK=0", "GLOO_SOCKET_IFNAME=eth0"], {}) == {"RANK": "0", "GLOO_SOCKET_IFNAME": "eth0"}


def _status(tmp_path, capsys, image):
    """rank_containers' status with ``image``, against a docker CLI that knows one image and no
    container, as a node with the image and no run of the job would answer."""
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.torchfleet.cluster.plugins.modules import rank_containers

    docker = tmp_path / "docker"
    docker.write_text(
        "#!/bin/sh\n"
        'case "$1 $2 $3" in\n'
        '  "image inspect train:1") echo \'[{"Id": "sha256:abc", "RepoTags": ["train:1"]}]\' ;;\n'
        '  "image inspect down:1") echo "Cannot connect to the Docker daemon" >&2; exit 1 ;;\n'
        '  "image inspect "*) echo "Error response from daemon: No such image: $3" >&2; exit 1 ;;\n'
        '  ps*) ;;\n'
        "  *) exit 3 ;;\n"
        "esac\n")
    docker.chmod(0o755)
    with patch_module_args({"labels": {"torchfleet.job": "train"}, "image": image, "docker_cli": str(docker)}):
        try:
            rank_containers.main()
        except SystemExit:
            pass
    return json.loads(capsys.readouterr().out)


def test_status_reads_the_image_in_the_same_run(tmp_path, capsys):
    result = _status(tmp_path, capsys, "train:1")
    assert not result.get("failed") and result["containers"] == []
    assert result["images"] == [{"Id": "sha256:abc", "RepoTags": ["train:1"]}]


def test_an_image_the_node_lacks_is_empty_and_an_engine_that_fails_is_a_failure(tmp_path, capsys):
    assert _status(tmp_path, capsys, "other:2")["images"] == []
    failed = _status(tmp_path, capsys, "down:1")
    assert failed["failed"] and "Cannot connect to the Docker daemon" in failed["msg"]


def _account(tmp_path, capsys, getent, **more):
    """rank_containers' status asking train:1's account of uid 61000, against a docker CLI
    whose `run` answers as ``getent`` (a shell line) and logs each call."""
    from ansible.module_utils.testing import patch_module_args

    from ansible_collections.torchfleet.cluster.plugins.modules import rank_containers

    docker = tmp_path / "docker"
    docker.write_text(
        "#!/bin/sh\n"
        f'case "$1" in\n'
        '  image) echo \'[{"Id": "sha256:abc", "RepoTags": ["train:1"]}]\' ;;\n'
        '  ps) ;;\n'
        f'  run) echo "$*" >> {tmp_path}/runs; {getent} ;;\n'
        "  *) exit 3 ;;\n"
        "esac\n")
    docker.chmod(0o755)
    with patch_module_args({"labels": {"torchfleet.job": "train"}, "image": "train:1", "image_uid": 61000,
                            "cache_dir": str(tmp_path / "cache"), "docker_cli": str(docker), **more}):
        try:
            rank_containers.main()
        except SystemExit:
            pass
    return json.loads(capsys.readouterr().out)


def test_the_images_account_is_asked_once_per_image_id_and_then_kept(tmp_path, capsys):
    found = "echo torchfleet:x:61000:61000::/home/torchfleet:/bin/bash"
    first = _account(tmp_path, capsys, found)
    assert first["image_account"] == {"entry": ["torchfleet", "x", "61000", "61000", "", "/home/torchfleet",
                                                "/bin/bash"], "error": None}
    assert (tmp_path / "runs").read_text().split() == ["run", "--rm", "--network", "none", "--entrypoint", "getent",
                                                       "sha256:abc", "passwd", "61000"]
    # Asked again, the node answers from what it kept: no second container.
    assert _account(tmp_path, capsys, "exit 99")["image_account"] == first["image_account"]
    assert len((tmp_path / "runs").read_text().splitlines()) == 1


def test_an_image_without_the_account_is_an_answer_and_a_failed_run_is_not_kept(tmp_path, capsys):
    assert _account(tmp_path, capsys, "exit 2")["image_account"] == {"entry": None, "error": None}
    (tmp_path / "cache").rename(tmp_path / "old-cache")
    broken = _account(tmp_path, capsys, "echo 'exec: getent: not found' >&2; exit 127")["image_account"]
    assert broken == {"entry": None, "error": "exec: getent: not found"}
    assert not (tmp_path / "cache").exists()


def test_a_plan_reads_a_kept_answer_but_keeps_none(tmp_path, capsys):
    found = "echo torchfleet:x:61000:61000::/home/torchfleet:/bin/bash"
    asked = _account(tmp_path, capsys, found, keep_answer=False)["image_account"]
    assert asked["entry"][0] == "torchfleet" and not (tmp_path / "cache").exists()
    kept = _account(tmp_path, capsys, found)["image_account"]
    assert _account(tmp_path, capsys, "exit 99", keep_answer=False)["image_account"] == kept == asked
    assert len((tmp_path / "runs").read_text().splitlines()) == 2


def test_the_images_libraries_are_asked_once_per_image_id_and_a_failed_run_is_not_kept(tmp_path, capsys):
    listing = r"printf '\tlibtcmalloc.so.4 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libtcmalloc.so.4\n'"
    first = _account(tmp_path, capsys, listing, image_uid=None, image_libraries=["libtcmalloc.so.4", "libjemalloc.so.2"])
    assert first["libraries"] == {"libtcmalloc.so.4": "/usr/lib/x86_64-linux-gnu/libtcmalloc.so.4",
                                  "libjemalloc.so.2": None}
    assert (tmp_path / "runs").read_text().split() == ["run", "--rm", "--network", "none", "--entrypoint", "ldconfig",
                                                       "sha256:abc", "-p"]
    again = _account(tmp_path, capsys, "exit 99", image_uid=None, image_libraries=["libjemalloc.so.2"])
    assert again["libraries"] == {"libjemalloc.so.2": None}
    assert len((tmp_path / "runs").read_text().splitlines()) == 1
    (tmp_path / "cache").rename(tmp_path / "old-cache")
    broken = _account(tmp_path, capsys, "echo 'exec: ldconfig: not found' >&2; exit 127", image_uid=None,
                      image_libraries=["libtcmalloc.so.4"])["libraries"]
    assert broken == {"libtcmalloc.so.4": None, "error": "exec: ldconfig: not found"}
    assert not (tmp_path / "cache").exists()
