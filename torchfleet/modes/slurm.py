"""launch_mode slurm: one sbatch job whose srun steps are the ranks, each a bare process in
the node's own Python (launch_python) under its guard, as in the process mode.

The launch role starts the ``scheduler`` kind (start_units_scheduler.yml): every node's run
folder first, then the master submits the spec's sbatch script (torchfleet.slurm), which
starts the master's ranks, waits until they listen, then starts the others. The guards
supervise the run as in every mode; Slurm only places and runs the steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from torchfleet import slurm
from torchfleet.modes import Unsupported, refuse_restarts, register
from torchfleet.modes.process import Process
from torchfleet import run_vocab


class Slurm(Process):
    name = "slurm"
    SETTINGS = {"slurm_partition": ("launch_slurm_partition", str)}
    # The steps' shells read the secret environment from the run folder: srun passes no
    # value that is not on the script's command lines.
    secret_env_file = True

    def unit_kind(self, job: Mapping[str, Any]) -> str:
        return "scheduler"

    def unsupported(self, job: Mapping[str, Any]) -> tuple[Unsupported, ...]:
        why = "the job's allocation is Slurm's: requeue it with sbatch --requeue instead"
        return super().unsupported(job) + (refuse_restarts(job, why),)

    def node_facts(self, host: str, table: Mapping[str, Any], probe: Mapping[str, Any]) -> dict[str, Any]:
        # slurm.conf names each node by its short hostname (the slurm role's NodeName).
        return {"slurm_node": str(probe.get("hostname") or host)}

    def spec_files(self, spec: Mapping[str, Any], nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, str]]:
        """The whole job as one sbatch script, in the master's run folder, where its start
        submits it; the same file runs unchanged by hand with ``sbatch``."""
        master = spec["master_host"]
        partition = (nodes[master].get("settings") or {}).get("slurm_partition") or ""
        hostnames = {h: str(n["slurm_node"]) for h, n in nodes.items() if n.get("slurm_node")}
        return {master: {run_vocab.SBATCH_SCRIPT: slurm.sbatch_script(spec, partition=partition, hostnames=hostnames)}}

    def run_files(self, host: str, master: bool) -> list[tuple[str, str]]:
        if not master:
            return []
        return [(name, name) for name in (run_vocab.SBATCH_SCRIPT, run_vocab.SLURM_JOB_ID, run_vocab.SBATCH_LOG)]

    def summary(self, run_dir: Path) -> dict[str, Any]:
        path = Path(run_dir) / run_vocab.SLURM_JOB_ID
        return {"slurm_job_id": path.read_text().strip() if path.is_file() else None}


register(Slurm())
