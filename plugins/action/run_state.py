"""run_state, with the job's workload sent in the same task when a start asks for it, and one
run's read, stop or wait answered by the run folder's own script (run_vocab.READ_SOURCE)."""

import posixpath

from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.torchfleet.cluster.plugins.module_utils import run_read
from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
from ansible_collections.torchfleet.cluster.plugins.module_utils.run_folder import RUN_STATE_ARGS
from ansible_collections.torchfleet.cluster.plugins.plugin_utils import node_script
from ansible_collections.torchfleet.cluster.plugins.plugin_utils.workload_send import WorkloadSendingAction

# The module's options that a read of one run takes: the run folder's script's, and where the run is.
ONE_RUN = {k: v for k, v in RUN_STATE_ARGS.items() if k in run_read.OPTIONS | {"node_dir", "run_id"}}


class ActionModule(WorkloadSendingAction):
    MODULE = "torchfleet.cluster.run_state"

    def _answer_on_node(self, args, task_vars):
        """One run's read, stop or wait, from the run's folder itself: a status and a stop ask
        the master this first, and a follow asks it once per progress line. Anything else, or
        arguments the module would refuse, goes to the module."""
        if not args.get("run_id") or args.get("state", "info") not in ("info", "stopped") or self._task.check_mode:
            return None
        if set(args) - set(ONE_RUN):
            return None
        checked = ArgumentSpecValidator(ONE_RUN).validate(args)
        if checked.error_messages:
            return None
        given = dict(checked.validated_parameters)
        run_dir = posixpath.join(given.pop("node_dir"), "runs", given.pop("run_id"))
        return node_script.run(self, task_vars, run_dir, vocab.READ_SOURCE, dict(given, run_dir=run_dir))
