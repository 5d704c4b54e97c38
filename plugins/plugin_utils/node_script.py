"""Run one of the scripts that a run's folder carries (run_vocab.SCRIPT_SOURCES) on a node,
in place of the module that shares its code.

Ansible's module wrapper imports its own module_utils from a zip, compiled afresh on every
run: 0.3 s of a node's CPU, against 0.05 s for the script, whose modules Python caches in
the run's folder. At 48 nodes on 2 cores that was most of a stop's time. The script answers
as the module would (JSON on stdout); where it does not answer (no such run folder there, or
one from before the script, no pipelining, no Python 3 to run it), the caller runs the module.
"""

import json
import posixpath
import shlex


def run(action, task_vars, run_dir, script, args):
    """``script``'s result for ``args`` from ``run_dir`` on the task's node, or None."""
    if not action._is_pipelining_enabled("new"):  # pylint: disable=protected-access
        return None
    facts = task_vars.get("ansible_facts") or {}
    python = action._templar.template(task_vars.get("ansible_python_interpreter")  # pylint: disable=protected-access
                                      or facts.get("discovered_interpreter_python") or "python3")
    if not python or str(python).startswith("auto"):
        python = "python3"
    # -E -s: the node's PYTHON* variables and user site have no say; the script's own folder
    # stays first on its import path.
    command = f"{shlex.quote(str(python))} -E -s {shlex.quote(posixpath.join(run_dir, script))}"
    ran = action._low_level_execute_command(command, sudoable=True, in_data=json.dumps(args))  # pylint: disable=protected-access
    try:
        answer = json.loads(ran.get("stdout") or "")
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None
