#!/usr/bin/python
"""Documentation only: the scheduler_job action plugin does the work."""

from __future__ import annotations

DOCUMENTATION = r"""
module: scheduler_job
short_description: A run's job on the scheduler that runs its units (launch_mode slurm)
description:
  - For a launch mode whose units a batch scheduler runs (a mode with a C(Scheduler), unit kind C(scheduler); today
    C(launch_mode=slurm)), on the node that submits the run's job (its master). The mode's scheduler does each step
    (torchfleet.modes); the task gives it a shell on the node.
  - With I(state=tested), it asks the scheduler whether it would take the job of I(spec), creating nothing (Slurm's
    C(sbatch --test-only)), in the launch's check.
  - With I(state=submitted), it submits the job from the run folder I(run_dir), records its id there, and waits until
    the scheduler has started the master's first unit. A job that ends first, is held for a reason no wait cures, or
    does not start within I(timeout) is cancelled, and the task fails naming the variable to change. With I(listen),
    it then waits until the master's unit that others start after listens (a detached launch).
  - With I(state=described), it returns the job as the scheduler lists it.
  - With I(state=cancelled), it cancels the job whose id the run folder holds, and waits up to I(timeout) until the
    scheduler no longer lists it. A run folder without a job id is left alone.
  - The scheduler's refusals (a partition that does not exist, more CPUs than a node has) fail the task naming the
    variable, with the scheduler's own line kept at the end.
author: torchfleet developers (!UNKNOWN)
notes:
  - An action plugin; it runs the scheduler's commands (sbatch, squeue, sinfo, scancel) on the node through
    M(ansible.builtin.command).
options:
  state:
    description: What to do.
    type: str
    choices: [tested, submitted, described, cancelled]
    required: true
  run_dir:
    description: The run's folder on the node; the job's script and id are there.
    type: path
    required: true
  spec:
    description: The run's launch spec, for I(state=tested) and I(state=submitted); its C(mode) names the scheduler.
    type: dict
  mode:
    description: The run's launch mode, where no I(spec) is given.
    type: str
  nodes:
    description: The launch spec's nodes (their settings, and what the mode read of each, such as its Slurm node name).
    type: dict
    default: {}
  timeout:
    description: Seconds to wait for the first unit to start (and listen), or for the scheduler to let go of a cancelled job.
    type: float
    default: 120
  listen:
    description: With I(state=submitted), also wait until the master's unit that others start after listens.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Submit the run's job and wait until its first rank runs
  torchfleet.cluster.scheduler_job:
    state: submitted
    run_dir: /var/lib/torchfleet/runs/mnist-20260101-120000
    spec: "{{ spec }}"
    nodes: "{{ nodes }}"
    timeout: 120

- name: Cancel it
  torchfleet.cluster.scheduler_job:
    state: cancelled
    run_dir: /var/lib/torchfleet/runs/mnist-20260101-120000
    mode: slurm
"""

RETURN = r"""
job_id:
  description: The job's id, or null where the run folder holds none.
  returned: success
  type: str
  sample: "42"
said:
  description: With I(state=tested), what the scheduler said of the job (when it would start).
  returned: with state=tested
  type: str
job:
  description: With I(state=described), the job (C(job_id), C(state), a run state, and C(text)), or null.
  returned: with state=described
  type: dict
listed:
  description: With I(state=cancelled), the job as the scheduler still lists it after I(timeout), else empty.
  returned: with state=cancelled
  type: list
  elements: dict
listen:
  description: With I(state=submitted) and I(listen), how the wait for the master's listen ended (C(outcome), C(reason)).
  returned: with listen
  type: dict
"""
