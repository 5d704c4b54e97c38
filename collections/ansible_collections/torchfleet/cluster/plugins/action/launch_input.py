"""Check a node's launch input, keep what the launch spec needs of it, and read the node, in one task."""

import os

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import cpus, spec
from torchfleet.errors import InventoryError

DOCUMENTATION = r"""
module: launch_input
short_description: Check a node's launch input, keep its settings as the fact launch__input, and probe the node
description:
  - Checks the host's launch variables against the launch role's argument spec (I(role)),
    as Ansible's own check of a role's arguments would. The playbooks that run this task
    include the role with C(rolespec_validate=false): that check is a task of its own on
    every node, and cost a launch at 48 nodes about 0.1 s of controller CPU per node.
  - Reads the host's launch variables itself (torchfleet.spec.INPUT_VARIABLES) and checks
    what argument_specs cannot; the numbers' ranges and the names of the secret
    environment. A failure returns C(torchfleet_error) with the host and the variable,
    every failure in one message.
  - Reads the host's cpu_pinning variables too, with the cpu_pinning role's own defaults and
    argument spec (I(pinning_role)); the launch plans the pinning from node_probe's reading
    (torchfleet.cpus.plan) rather than running that role's tasks on every node.
  - Sets the fact C(launch__input) (settings, env_public, env_shown, has_secrets, pinning),
    which launch_spec reads through hostvars. Secret values never enter it.
  - The checks and settings are Python, not Jinja; Ansible compiles every expression again
    in every node's worker, which made this the launch's costliest task per node.
  - Once the input passed, runs node_probe on the node with I(probe), adding what the input
    decides, which is the paths the ranks need (torchfleet.spec.node_paths), whether to read the CPU
    topology (pinning), and whether to gather the addresses (not yet in the node's facts);
    under launch_mode mpirun also the SSH mesh's files and the node's account of its uid.
    One task instead of two, since each task costs the controller a process per node. A node
    whose input fails is not probed.
  - Returns node_probe's result, with C(launch__input) added to its facts.
options:
  role:
    description: The launch role's folder (its argument spec, entry point C(main)).
    type: path
    required: true
  pinning_role:
    description: The cpu_pinning role's folder (its defaults and argument spec).
    type: path
    required: true
  probe:
    description: node_probe's other arguments (python, ports, run_root, job, checksum).
    type: dict
    required: true
"""

ARGS = {"role": {"type": "path", "required": True}, "pinning_role": {"type": "path", "required": True}, "probe": {"type": "dict", "required": True}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        host = task_vars["inventory_hostname"]
        options = core.role_spec_options(args["role"])
        # One templating of both sets: each costs the worker a compile per expression.
        names = set(options) | set(spec.INPUT_VARIABLES)
        values = self._templar.template({n: task_vars[n] for n in names if n in task_vars})
        try:
            core.check_role_types(options, values, host, "the launch role's arguments: ")
            checked = spec.node_input(values, host)
            checked["pinning"] = self._pinning(args["pinning_role"], task_vars, host)
        except InventoryError as exc:
            return core.fail_input(result, exc)
        paths = [p["path"] for p in spec.node_paths(checked["settings"])]
        probe = dict(args["probe"], facts="ansible_all_ipv4_addresses" not in task_vars,
                     topology=checked["pinning"]["enabled"], paths=paths)
        if values.get("launch_mode") == "mpirun":
            # The mesh's files, and the node's account of the mesh's uid (spec.mesh_checks).
            probe.update(paths=paths + list(spec.mesh_paths(checked["settings"]).values()),
                         uid=checked["settings"]["ssh_uid"])
        result.update(self._execute_module("torchfleet.cluster.node_probe", module_args=probe, task_vars=task_vars))
        if not result.get("failed"):
            result["ansible_facts"] = dict(result.get("ansible_facts") or {}, launch__input=checked)
        return result

    def _pinning(self, role, task_vars, host):
        """The host's cpu_pinning settings: its own variables, else the role's defaults
        (templated with the host's variables, as the role would), type-checked against the
        role's argument spec."""
        defaults = self._loader.load_from_file(os.path.join(role, "defaults", "main.yml"), trusted_as_template=True)
        options = {n: o for n, o in core.role_spec_options(role).items() if n in cpus.PINNING_VARIABLES}
        raw = {n: task_vars[n] if n in task_vars else defaults[n] for n in options}
        return cpus.settings(core.check_role_types(options, self._templar.template(raw), host), host)

