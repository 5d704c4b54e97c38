"""launch_checkpoint_dir on real docker hosts: a run that crashed, launched again with the
same folder, resumes from the last checkpoint its ranks wrote there."""

import pytest

from torchfleet import Job, JobFailed

from .conftest import node_sh

FOLDER = "/var/lib/torchfleet/checkpoints/resume-test"
ARGS = ["--epoch", "1", "--log-interval", "5", "--checkpoint-every", "5"]


def test_a_crashed_run_launched_again_with_its_checkpoint_folder_resumes(provisioned):
    cluster = provisioned[0]
    for node in ("node-1", "node-2"):
        node_sh(node, f"rm -rf {FOLDER}")
    job = dict(name="resume", extra_vars={"launch_checkpoint_dir": FOLDER})
    with pytest.raises(JobFailed) as info:
        cluster.launch(Job(args=[*ARGS, "--crash-rank", "1", "--crash-at-step", "12"], **job))
    assert info.value.rank == 1
    # Each node's first rank wrote its checkpoints into the node's folder, never into the run's out folder.
    for node in ("node-1", "node-2"):
        assert node_sh(node, f"ls {FOLDER}").split() == ["checkpoint-000000005.pt", "checkpoint-000000010.pt"]
    # A node that lost its copy (a new disk) resumes all the same.
    node_sh("node-2", f"rm -f {FOLDER}/*")

    run = cluster.launch(Job(args=ARGS, **job))
    assert run.ok
    resumed = {r.rank: [line for line in r.log().splitlines() if "resumed from step" in line] for r in run.ranks}
    # node-2 has no checkpoint of its own: rank 0 sent it the one it loaded.
    assert {rank: len(lines) for rank, lines in resumed.items()} == {0: 1, 1: 1}
    assert all("resumed from step 10 (epoch 1, batch 10)" in lines[0] for lines in resumed.values())
    assert run.checksums_equal
    for node in ("node-1", "node-2"):
        node_sh(node, f"rm -rf {FOLDER}")
