"""Check a node's launch input, keep what the launch spec needs of it, and read the node, in one task."""

import os

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core
from torchfleet import cpus, inputs, settings
from torchfleet.errors import InventoryError

ARGS = {"role": {"type": "path", "required": True}, "pinning_role": {"type": "path", "required": True},
        "probe": {"type": "dict", "required": True}, "image": {"type": "dict"}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        host = task_vars["inventory_hostname"]
        options = core.role_spec_options(args["role"])
        # One templating of both sets: each costs the worker a compile per expression.
        names = set(options) | set(inputs.input_variables())
        values = self._templar.template({n: task_vars[n] for n in names if n in task_vars})
        try:
            core.check_role_types(options, values, host, "the launch role's arguments: ")
            checked = inputs.node_input(values, host)
            checked["pinning"] = self._pinning(args["pinning_role"], task_vars, host)
        except InventoryError as exc:
            return core.fail_input(result, exc)
        paths = [p["path"] for p in settings.node_paths(checked["settings"])]
        probe = dict(args["probe"], facts="ansible_all_ipv4_addresses" not in task_vars,
                     topology=checked["pinning"]["enabled"], paths=paths)
        checked["malloc_libraries"] = [lib for lib in [settings.malloc_library(checked["settings"].get("malloc"))] if lib]
        if checked["bare"]:
            # A container launch asks the image instead (rank_containers' image_libraries).
            probe["libraries"] = checked["malloc_libraries"]
        # What the launch mode reads on the node besides (LaunchMode.probe).
        needs = checked["mode_probe"]
        probe["paths"] = paths + list(needs.get("paths") or [])
        if needs.get("uid") is not None:
            probe["uid"] = needs["uid"]
        image = args["image"]
        if not checked["bare"] and image:
            # Container units: the image and the job's containers, in the same module run
            # (the image's account of a uid where the launch mode asks, mpirun's mesh's, and
            # the library launch_malloc preloads: each asked once per image ID, then kept on
            # the node, except by a plan, which changes nothing).
            probe["containers"] = dict(image, labels={"torchfleet.job": args["probe"].get("job")},
                                       image_uid=needs.get("image_uid"), image_libraries=checked["malloc_libraries"])
        result.update(self._execute_module("torchfleet.cluster.node_probe", module_args=probe, task_vars=task_vars))
        if result.get("failed"):
            return result
        facts = dict(result.get("ansible_facts") or {}, launch__input=checked)
        if "containers" in probe:
            found = result.pop("containers")
            # A plan may come before site.yml, on a node with no engine yet: there it is reported.
            if found.get("failed") and image.get("keep_answer", True):
                return dict(result, failed=True, msg=found["msg"])
            facts["launch__job_containers"] = found
        result["ansible_facts"] = facts
        return result

    def _pinning(self, role, task_vars, host):
        """The host's cpu_pinning settings: its own variables, else the role's defaults
        (templated with the host's variables, as the role would), type-checked against the
        role's argument spec."""
        defaults = self._loader.load_from_file(os.path.join(role, "defaults", "main.yml"), trusted_as_template=True)
        options = {n: o for n, o in core.role_spec_options(role).items() if n in cpus.PINNING_VARIABLES}
        raw = {n: task_vars[n] if n in task_vars else defaults[n] for n in options}
        return cpus.settings(core.check_role_types(options, self._templar.template(raw), host), host)
