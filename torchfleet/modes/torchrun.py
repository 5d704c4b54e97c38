"""launch_mode torchrun: one torchrun agent per node (in a container or, with
launch_torchrun_runtime: process, in the node's Python), with static rendezvous."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from torchfleet import rank_logs
from torchfleet.modes import LaunchMode, register
from torchfleet.modes.context import PIN, NodeContext, pin_env, restarts
from torchfleet import run_vocab

# torchrun picks MASTER_PORT for its ranks itself (its store's port), so a plan cannot know it.
TORCHRUN_DECIDES = ("MASTER_PORT",)
# What a later attempt changes in the agent's command (launch_max_restarts).
ATTEMPT_ARGV = {"--nnodes": "num_nodes", "--node-rank": "node_rank", "--master-addr": "master_addr",
                "--master-port": "master_port"}


class Torchrun(LaunchMode):
    name = "torchrun"

    def runtime(self, job: Mapping[str, Any]) -> str:
        return str(job.get("torchrun_runtime") or "container")

    def chosen_by(self, job: Mapping[str, Any]) -> str:
        return f"launch_mode=torchrun with launch_torchrun_runtime={self.runtime(job)}"

    def pod_refusal(self, job: Mapping[str, Any]) -> tuple[str, str] | None:
        refusal = super().pod_refusal(job)
        return ("launch_torchrun_runtime", refusal[1]) if refusal else None

    def build(self, ctx: NodeContext) -> None:
        """One torchrun agent per node, static rendezvous on the master at MASTER_PORT: the
        node rank decides who hosts the store and which global ranks run where, so they are the
        plan's (c10d rendezvous ignores --node-rank and orders the nodes by address)."""
        workload = ctx.workload_argv()
        script = workload[1:]
        argv = [ctx.python, "-m", "torch.distributed.run", "--nnodes", str(ctx.table["num_nodes"]),
                "--nproc-per-node", str(len(ctx.rows)), "--node-rank", str(ctx.rows[0]["node_rank"]),
                "--rdzv-backend", "static", "--master-addr", str(ctx.table["master_addr"]),
                "--master-port", str(ctx.table["master_port"]), "--rdzv-id", ctx.run_id, "--max-restarts", "0",
                "--tee", "3"]
        # torchrun runs `python -u script` or `python -u -m module`; through the pin wrapper it
        # runs the command as given.
        if ctx.job.get("command"):
            argv += ["--no-python", "sh", "-c", PIN.format(local="$LOCAL_RANK"), "rank", *workload]
        elif ctx.pinning or restarts(ctx.job):
            # Through the wrapper, a later attempt's workers see its TORCHELASTIC_RESTART_COUNT,
            # where torchrun's own is always 0.
            argv += ["--no-python", "sh", "-c", PIN.format(local="$LOCAL_RANK"), "rank", ctx.python, "-u", *script]
        elif script[0] == "-m":
            argv += ["-m", *script[1:]]
        else:
            argv += script
        argv += ctx.args()
        # torchrun forces OMP_NUM_THREADS=1 for several ranks unless it is set.
        env = ctx.env()
        name = ctx.name("torchrun") if ctx.runtime == "container" else "torchrun"
        env.update(OMP_NUM_THREADS=str(ctx.threads[0]), NODE_RANK=str(ctx.rows[0]["node_rank"]),
                   TORCHFLEET_HEARTBEAT=ctx.heartbeat(name), **pin_env(ctx))
        # taskset pins each rank's CPUs; only a container can hold its memory to the ranks' nodes.
        mems = ",".join(sorted({m for i in range(len(ctx.rows)) if (m := ctx.mems(i))})) or None
        mems = mems if ctx.runtime == "container" else None
        ctx.unit(name=name, role="torchrun", phase=ctx.rank_phase(), argv=argv, env=env,
                 ranks=[int(r["rank"]) for r in ctx.rows],
                 cpuset=",".join(p["cpuset"] for p in ctx.pinning) if ctx.pinning else None, cpuset_mems=mems,
                 labels=ctx.labels("torchrun", ctx.rows[0]["rank"]), listen=ctx.master_listen(),
                 attempt={"env": {"NODE_RANK": "node_rank"}, "argv": ATTEMPT_ARGV})
        rank_argv = [ctx.python, "-u", *script] if not ctx.job.get("command") else workload
        for i, row in enumerate(ctx.rows):
            rank_env = ctx.rank_env(row, i)
            rank_env.update(pin_env(ctx), TORCHFLEET_HEARTBEAT=env["TORCHFLEET_HEARTBEAT"])
            ctx.rank(row, i, "torchrun", name, rank_argv + ctx.args(), rank_env, runner_env=TORCHRUN_DECIDES, mems=mems)

    def run_files(self, host: str, master: bool) -> list[tuple[str, str]]:
        return [(LOG, f"torchrun-{host}.log")]

    def finals(self, spec: Mapping[str, Any], run_dir: Path, finals: list[dict[str, Any]],
               reason: str | None) -> tuple[list[dict[str, Any]], str | None]:
        """Each node's torchrun output holds its ranks' lines and failures."""
        by_first_rank = {int(f["rank"]): f for f in finals if f.get("role") == "torchrun"}
        per_rank = []
        for host in dict.fromkeys(r["host"] for r in spec["ranks"]):
            ranks = [r["rank"] for r in sorted(spec["ranks"], key=lambda r: r["rank"]) if r["host"] == host]
            path = run_dir / f"torchrun-{host}.log"
            log = path.read_text(errors="replace") if path.is_file() else ""
            for local, text in split_log(log, len(ranks)).items():
                (run_dir / run_vocab.rank_log(ranks[local])).write_text(text)
            per_rank += node_finals(by_first_rank.get(ranks[0], {}), log, ranks)
        return per_rank, reason


# torchrun's output on a node (--tee 3), which collect brings back as torchrun-HOST.log.
LOG = "torchrun.log"
# torchrun --tee 3: "[default0]:text", the role name and the local rank.
TAG_RE = re.compile(r"^\[[A-Za-z_]+?(?P<local>\d+)\]:(?P<text>.*)$")
# torchrun's failure report: "rank : 3 (local_rank: 1)" then "exitcode : -9 (pid: 123)".
FAIL_RE = re.compile(r"local_rank:\s*(?P<local>\d+)\)\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)")


def split_log(log: str, local_ranks: int) -> dict[int, str]:
    """Each local rank's lines of one node's torchrun output."""
    ranks: dict[int, list[str]] = {r: [] for r in range(local_ranks)}
    for line in log.splitlines():
        match = TAG_RE.match(line)
        if match and int(match["local"]) in ranks:
            ranks[int(match["local"])].append(match["text"])
    return {r: "\n".join(lines) + ("\n" if lines else "") for r, lines in ranks.items()}


def node_finals(node: Mapping[str, Any], log: str, ranks: list[int]) -> list[dict[str, Any]]:
    """Per-rank final states of one node from its torchrun's exit and failure report.

    ``ranks`` are the node's global ranks by local rank. A signal shows as a negative
    exit code in torchrun's report; it becomes 128 + signal, as a shell reports it.
    """
    failed: dict[int, int] = {}
    if not node.get("stopped_by_torchfleet"):
        for match in FAIL_RE.finditer(log):
            code = int(match["code"])
            failed.setdefault(int(match["local"]), 128 - code if code < 0 else code)
    return rank_logs.launcher_finals(node, ranks, failed, others_stopped=bool(node))


register(Torchrun())
