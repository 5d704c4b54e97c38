"""The controller-side plugins need the torchfleet package in the Python that runs Ansible.

./scripts/bootstrap.sh installs it into .venv. Any other ansible-playbook fails here with a
message that says what to do, rather than a bare ImportError in some plugin.
"""

import sys

try:
    import torchfleet  # noqa: F401
except ImportError as exc:
    from ansible.errors import AnsibleError

    raise AnsibleError(
        f"the torchfleet package is not installed in the Python that runs Ansible ({sys.executable}): "
        "run ./scripts/bootstrap.sh and use .venv/bin/ansible-playbook (or source .venv/bin/activate), "
        "or `pip install -e .` from the checkout into that Python"
    ) from exc


def fail_input(result, exc, kind="input"):
    """Fail a task on bad input, with the host and the variable as data: the API and the CLI
    classify a failure by ``torchfleet_error``, never by which task or file failed. ``kind``
    is ``input``, or ``running`` for a launch refused because its job still runs."""
    result.update(failed=True, msg=str(exc),
                  torchfleet_error={"kind": kind, "host": getattr(exc, "host", None),
                                    "variable": getattr(exc, "variable", None)})
    return result


def validate_args(action, spec):
    """The task's arguments checked against ``spec`` (an argument_spec dict), or an error."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    validated = ArgumentSpecValidator(spec).validate(action._task.args)
    if validated.error_messages:
        from ansible.errors import AnsibleActionFail

        raise AnsibleActionFail(f"{action._task.action}: " + "; ".join(validated.error_messages))
    return validated.validated_parameters


def run_with_files(action, task_vars, sources, module, module_args):
    """Stream ``sources`` ({name: path on the controller}) into the task's temporary folder on
    the node, run ``module`` with ``module_args(folder)``, and remove the folder whatever
    happened. For actions with TRANSFERS_FILES, whose run made the folder: one task sends
    and applies, with nothing hashed on the way (the callers say why that is safe)."""
    shell = action._connection._shell
    staged = shell.tmpdir
    try:
        paths = [shell.join_path(staged, name) for name in sources]
        for path, src in zip(paths, sources.values()):
            action._transfer_file(src, path)
        if paths:
            action._fixup_perms2([staged] + paths)
        return action._execute_module(module_name=module, module_args=module_args(staged), task_vars=task_vars)
    finally:
        action._remove_tmp_path(staged)
