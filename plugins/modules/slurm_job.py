#!/usr/bin/python
"""Documentation only: the slurm_job action plugin does the work."""

from __future__ import annotations

DOCUMENTATION = r"""
module: slurm_job
short_description: Submit or cancel a run's Slurm job (launch_mode slurm)
description:
  - With I(state=tested), on the node that will submit, it asks Slurm whether it would take I(script)
    (C(sbatch --test-only), which creates no job and changes nothing), in the launch's check phase.
  - With I(state=submitted), on the node that submits (the master), it runs C(sbatch --parsable) on the run
    folder's sbatch script, records the job id in the run folder, and waits until Slurm has started the node's
    first unit (its step shell's files are there). A job that Slurm ends first, holds for a reason no wait
    cures, or does not start within I(timeout) is cancelled, and the task fails naming the variable to change.
  - Slurm's refusals (a partition that does not exist, more CPUs than a node has) fail the task naming the
    variable (torchfleet.slurm.sbatch_error), with Slurm's own line kept at the end.
  - With I(state=cancelled), it cancels the job whose id the run folder holds (C(scancel)), and waits up to
    I(timeout) until squeue no longer lists it. A run folder without a job id is left alone.
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin; it runs sbatch, squeue, sinfo and scancel on the node through M(ansible.builtin.command).
options:
  state:
    description: What to do.
    type: str
    choices: [tested, submitted, cancelled]
    required: true
  run_dir:
    description: The run's folder on the node, holding the sbatch script.
    type: path
    required: true
  script:
    description: For I(state=tested), the sbatch script itself (the launch spec's, as the start will write it).
    type: str
  spec:
    description: The run's launch spec (its units, the master host), for I(state=tested) and I(state=submitted).
    type: dict
  nodes:
    description: The launch spec's nodes, each with C(slurm_node), its Slurm node name, to name a host Slurm lacks.
    type: dict
    default: {}
  partition:
    description: The job's partition (launch_slurm_partition), to name it in an error.
    type: str
    default: ""
  timeout:
    description: Seconds to wait for the first unit to start, or for squeue to let go of a cancelled job.
    type: float
    default: 120
  poll_interval:
    description: Seconds between looks.
    type: float
    default: 1
"""

EXAMPLES = r"""
- name: Submit the run's job and wait until its first rank runs
  torchfleet.cluster.slurm_job:
    state: submitted
    run_dir: /var/lib/torchfleet/runs/mnist-20260101-120000
    spec: "{{ spec }}"
    partition: torchfleet
    timeout: 120

- name: Cancel it
  torchfleet.cluster.slurm_job:
    state: cancelled
    run_dir: /var/lib/torchfleet/runs/mnist-20260101-120000
"""

RETURN = r"""
job_id:
  description: The Slurm job's id, or null where the run folder holds none.
  returned: success
  type: str
  sample: "42"
listed:
  description: With I(state=cancelled), the job as squeue still lists it after I(timeout) (a frozen node's job stays COMPLETING), else empty.
  returned: with state=cancelled
  type: list
  elements: dict
"""
