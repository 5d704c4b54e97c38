#!/usr/bin/env python3
"""Train a small CNN on FashionMNIST with DistributedDataParallel over Gloo.

Options follow the Occlum and BigDL guides (--epoch, --no-cuda, --seed, --save-model).
The rank comes from RANK/WORLD_SIZE (direct launch, torchrun) or from Open MPI's
OMPI_COMM_WORLD_* (mpirun). Only torch is needed: the gzip'd IDX files are read with
the standard library, so the script also runs in stock PyTorch images.
"""

import argparse
import gzip
import hashlib
import logging
import os
import struct
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
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


def checksum(model):
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


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
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    rank, world_size, local_rank = world()
    logging.Formatter.converter = time.gmtime
    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO,
        format=f"%(asctime)s.%(msecs)03dZ %(levelname)-8s [rank {rank}] %(message)s",
        datefmt="%Y-%m-%dT%H:%M:%S",
    )
    torch.manual_seed(args.seed)
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
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.5)

    for epoch in range(1, args.epoch + 1):
        sampler.set_epoch(epoch)
        model.train()
        for batch_idx, (data, target) in enumerate(loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch_idx % args.log_interval == 0 or batch_idx == len(loader) - 1:
                log.info("Train Epoch: %d [%d/%d (%.0f%%)]\tloss=%.4f",
                         epoch, batch_idx, len(loader), 100.0 * batch_idx / len(loader), loss.item())

    model.eval()
    with torch.no_grad():
        correct = sum(
            (model(data).argmax(dim=1) == target).sum().item()
            for data, target in DataLoader(test, batch_size=256)
        )
    log.info("Test accuracy: %d/%d (%.1f%%)", correct, len(test), 100.0 * correct / len(test))

    plain = model.module if distributed else model
    os.makedirs(args.out_dir, exist_ok=True)
    digest = checksum(plain)
    with open(os.path.join(args.out_dir, f"checksum-rank-{rank}.txt"), "w") as fh:
        fh.write(digest + "\n")
    log.info("Parameter checksum: %s", digest)
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
