"""Broadcast a tensor holding a known byte pattern, then time allreduce over Gloo.

The overlay's tests and bench/overlay.py use it: rank 0 broadcasts --pattern repeated to
--pattern-kib KiB, every rank writes the sha256 of what it received (checksum-rank-N.txt,
equal on every rank), so a capture of the network shows whether the pattern crossed it in
plaintext. Then --iters allreduces of --size-mib MiB each, reported as
``allreduce: ... MiB/s`` (the algorithm bandwidth: bytes of the tensor per second).

The rank comes from RANK/WORLD_SIZE, or from Open MPI's OMPI_COMM_WORLD_* under mpirun.
"""

import argparse
import hashlib
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def rank_and_size(env):
    if "OMPI_COMM_WORLD_RANK" in env and "RANK" not in env:
        return int(env["OMPI_COMM_WORLD_RANK"]), int(env["OMPI_COMM_WORLD_SIZE"])
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pattern", default="TORCHFLEET-CLEARTEXT-PATTERN-7f3a9c")
    parser.add_argument("--pattern-kib", type=int, default=256)
    parser.add_argument("--size-mib", type=float, default=4.0)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--init-timeout", type=int, default=120)
    # The launch adds these for every workload; this one reads no data.
    parser.add_argument("--data-dir", default=os.environ.get("TORCHFLEET_DATA_DIR"))
    parser.add_argument("--out-dir", default=os.environ.get("TORCHFLEET_OUT_DIR", "."))
    parser.add_argument("--no-cuda", action="store_true")
    args = parser.parse_args(argv)

    rank, world_size = rank_and_size(os.environ)
    # What this rank was told to talk over, for the overlay's tests.
    print(f"rank {rank}: MASTER_ADDR={os.environ.get('MASTER_ADDR')} "
          f"GLOO_SOCKET_IFNAME={os.environ.get('GLOO_SOCKET_IFNAME')}", flush=True)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=args.init_timeout))
    size = args.pattern_kib * 1024
    if rank == 0:
        raw = (args.pattern.encode() * (size // len(args.pattern) + 1))[:size]
        data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    else:
        data = torch.zeros(size, dtype=torch.uint8)
    dist.broadcast(data, src=0)
    digest = hashlib.sha256(data.numpy().tobytes()).hexdigest()
    with open(os.path.join(args.out_dir, f"checksum-rank-{rank}.txt"), "w") as fh:
        fh.write(digest + "\n")
    print(f"rank {rank}: broadcast of {size} bytes, sha256 {digest}", flush=True)

    tensor = torch.ones(int(args.size_mib * 1024 * 1024 / 4), dtype=torch.float32)
    dist.all_reduce(tensor)  # warm-up: the pairs' connections are made here
    dist.barrier()
    started = time.perf_counter()
    for _iteration in range(args.iters):
        dist.all_reduce(tensor)
    elapsed = time.perf_counter() - started
    mib = args.size_mib * args.iters
    print(f"rank {rank}: allreduce: {args.iters} x {args.size_mib:g} MiB in {elapsed:.3f} s: "
          f"{mib / elapsed:.1f} MiB/s", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
