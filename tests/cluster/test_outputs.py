"""What the ranks write under TORCHFLEET_OUT_DIR comes back into runs/RUN/out/HOST/, byte for
byte, within launch_collect_out_max_mb; and the bundled workload's TensorBoard events open
with TensorBoard's own reader."""

import hashlib
import json
import random
import re
from pathlib import Path

import pytest

import torchfleet
from torchfleet import Job

from .conftest import node_sh

# Each rank writes a few files of known content, in nested folders too (one named like
# torchfleet's own rank logs, which only the top of the folder holds), and with BIG_MB a
# file of that many MB that does not compress (a checkpoint's bytes, seeded per rank): over
# 4 MiB, a node's archive comes back as a file of its own, not in the module's result.
OUT_WORKLOAD = """
import hashlib, json, os, random
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
out = os.environ["TORCHFLEET_OUT_DIR"]

def put(rel, data):
    path = os.path.join(out, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(data)

put(f"metrics-rank-{rank}.json", json.dumps({"rank": rank, "loss": 0.5 / (rank + 1)}).encode())
put(f"rank-{rank}/nested/deep/blob.bin", hashlib.sha256(f"rank {rank}".encode()).digest() * 4096)
put(f"rank-{rank}/nested/rank-{rank}.log", b"a log of the user's own\\n")
if int(os.environ.get("BIG_MB", "0")):
    put(f"rank-{rank}/ckpt/big.bin", random.Random(rank).randbytes(int(os.environ["BIG_MB"]) << 20))
print(f"rank {rank} wrote its out files", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def expected(rank, big_mb=0):
    """Each file a rank writes, by its path in the out folder, with its content, as this test
    computes it (not as the rank did)."""
    files = {
        f"metrics-rank-{rank}.json": json.dumps({"rank": rank, "loss": 0.5 / (rank + 1)}).encode(),
        f"rank-{rank}/nested/deep/blob.bin": hashlib.sha256(f"rank {rank}".encode()).digest() * 4096,
        f"rank-{rank}/nested/rank-{rank}.log": b"a log of the user's own\n",
    }
    if big_mb:
        files[f"rank-{rank}/ckpt/big.bin"] = random.Random(rank).randbytes(big_mb << 20)
    return files


def arrived(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def on_node(host, run_id, rel):
    return node_sh(host, f"sha256sum /var/lib/torchfleet/runs/{run_id}/{rel}").split()[0]


@pytest.fixture(scope="module")
def out_workload(tmp_path_factory):
    path = tmp_path_factory.mktemp("out-workload") / "write_out.py"
    path.write_text(OUT_WORKLOAD)
    return path


def test_every_ranks_out_folder_arrives_with_its_checksums(provisioned, out_workload):
    cluster = provisioned[0]
    run = cluster.launch(Job(workload=out_workload, name="outfiles", args=[]))
    assert run.ok
    out = Path(run.run_dir) / "out"
    assert sorted(p.name for p in out.iterdir()) == ["node-1", "node-2"]  # nothing half-arrived beside them
    for r in run.ranks:
        files = expected(r.rank)
        got = arrived(out / r.host)
        # Only the user's files: no log, checksum, guard record, heartbeat, spec or env file of torchfleet's.
        assert sorted(got) == sorted(files)
        for rel, data in files.items():
            assert got[rel] == hashlib.sha256(data).hexdigest() == on_node(r.host, run.run_id, rel)
        entry = run.outputs[r.host]
        assert entry["message"] is None and entry["left_files"] == 0
        assert (entry["files"], entry["bytes"]) == (len(files), sum(map(len, files.values())))
    # torchfleet's own files stay where they were.
    assert (Path(run.run_dir) / "rank-1.log").is_file() and "wrote its out files" in run.ranks[1].log()


def test_a_limit_keeps_large_files_on_the_node_says_so_and_collect_brings_them(provisioned, out_workload):
    cluster = provisioned[0]
    job = Job(workload=out_workload, name="outfiles", args=[], env={"BIG_MB": "5"},
              extra_vars={"launch_collect_out_max_mb": 1})
    run = cluster.launch(job)
    assert run.ok  # a limit cuts what comes back, never the run
    out = Path(run.run_dir) / "out"
    for r in run.ranks:
        files = expected(r.rank, big_mb=5)
        big = f"rank-{r.rank}/ckpt/big.bin"
        got = arrived(out / r.host)
        assert sorted(got) == sorted(set(files) - {big})
        assert all(got[rel] == hashlib.sha256(files[rel]).hexdigest() for rel in got)
        entry = run.outputs[r.host]
        assert (entry["left_files"], entry["left_bytes"]) == (1, 5 << 20)
        message = entry["message"]
        assert message.startswith(f"{r.host} (rank {r.rank}): 1 of the out folder's 4 files (5.0 MB of ")
        assert "launch_collect_out_max_mb=1" in message and f"{big} (5.0 MB)" in message
        assert f"{r.host}:/var/lib/torchfleet/runs/{run.run_id}" in message
        assert message.endswith(f"torchfleet collect {run.run_id} -e launch_collect_out_max_mb=6")
    # The report on disk says the same.
    summary = json.loads((Path(run.run_dir) / "summary.json").read_text())
    assert summary["outputs"]["node-2"]["message"] == run.outputs["node-2"]["message"]

    # What the message advises brings the rest, byte for byte.
    wider = torchfleet.Cluster(cluster.inventory, runs_dir=cluster.runs_dir, env=cluster.env, progress=False,
                               extra_vars={"launch_collect_out_max_mb": 6})
    again = wider.run(run.run_id).collect()
    for r in again.ranks:
        files = expected(r.rank, big_mb=5)
        assert arrived(out / r.host) == {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
        assert again.outputs[r.host]["message"] is None
        # The archive, too large for the module's result, was fetched and then deleted there.
        assert ".collect-" not in node_sh(r.host, "ls -a /var/lib/torchfleet/runs")
    assert sorted(p.name for p in out.iterdir()) == ["node-1", "node-2"]


def test_the_bundled_workloads_loss_opens_in_tensorboard(provisioned):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    cluster = provisioned[0]
    run = cluster.launch(Job(args=["--epoch", "1", "--seed", "42", "--no-cuda", "--log-interval", "20"]))
    assert run.ok
    for r in run.ranks:
        folder = Path(run.run_dir) / "out" / r.host / "tensorboard" / f"rank-{r.rank}"
        (events,) = folder.iterdir()
        assert events.name.startswith("events.out.tfevents.")
        acc = event_accumulator.EventAccumulator(str(folder))
        acc.Reload()
        losses = {e.step: e.value for e in acc.Scalars("train/loss")}
        # Every step of the epoch, each at the loss the rank printed (to its 4 decimals).
        logged = [(int(m[1]), int(m[2]), float(m[3]))
                  for m in re.finditer(r"Train Epoch: 1 \[(\d+)/(\d+) \(\d+%\)\]\s+loss=([0-9.]+)", r.log())]
        batches = logged[0][1]
        assert sorted(losses) == list(range(batches))
        assert all(abs(losses[step] - loss) <= 5e-5 for step, _, loss in logged)
        assert len(acc.Scalars("test/accuracy")) == 1


# A user's own script, as the field writes one: torch.utils.tensorboard's SummaryWriter into
# TORCHFLEET_OUT_DIR, values that the test can compute on its own.
SUMMARY_WORKLOAD = """
import os
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter
dist.init_process_group("gloo")
rank = dist.get_rank()
writer = SummaryWriter(os.path.join(os.environ["TORCHFLEET_OUT_DIR"], "tb", f"rank-{rank}"))
for step in range(7):
    writer.add_scalar("user/loss", 1.0 / (step + 2 + rank), step)
writer.close()
dist.barrier()
dist.destroy_process_group()
"""


def test_a_users_summary_writer_runs_in_the_image_and_its_events_open_in_tensorboard(provisioned, tmp_path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    script = tmp_path / "user_tb.py"
    script.write_text(SUMMARY_WORKLOAD)
    run = provisioned[0].launch(Job(workload=str(script)))
    assert run.ok, run
    for r in run.ranks:
        acc = event_accumulator.EventAccumulator(str(Path(run.run_dir) / "out" / r.host / "tb" / f"rank-{r.rank}"))
        acc.Reload()
        assert [(e.step, round(e.value, 6)) for e in acc.Scalars("user/loss")] == \
            [(step, round(1.0 / (step + 2 + r.rank), 6)) for step in range(7)]
