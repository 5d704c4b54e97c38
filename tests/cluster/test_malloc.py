"""launch_malloc on real docker hosts: what each rank's process has mapped, and a refusal
before any rank starts where the image lacks the library."""

import pytest

import torchfleet
from torchfleet import Job, TaskFailed

from .conftest import node_sh

# Each rank reports the allocators its own process has mapped (/proc/self/maps is
# /proc/<its pid>/maps), after joining the group so that the launch's MASTER_PORT wait passes.
MAPS_WORKLOAD = """
import os
import torch.distributed as dist
dist.init_process_group("gloo")
with open("/proc/self/maps") as fh:
    maps = fh.read()
mapped = sorted({lib for lib in ("libtcmalloc", "libjemalloc") if lib in maps})
print(f"rank {dist.get_rank()} pid {os.getpid()} mapped {','.join(mapped) or 'none'}", flush=True)
dist.barrier()
"""


def _mapped(run):
    return {r.rank: r.log().split(" mapped ", 1)[1].split()[0] for r in run.ranks}


def test_each_rank_has_the_allocator_of_its_node_mapped(provisioned, tmp_path):
    cluster = provisioned[0]
    workload = tmp_path / "maps.py"
    workload.write_text(MAPS_WORKLOAD)
    # node-1 keeps the default (tcmalloc), node-2 asks for jemalloc.
    host_vars = tmp_path / "malloc.yml"
    host_vars.write_text("all:\n  hosts:\n    node-2: {launch_malloc: jemalloc}\n")
    mixed = torchfleet.Cluster([*cluster.inventory, host_vars], runs_dir=cluster.runs_dir, env=cluster.env,
                               progress=False)
    run = mixed.launch(Job(workload=workload, name="malloc", args=[]))
    assert run.ok
    assert _mapped(run) == {0: "libtcmalloc", 1: "libjemalloc"}

    run = cluster.launch(Job(workload=workload, name="malloc", args=[], extra_vars={"launch_malloc": "default"}))
    assert run.ok and _mapped(run) == {0: "none", 1: "none"}


def test_an_image_without_the_library_is_refused_before_any_rank_starts(provisioned):
    cluster = provisioned[0]
    image = "torchfleet/no-jemalloc:1"
    dockerfile = "FROM torchfleet/train:2.13.0-cpu\\nRUN rm -f /usr/lib/*/libjemalloc.so.2* && ldconfig\\n"
    for node in ("node-1", "node-2"):
        node_sh(node, f"printf '{dockerfile}' | docker build -q -t {image} - >/dev/null")
    try:
        with pytest.raises(TaskFailed) as info:
            cluster.launch(Job(name="no-jemalloc", args=[],
                               extra_vars={"launch_image": image, "launch_malloc": "jemalloc"}))
        error = info.value
        assert [f.variable for f in error.failures] == ["launch_malloc"]
        assert "hosts node-1, node-2" in error.message and "libjemalloc.so.2" in error.message
        assert "no rank was started" in error.message
        for node in ("node-1", "node-2"):
            assert node_sh(node, "docker ps -aq --filter label=torchfleet.job=no-jemalloc") == ""
        # The same image with glibc's malloc runs.
        assert cluster.plan(Job(name="no-jemalloc", args=[],
                                extra_vars={"launch_image": image, "launch_malloc": "default"})).ranks
    finally:
        for node in ("node-1", "node-2"):
            node_sh(node, f"docker rmi -f {image} >/dev/null 2>&1 || true")
