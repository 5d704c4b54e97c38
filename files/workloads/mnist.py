"""Train a small CNN on FashionMNIST with DistributedDataParallel over Gloo.

Options follow the Occlum and BigDL guides (--epoch, --no-cuda, --seed, --save-model).
The rank comes from RANK/WORLD_SIZE (direct launch, torchrun) or from Open MPI's
OMPI_COMM_WORLD_* (mpirun). Only torch is needed: the gzip'd IDX files are read with
the standard library, so the script also runs in stock PyTorch images. Each rank writes
its loss per step as TensorBoard events in OUT_DIR/tensorboard/rank-N with
torch.utils.tensorboard's SummaryWriter, where the tensorboard package is installed (the
training image has it).

With a checkpoint folder (--checkpoint-dir, or TORCHFLEET_CHECKPOINT_DIR), each node's first
rank (LOCAL_RANK 0) saves the model, the optimizer, the position in the data and the RNG state every --checkpoint-every
steps, and every rank resumes from the newest complete checkpoint at start.
"""

import argparse
import gzip
import hashlib
import logging
import os
import random
import re
import signal
import socket
import struct
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

log = logging.getLogger("mnist")


def read_idx(path):
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file")
    shape = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    return torch.frombuffer(bytearray(data[4 + 4 * ndim :]), dtype=torch.uint8).reshape(shape)


def load_split(data_dir, prefix):
    images = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"))
    # The mean and std of FashionMNIST, as in the reference guides' transforms.
    images = (images.float().div(255.0).unsqueeze(1) - 0.2860) / 0.3530
    return TensorDataset(images, labels.long())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


def world():
    """(rank, world_size, local_rank) from torchrun-style or Open MPI variables."""
    env = os.environ
    if "OMPI_COMM_WORLD_RANK" in env and "RANK" not in env:
        return (
            int(env["OMPI_COMM_WORLD_RANK"]),
            int(env["OMPI_COMM_WORLD_SIZE"]),
            int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", 0)),
        )
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0))


def format_cpus(cpus):
    ranges, start = [], None
    for i, cpu in enumerate(cpus):
        start = cpu if start is None else start
        if i + 1 == len(cpus) or cpus[i + 1] != cpu + 1:
            ranges.append(str(start) if start == cpu else f"{start}-{cpu}")
            start = None
    return ",".join(ranges)


def cgroup_cpuset():
    """The container's effective cpuset as its cgroup states it (v2, then v1)."""
    for path in ("/sys/fs/cgroup/cpuset.cpus.effective", "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"):
        try:
            with open(path) as fh:
                return fh.read().strip()
        except OSError:
            continue
    return "-"


class NoEvents:
    """Where the tensorboard package is missing (a stock PyTorch image): no curves, same calls."""

    def add_scalar(self, *args, **kwargs):
        pass

    def flush(self):
        pass

    def close(self):
        pass


def summary_writer(folder):
    """TensorBoard's own writer for ``folder``; it writes to disk every few seconds, so that
    a run's curves can be followed while it trains."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        log.warning("no TensorBoard events: %s", exc)
        return NoEvents()
    return SummaryWriter(log_dir=folder, flush_secs=5)


def checksum(model):
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


# Checkpoints: "checkpoint-<step>.pt", complete once renamed to that name. A writer's temp
# file starts with a dot and never matches, so a half-written checkpoint is never loaded.
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d{9,})\.pt$")
TEMP_RE = re.compile(r"^\.checkpoint-(\d{9,})\.pt\.tmp-")
RESTART_VARIABLES = ("TORCHFLEET_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT")


def checkpoint_name(step):
    return f"checkpoint-{step:09d}.pt"


def complete_checkpoints(names):
    """The complete checkpoints among a folder's file ``names``, newest (highest step) first."""
    found = [(int(match[1]), name) for name in names if (match := CHECKPOINT_RE.match(name))]
    return [name for _step, name in sorted(found, reverse=True)]


def stale_files(names, keep, own_temp):
    """What a writer removes after a save: complete checkpoints beyond the newest ``keep``, and
    temp files of earlier steps than its own. The writers (one rank per node) save the same
    steps in step, so such a file is a dead writer's; one of the same step may be another
    node's write in progress, in a folder the nodes share."""
    step = int(TEMP_RE.match(own_temp)[1])
    temps = [name for name in names if (match := TEMP_RE.match(name)) and int(match[1]) < step]
    return complete_checkpoints(names)[keep:] + sorted(temps)


def resume_position(saved, steps_per_epoch, world_size, batch_size):
    """(epoch, batches of it already done, exact) to resume a checkpoint's position from.

    Under the checkpoint's world size and batch size the position is exact. Under others, the
    epoch's samples already seen are kept, rounded down to whole steps (some are seen twice,
    none skipped): each step takes the next world_size * batch_size samples of the epoch's
    permutation, whatever the world size."""
    epoch, batch = saved["epoch"], saved["batch"]
    exact = (saved["world_size"], saved["batch_size"]) == (world_size, batch_size)
    if not exact:
        batch = min(batch * saved["world_size"] * saved["batch_size"] // (world_size * batch_size), steps_per_epoch)
    if batch >= steps_per_epoch:
        epoch, batch = epoch + 1, 0
    return epoch, batch, exact


def restart_counts(env):
    """The restart counts a launcher set (torchfleet's, then torchrun's), as found."""
    return {name: env[name] for name in RESTART_VARIABLES if env.get(name, "") != ""}


def attempt(env):
    """This attempt's number, 0 for the first: torchfleet's restart count, else torchrun's."""
    counts = restart_counts(env)
    return int(next(iter(counts.values()))) if counts else 0


def rng_state():
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def set_rng_state(state):
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


def rng_digest():
    return hashlib.sha256(torch.get_rng_state().numpy().tobytes() + repr(random.getstate()).encode()).hexdigest()


def _fsync_folder(folder):
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(folder, step, state, keep=2):
    """Write ``state`` as the checkpoint of ``step``: a temp file beside it, fsync'd, then renamed."""
    os.makedirs(folder, exist_ok=True)
    name = checkpoint_name(step)
    temp = f".{name}.tmp-{socket.gethostname()}-{os.getpid()}"
    with open(os.path.join(folder, temp), "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(os.path.join(folder, temp), os.path.join(folder, name))
    # The rename itself must reach the disk before an older checkpoint goes.
    _fsync_folder(folder)
    for stale in stale_files(os.listdir(folder), keep, temp):
        try:
            os.remove(os.path.join(folder, stale))
        except FileNotFoundError:
            pass
    return os.path.join(folder, name)


def load_newest(folder):
    """(path, state) of the newest checkpoint in ``folder`` that loads; (None, None) without one.
    A complete name with unreadable bytes (a torn copy, a full disk) falls back to the one before."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return None, None
    for name in complete_checkpoints(names):
        path = os.path.join(folder, name)
        try:
            return path, torch.load(path, map_location="cpu", weights_only=True)
        # Whatever makes a file unreadable (a torn zip, a bad pickle), it is skipped the same way.
        except Exception as exc:
            log.warning("Skipping checkpoint %s: it does not load (%s)", path, exc)
    return None, None


def agree_on_checkpoint(path, state, rank, world_size):
    """Every rank's newest checkpoint, made one: when the ranks' folders differ (one node's
    folder is behind, or empty), the rank holding the newest sends it to all."""
    step = state["step"] if state else -1
    steps = [None] * world_size
    dist.all_gather_object(steps, step)
    best = max(steps)
    if best < 0 or all(s == best for s in steps):
        return path, state
    owner = steps.index(best)
    box = [(path, state) if rank == owner else None]
    dist.broadcast_object_list(box, src=owner)
    return box[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epoch", type=int, default=1, help="number of epochs")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--no-cuda", action="store_true", help="accepted for the guides' command lines; CPU only")
    parser.add_argument("--save-model", action="store_true", help="rank 0 saves model.pt in --out-dir")
    parser.add_argument("--data-dir", default=os.environ.get("TORCHFLEET_DATA_DIR", "data/FashionMNIST/raw"))
    parser.add_argument("--out-dir", default=os.environ.get("TORCHFLEET_OUT_DIR", "."))
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--init-timeout", type=int, default=300, help="seconds to wait for every rank to join")
    parser.add_argument("--checkpoint-dir", default=os.environ.get("TORCHFLEET_CHECKPOINT_DIR") or None,
                        help="save checkpoints here and resume from the newest (default: TORCHFLEET_CHECKPOINT_DIR)")
    parser.add_argument("--checkpoint-every", type=int, default=100,
                        help="steps between checkpoints, with a checkpoint folder; 0 saves none but still resumes")
    parser.add_argument("--crash-rank", type=int, default=-1, help="for fault tests: this rank kills itself")
    parser.add_argument("--crash-at-step", type=int, default=0, help="for fault tests: right after this step")
    parser.add_argument("--crash-on-attempt", type=int, default=0,
                        help="for fault tests: in this attempt only (the restart count; -1: in every attempt)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.checkpoint_every < 0:
        parser.error("--checkpoint-every must be 0 or more")

    rank, world_size, local_rank = world()
    logging.Formatter.converter = time.gmtime
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO,
        format=f"%(asctime)s.%(msecs)03dZ %(levelname)-8s [rank {rank}] %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
    )
    torch.manual_seed(args.seed)
    # Python's own RNG too, so that every rank's RNG state is the same and rank 0's checkpoint
    # holds the state of each.
    random.seed(args.seed)
    log.info("CPU affinity %s, cgroup cpuset %s, OMP_NUM_THREADS=%s, torch threads %d",
             format_cpus(sorted(os.sched_getaffinity(0))), cgroup_cpuset(),
             os.environ.get("OMP_NUM_THREADS", "-"), torch.get_num_threads())

    distributed = world_size > 1
    if distributed:
        log.info("Using distributed PyTorch with gloo backend (rank %d of %d, local rank %d, iface %s)",
                 rank, world_size, local_rank, os.environ.get("GLOO_SOCKET_IFNAME", "-"))
        dist.init_process_group(
            "gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=args.init_timeout)
        )
        log.info("Joined the process group of %d ranks", world_size)

    train = load_split(args.data_dir, "train")
    test = load_split(args.data_dir, "t10k")
    sampler = DistributedSampler(train, num_replicas=world_size, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)

    model = Net()
    resume, start_epoch, skip = None, 1, 0
    if args.checkpoint_dir:
        path, resume = load_newest(args.checkpoint_dir)
        if distributed:
            path, resume = agree_on_checkpoint(path, resume, rank, world_size)
        counts = "".join(f", {name}={value}" for name, value in restart_counts(os.environ).items())
        if resume:
            start_epoch, skip, exact = resume_position(resume, len(loader), world_size, args.batch_size)
            model.load_state_dict(resume["model"])
            log.info("resumed from step %d (epoch %d, batch %d) of %s%s%s", resume["step"], resume["epoch"],
                     resume["batch"], path, counts,
                     "" if exact else f"; world size {resume['world_size']} -> {world_size}, batch size "
                     f"{resume['batch_size']} -> {args.batch_size}: going on at epoch {start_epoch}, batch {skip}")
        else:
            log.info("starting from step 0: no complete checkpoint in %s%s", args.checkpoint_dir, counts)
    if distributed:
        model = DistributedDataParallel(model)
        # DDP regroups its gradient buckets after its first backward, and with 3 ranks or more
        # the allreduce's summation order follows the layout: a resumed run's first step would
        # sum in another order than the uninterrupted run's step did. One backward of zero
        # gradients, in every run, makes every training step use the regrouped buckets.
        (model(torch.zeros(1, 1, 28, 28)).sum() * 0).backward()
        model.zero_grad(set_to_none=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.5)
    if resume:
        optimizer.load_state_dict(resume["optimizer"])
    # Each rank its own folder: TensorBoard shows one run per folder, so ranks sharing a
    # node's out folder stay apart.
    events = summary_writer(os.path.join(args.out_dir, "tensorboard", f"rank-{rank}"))
    crash = (rank == args.crash_rank and args.crash_at_step > 0
             and args.crash_on_attempt in (-1, attempt(os.environ)))

    # Making an epoch's iterator draws from torch's RNG (the loader's base seed), and the saved
    # state is from after that draw: it is restored after the resumed epoch's draw, or here
    # (nothing draws from here to the loop) when the checkpoint closed an epoch.
    if resume and not skip:
        set_rng_state(resume["rng"])
        resume = None
    step = (start_epoch - 1) * len(loader) + skip
    for epoch in range(start_epoch, args.epoch + 1):
        sampler.set_epoch(epoch)
        model.train()
        batches = iter(loader)
        if resume:
            set_rng_state(resume["rng"])
            for _skipped in range(skip):
                next(batches)
        first, skip, resume = skip, 0, None
        for batch_idx, (data, target) in enumerate(batches, start=first):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            # The step as the run's summary counts it (report.parse_steps).
            events.add_scalar("train/loss", loss.item(), (epoch - 1) * len(loader) + batch_idx)
            if batch_idx % args.log_interval == 0 or batch_idx == len(loader) - 1:
                events.flush()
                log.info("Train Epoch: %d [%d/%d (%.0f%%)]\tloss=%.4f",
                         epoch, batch_idx, len(loader), 100.0 * batch_idx / len(loader), loss.item())
            step += 1
            # DDP keeps the replicas, and the ranks' RNG draws, equal: rank 0's state is every
            # rank's. Each node's first rank saves it, so that a node that survives the master's
            # loss holds the newest checkpoint too.
            if args.checkpoint_dir and args.checkpoint_every and step % args.checkpoint_every == 0 and local_rank == 0:
                saved = save_checkpoint(args.checkpoint_dir, step, {
                    "step": step, "epoch": epoch, "batch": batch_idx + 1,
                    "world_size": world_size, "batch_size": args.batch_size,
                    "model": (model.module if distributed else model).state_dict(),
                    "optimizer": optimizer.state_dict(), "rng": rng_state(),
                })
                log.info("Saved checkpoint at step %d (epoch %d, batch %d): %s", step, epoch, batch_idx + 1, saved)
            if crash and step == args.crash_at_step:
                log.info("crashing at step %d (--crash-at-step, attempt %d)", step, attempt(os.environ))
                sys.stdout.flush()
                # SIGKILL, as the OOM killer would: no handler, no cleanup.
                os.kill(os.getpid(), signal.SIGKILL)

    model.eval()
    with torch.no_grad():
        correct = sum(
            (model(data).argmax(dim=1) == target).sum().item()
            for data, target in DataLoader(test, batch_size=256)
        )
    log.info("Test accuracy: %d/%d (%.1f%%)", correct, len(test), 100.0 * correct / len(test))
    events.add_scalar("test/accuracy", correct / len(test), args.epoch * len(loader))
    events.close()

    plain = model.module if distributed else model
    os.makedirs(args.out_dir, exist_ok=True)
    digest = checksum(plain)
    with open(os.path.join(args.out_dir, f"checksum-rank-{rank}.txt"), "w") as fh:
        fh.write(digest + "\n")
    log.info("Parameter checksum: %s", digest)
    if args.checkpoint_dir:
        # A resumed run that restored the RNG state exactly ends with the same digest.
        log.info("RNG checksum: %s", rng_digest())
    if args.save_model and rank == 0:
        # Written beside and renamed, so a reader never sees half a model.
        partial = os.path.join(args.out_dir, f".model.pt.{os.getpid()}")
        torch.save(plain.state_dict(), partial)
        os.replace(partial, os.path.join(args.out_dir, "model.pt"))
        log.info("Saved model to %s", os.path.join(args.out_dir, "model.pt"))
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
