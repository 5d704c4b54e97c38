"""The bundled workload's checkpoints, with the training image's own torch and torchrun: a run
that crashes and is launched again resumes from its newest complete checkpoint and ends with
the parameters of a run that never crashed. Only `docker run` of the image on this machine,
no torchfleet cluster."""

import os
import re
import shutil
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from torchfleet.idx import make_dataset

IMAGE = "torchfleet/train:2.13.0-cpu"
WORKLOADS = Path(__file__).resolve().parents[2] / "files" / "workloads"
# 320 samples over 2 ranks in batches of 16: 10 steps an epoch, 20 in all; a checkpoint every 4.
SETTINGS = ["--batch-size", "16", "--epoch", "2", "--checkpoint-every", "4", "--log-interval", "1"]
CRASH = ["--crash-rank", "1", "--crash-at-step", "14"]

pytestmark = pytest.mark.skipif(
    shutil.which("docker") is None
    or subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0,
    reason=f"needs a Docker engine with {IMAGE} (scripts/test.sh builds it)",
)


MNIST = ["/workload/mnist.py", "--data-dir", "/data", "--out-dir", "/run/out", *SETTINGS]


def in_container(data, folder, argv, env=None):
    """``argv`` in one container of the image, with the workloads, the data, and ``folder`` at /run."""
    folder.mkdir(exist_ok=True)
    name = f"tf-checkpoint-{uuid.uuid4().hex[:8]}"
    variables = {"HOME": "/tmp", "OMP_NUM_THREADS": "1", "TORCHFLEET_CHECKPOINT_DIR": "/run/checkpoints",
                 **(env or {})}
    command = ["docker", "run", "--rm", "--name", name, "--user", f"{os.getuid()}:{os.getgid()}",
               # No network: torchrun's store is on loopback, where the container's name must resolve.
               "--network", "none", "--hostname", "localhost",
               *[f"--env={k}={v}" for k, v in variables.items()],
               "-v", f"{WORKLOADS}:/workload:ro", "-v", f"{data}:/data:ro", "-v", f"{folder}:/run", IMAGE, *argv]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
        raise
    log = done.stdout + done.stderr
    return {"rc": done.returncode, "log": log, "folder": folder,
            "ranks": {r: "\n".join(line for line in log.splitlines() if f"[rank {r}]" in line) for r in (0, 1)}}


def torchrun(data, folder, *args, env=None):
    """mnist.py under one torchrun, 2 ranks; ``folder`` holds out/ and checkpoints/."""
    return in_container(data, folder, ["torchrun", "--standalone", "--nproc-per-node", "2", *MNIST, *args], env)


def two_nodes(data, folder):
    """Two ranks, as on two nodes, each with its own checkpoint folder (node-0/, node-1/); one
    container, so that they meet on its loopback, and no torchrun (the rank reads RANK itself)."""
    rank = ("RANK={0} WORLD_SIZE=2 MASTER_ADDR=localhost MASTER_PORT=29500 python "
            + " ".join(MNIST) + " --checkpoint-dir /run/node-{0}")
    return in_container(data, folder, ["sh", "-c", f"{rank.format(1)} & {rank.format(0)}; a=$?; wait $!; exit $((a | $?))"])


def checkpoints(folder):
    return sorted(p.name for p in (folder / "checkpoints").iterdir())


def losses(rank_log):
    """{(epoch, batch): loss} of a rank's Train Epoch lines."""
    return {(int(e), int(b)): loss for e, b, loss in
            re.findall(r"Train Epoch: (\d+) \[(\d+)/\d+ .*loss=(\S+)", rank_log)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoint")
    data = make_dataset(root / "data", train=320, test=64)
    # The reference and the crashing run are independent: side by side, as most of each is startup.
    with ThreadPoolExecutor(2) as pool:
        whole = pool.submit(torchrun, data, root / "whole")
        crashed = pool.submit(torchrun, data, root / "crashed", *CRASH)
        whole, crashed = whole.result(), crashed.result()
    after_crash = checkpoints(crashed["folder"])
    ckpt = crashed["folder"] / "checkpoints"
    full = (ckpt / "checkpoint-000000012.pt").read_bytes()
    # Only the first of two "nodes" has the checkpoint.
    (root / "two" / "node-0").mkdir(parents=True)
    (root / "two" / "node-0" / "checkpoint-000000012.pt").write_bytes(full)
    # A newer checkpoint torn by a copy that stopped halfway, and a temp file a killed writer left.
    (ckpt / "checkpoint-000000013.pt").write_bytes(full[: len(full) // 2])
    (ckpt / ".checkpoint-000000016.pt.tmp-gone-1").write_bytes(full[:1000])
    with ThreadPoolExecutor(2) as pool:
        # The same command again, as a restart would launch it: the crash is for attempt 0 only.
        resumed = pool.submit(torchrun, data, crashed["folder"], *CRASH, env={"TORCHFLEET_RESTART_COUNT": "1"})
        two = pool.submit(two_nodes, data, root / "two")
        resumed, two = resumed.result(), two.result()
    return {"whole": whole, "crashed": crashed, "after_crash": after_crash, "resumed": resumed, "two": two}


def test_the_crash_ends_the_run_with_the_checkpoints_before_it(runs):
    crashed = runs["crashed"]
    assert crashed["rc"] != 0, crashed["log"][-3000:]
    assert "crashing at step 14" in crashed["ranks"][1]
    # Only the last two are kept; the crash came before step 16's.
    assert runs["after_crash"] == ["checkpoint-000000008.pt", "checkpoint-000000012.pt"]


def test_the_relaunch_resumes_from_the_newest_complete_checkpoint(runs):
    resumed = runs["resumed"]
    assert resumed["rc"] == 0, resumed["log"][-3000:]
    for rank in (0, 1):
        line = next(line for line in resumed["ranks"][rank].splitlines() if "resumed from" in line)
        assert "resumed from step 12 (epoch 2, batch 2) of /run/checkpoints/checkpoint-000000012.pt" in line
        assert "TORCHFLEET_RESTART_COUNT=1" in line
        # It trained steps 13 to 20 (epoch 2, batches 2 to 9), and none before them.
        assert sorted(losses(resumed["ranks"][rank])) == [(2, b) for b in range(2, 10)]
    assert "crashing at" not in resumed["log"]


def test_the_resumed_run_ends_as_the_uninterrupted_one(runs):
    whole, resumed = runs["whole"], runs["resumed"]
    assert whole["rc"] == 0, whole["log"][-3000:]
    for rank in (0, 1):
        name = f"out/checksum-rank-{rank}.txt"
        assert (resumed["folder"] / name).read_text() == (whole["folder"] / name).read_text()
        # The same losses step by step.
        redone = losses(resumed["ranks"][rank])
        assert redone == {k: v for k, v in losses(whole["ranks"][rank]).items() if k in redone}
    # The same RNG state at the end, on both ranks (rank 0's checkpoint holds rank 1's too).
    rng = {re.search(r"RNG checksum: (\w+)", run["ranks"][rank])[1] for run in (whole, resumed) for rank in (0, 1)}
    assert len(rng) == 1


def test_a_torn_checkpoint_and_a_leftover_temp_file_are_never_loaded(runs):
    resumed = runs["resumed"]
    assert "Skipping checkpoint /run/checkpoints/checkpoint-000000013.pt: it does not load" in resumed["ranks"][0]
    # The first save after the resume removed both, with the checkpoints beyond the last two.
    assert checkpoints(resumed["folder"]) == ["checkpoint-000000016.pt", "checkpoint-000000020.pt"]


def test_a_node_without_the_checkpoint_gets_it_from_the_rank_that_has_it(runs):
    two, whole = runs["two"], runs["whole"]
    assert two["rc"] == 0, two["log"][-3000:]
    for rank in (0, 1):
        assert "resumed from step 12 (epoch 2, batch 2) of /run/node-0/checkpoint-000000012.pt" in two["ranks"][rank]
        name = f"out/checksum-rank-{rank}.txt"
        assert (two["folder"] / name).read_text() == (whole["folder"] / name).read_text()
    # Rank 1 read no file of its own: its node's folder holds only what it saved after the resume.
    saved = sorted(p.name for p in (two["folder"] / "node-1").iterdir())
    assert saved and all(int(name.split("-")[1][:9]) > 12 for name in saved), saved
