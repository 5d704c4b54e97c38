"""Node-side script: run_state's answer for one run (run_folder.one_run), from the run's own
folder, which carries this file with its modules (run_vocab.SCRIPT_SOURCES).

A status or a stop asks the run's master first, and the follow of an attached run asks it
once per progress line: run_state's action runs this script there (plugin_utils.node_script)
rather than the module, whose wrapper costs the node six times the read itself. Options as
JSON on stdin, the answer as JSON on stdout; one that does not know an option it is given
(an older run's copy) answers nothing, and the action runs the module.
"""

from __future__ import annotations

import inspect
import json
import sys

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils.run_folder import one_run
except ImportError:  # on a node: run as a script from the run's folder, where its modules lie beside it
    from run_folder import one_run

# one_run's own parameters, but the check mode that only the module has.
OPTIONS = set(inspect.signature(one_run).parameters) - {"check"}


def main():
    given = json.load(sys.stdin)
    if set(given) - OPTIONS:
        sys.exit(3)
    try:
        answer = one_run(**given)
    except Exception as exc:  # pylint: disable=broad-except  # any error is the task's, with its words
        answer = {"failed": True, "msg": f"{type(exc).__name__}: {exc}"}
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
