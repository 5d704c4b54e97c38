"""Load a `docker save` archive from the controller into a node's engine, in one task.

The archive is streamed by the connection into the task's temporary folder on the node, then
community.docker.docker_image_load loads it, and the folder goes whatever happened. Nothing
hashes it: ansible.builtin.copy hashes the whole archive on the controller for every node,
and again on the node (of the 17 s of CPU that copying 1.3 GB to one node took here, about
6 s), while the engine checks each layer's digest as it loads, and the image role then tags
the archive's image ID, which fails where the load did not bring it.
"""

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core

DOCUMENTATION = r"""
module: image_archive_load
short_description: Stream a docker save archive from the controller into a node's engine and load it
options:
  src: {description: The archive on the controller., type: path, required: true}
  on_node:
    description: The archive is already at I(src) on the node (shared storage); nothing is sent.
    type: bool
    default: false
  timeout: {description: Seconds the engine may take to load it., type: int, default: 600}
"""

ARGS = {
    "src": {"type": "path", "required": True},
    "on_node": {"type": "bool", "default": False},
    "timeout": {"type": "int", "default": 600},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        if args["timeout"] < 1:
            return dict(result, failed=True, msg=f"timeout={args['timeout']} must be 1 or more (seconds)")
        if self._task.check_mode:
            return dict(result, changed=True, msg="the archive would be sent and loaded")
        path = args["src"]
        try:
            if not args["on_node"]:
                path = self._connection._shell.join_path(self._connection._shell.tmpdir, "image.tar")
                self._transfer_file(args["src"], path)
                self._fixup_perms2((self._connection._shell.tmpdir, path))
            loaded = self._execute_module(
                module_name="community.docker.docker_image_load",
                module_args={"path": path, "timeout": args["timeout"]},
                task_vars=task_vars)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        if loaded.get("failed"):
            loaded["msg"] = f"loading image_archive {args['src']} into the node's engine failed: {loaded.get('msg')}"
        return dict(result, **loaded)
