"""A run's Slurm job (launch_mode slurm), on the node that submits it: ask Slurm whether it
would take the spec's sbatch script (sbatch --test-only, which changes nothing: the check
phase), submit the run folder's script and wait until Slurm starts its first steps there, or
cancel it. Slurm's refusals become torchfleet errors naming the variable
(torchfleet.slurm.sbatch_error)."""

import time

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab
from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import slurm
from torchfleet.errors import InventoryError

ARGS = {
    "state": {"type": "str", "choices": ["tested", "submitted", "cancelled"], "required": True},
    "run_dir": {"type": "path", "required": True},
    "script": {"type": "str"},
    "spec": {"type": "dict"},
    "nodes": {"type": "dict", "default": {}},
    "partition": {"type": "str", "default": ""},
    "timeout": {"type": "float", "default": 120},
    "poll_interval": {"type": "float", "default": 1},
}
# Submits the script from the run folder and records the job id beside it ("N;cluster" with
# a federation: the id is N).
SUBMIT = ('cd "$1" || exit 2; out=$(sbatch --parsable "$2") || exit $?; id="${out%%;*}"; '
          'echo "$id" >"$3.tmp" && mv "$3.tmp" "$3" && echo "$id"')
# One look per poll: "started" once the node's first unit has left its files, else squeue's line.
LOOK = 'if [ -e "$1" ]; then echo started; else shift; exec "$@"; fi'


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        self._vars = task_vars
        if args["state"] == "cancelled":
            return dict(result, **self._cancel(args))
        if not args["spec"]:
            return dict(result, failed=True, msg=f"slurm_job: state={args['state']} needs spec")
        try:
            if args["state"] == "tested":
                return dict(result, changed=False, said=self._test(args))
            job_id = self._submit(args)
            self._wait_started(args, job_id)
        except InventoryError as exc:
            return core.fail_input(result, exc)
        return dict(result, changed=True, job_id=job_id)

    def _sh(self, script, *words):
        return self._execute_module(module_name="ansible.builtin.command",
                                    module_args={"argv": ["sh", "-c", script, "sh", *words]}, task_vars=self._vars)

    def _test(self, args):
        """sbatch --test-only on the script (it reads it from stdin): Slurm checks the request
        against its partitions and nodes and says when it would start, creating no job."""
        if not args["script"]:
            raise InventoryError("slurm_job: state=tested needs script", None, "launch_mode")
        done = self._execute_module(module_name="ansible.builtin.command",
                                    module_args={"argv": ["sbatch", "--test-only"], "stdin": args["script"]},
                                    task_vars=self._vars)
        if done.get("rc") != 0:
            self._refused(args, done)
        return (done.get("stderr") or "").strip()

    def _refused(self, args, done):
        if "No such file" in str(done.get("msg") or ""):
            host = self._vars.get("inventory_hostname")
            raise InventoryError(f"launch_mode=slurm but sbatch is not on {host} ({done['msg']}); run site.yml with "
                                 "slurm_enabled: true (the slurm role)", host, "launch_mode")
        known = self._sh('exec sinfo -h -N -o %N')
        raise slurm.sbatch_error(done.get("stderr") or done.get("msg") or "", partition=args["partition"],
                                 spec=args["spec"], hostnames=self._hostnames(args),
                                 known=known.get("stdout_lines") if known.get("rc") == 0 else None)

    def _submit(self, args):
        done = self._sh(SUBMIT, args["run_dir"], run_vocab.SBATCH_SCRIPT, run_vocab.SLURM_JOB_ID)
        if done.get("rc") != 0:
            self._refused(args, done)
        return done["stdout"].strip()

    def _hostnames(self, args):
        return {h: n["slurm_node"] for h, n in (args["nodes"] or {}).items() if n.get("slurm_node")}

    def _wait_started(self, args, job_id):
        """Until the node's first unit has started (its step shell's files are there): a job
        that Slurm ends first, or holds for a reason no wait cures, or that does not start
        within the timeout, is cancelled and fails the start, saying why."""
        spec = args["spec"]
        first = next(u for u in spec["units"] if u["host"] == spec["master_host"])
        meta = run_vocab.process_file(f"{args['run_dir']}/{first['name']}", run_vocab.ProcessFile.META)
        deadline = time.monotonic() + args["timeout"]
        job = {}
        while True:
            look = self._sh(LOOK, meta, *slurm.squeue_command(job_id))
            if look.get("stdout", "").strip() == "started":
                return
            job = next(iter(slurm.parse_squeue(look.get("stdout", ""))), job)
            ended = job.get("state") not in (None, run_vocab.RunState.RUNNING.value)
            hopeless = job.get("reason") in slurm.HOPELESS_REASONS
            if ended or hopeless or time.monotonic() > deadline:
                break
            time.sleep(args["poll_interval"])
        self._cancel(args)
        batch = self._sh('tail -n 20 "$1" 2>/dev/null', f"{args['run_dir']}/{run_vocab.SBATCH_LOG}")
        said = f"{job.get('text', 'not in squeue')}\n{batch.get('stdout', '')}"
        if "error" in said.lower():
            raise slurm.sbatch_error(said, partition=args["partition"], spec=spec, hostnames=self._hostnames(args))
        raise InventoryError(f"Slurm job {job_id} did not start {first['name']} on {first['host']} within "
                             f"{args['timeout']:g} s: {said.strip()}", first["host"], "launch_master_wait_timeout")

    def _cancel(self, args):
        """scancel the run's job, if it has one, and wait until squeue no longer lists it."""
        read = self._sh('cat "$1" 2>/dev/null || true', f"{args['run_dir']}/{run_vocab.SLURM_JOB_ID}")
        job_id = read.get("stdout", "").strip()
        if not job_id:
            return {"changed": False, "job_id": None, "listed": []}
        listed = self._listed(job_id)
        if listed:
            self._sh('exec scancel "$1"', job_id)
        deadline = time.monotonic() + args["timeout"]
        left = listed
        while left and time.monotonic() < deadline:
            time.sleep(args["poll_interval"])
            left = self._listed(job_id)
        return {"changed": bool(listed), "job_id": job_id, "listed": left}

    def _listed(self, job_id):
        """The job as squeue lists it among the jobs that hold nodes (pending, running,
        completing), or []: squeue forgets a job MinJobAge after it ended."""
        look = self._sh('squeue --noheader --jobs="$1" --format="$2" 2>/dev/null || true', job_id,
                        slurm.SQUEUE_FORMAT)
        return slurm.parse_squeue(look.get("stdout", ""))
