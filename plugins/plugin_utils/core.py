"""The controller-side plugins need the torchfleet package in the Python that runs Ansible.

./scripts/bootstrap.sh installs it into .venv. Any other ansible-playbook fails here with a
message that says what to do, rather than a bare ImportError in some plugin.
"""

import os
import re
import sys

try:
    import torchfleet  # noqa: F401  # pylint: disable=unused-import
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


def role_spec_options(role):
    """A role's argument spec (entry point main), as plain data: Ansible's loader tags every
    value with its origin, which cost each node's worker 30 ms for the launch role's spec."""
    import yaml

    with open(os.path.join(role, "meta", "argument_specs.yml")) as fh:
        return yaml.load(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))["argument_specs"]["main"]["options"]


def check_role_types(options, values, host, prefix=""):
    """``values`` checked against an argument spec as Ansible's validate_argument_spec does,
    and converted; every error in one message, the first variable it names as the variable."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    from torchfleet.errors import InventoryError

    checked = ArgumentSpecValidator(options).validate({n: values[n] for n in options if n in values})
    if not checked.error_messages:
        return checked.validated_parameters
    message = "; ".join(checked.error_messages)
    named = [(m.start(), n) for n in options for m in [re.search(rf"(?<!\w){re.escape(n)}(?!\w)", message)] if m]
    raise InventoryError(prefix + message, host, min(named)[1] if named else None)


def check_role_arguments(action, task_vars, role):
    """The host's variables checked against ``role``'s argument spec, as Ansible's own check
    of a role's arguments would, in a task that runs anyway: that check is a task of its own
    on every node (49 ms of controller CPU per node in a stop at 48 nodes). None, or the
    failed result."""
    from torchfleet.errors import InventoryError

    options = role_spec_options(role)
    values = action._templar.template({n: task_vars[n] for n in options if n in task_vars})
    try:
        check_role_types(options, values, task_vars["inventory_hostname"],
                         f"the {os.path.basename(os.path.normpath(role))} role's arguments: ")
    except InventoryError as exc:
        return fail_input({}, exc)
    return None
