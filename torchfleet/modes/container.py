"""launch_mode container: one container per rank, the master node's first."""

from __future__ import annotations


from torchfleet.modes import LaunchMode, register
from torchfleet.modes.context import NodeContext
from torchfleet import run_vocab


# What a later attempt renumbers (launch_max_restarts): the rank's variables.
ATTEMPT_ENV = {"RANK": "rank", "WORLD_SIZE": "world_size", "MASTER_ADDR": "master_addr",
               "MASTER_PORT": "master_port", "NODE_RANK": "node_rank"}


class PerRank(LaunchMode):
    """One unit per rank, each started with the rank's own variables."""

    name = "container"

    def build(self, ctx: NodeContext) -> None:
        argv = ctx.workload_argv() + ctx.args()
        container = ctx.runtime == "container"
        for i, row in enumerate(ctx.rows):
            env = ctx.rank_env(row, i)
            name = ctx.name(f"rank{row['rank']}") if container else run_vocab.rank_unit(row["rank"])
            env["TORCHFLEET_HEARTBEAT"] = ctx.heartbeat(name)
            mems = ctx.mems(i) if container else None
            ctx.unit(name=name, role="rank", phase=ctx.rank_phase(), argv=argv, env=env,
                     ranks=[int(row["rank"])], cpuset=ctx.cpuset(i), cpuset_mems=mems,
                     labels=ctx.labels("rank", row["rank"]), listen=ctx.master_listen() if i == 0 else None,
                     attempt={"env": ATTEMPT_ENV})
            ctx.rank(row, i, self.name, name, argv, env, mems=mems)


register(PerRank())
