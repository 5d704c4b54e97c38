"""Load a `docker save` archive from the controller into a node's engine, in one task.

The archive is streamed by the connection into the task's temporary folder on the node (the
image role points ansible_remote_tmp at image_remote_tmp for this task), then
community.docker.docker_image_load loads it, and the folder goes whatever happened. Nothing
hashes it: ansible.builtin.copy hashes the whole archive on the controller for every node,
and again on the node (of the 17 s of CPU that copying 1.3 GB to one node took here, about
6 s), while the engine checks each layer's digest as it loads, and the image role then tags
the archive's image ID, which fails where the load did not bring it.
"""

import os

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core

ARGS = {
    # str, not path: a path option expands ~ on the controller, which is wrong for on_node.
    "src": {"type": "str", "required": True},
    "on_node": {"type": "bool", "default": False},
    "timeout": {"type": "int", "default": 600},
}


# The archive's name in the task's temporary folder on the node, where it is sent and loaded from.
STAGED_AS = "image.tar"


class ActionModule(ActionBase):
    TRANSFERS_FILES = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = core.validate_args(self, ARGS)
        if args["timeout"] < 1:
            return dict(result, failed=True, msg=f"timeout={args['timeout']} must be 1 or more (seconds)")
        if self._task.check_mode:
            return dict(result, changed=True, msg="the archive would be sent and loaded")
        sources = {} if args["on_node"] else {STAGED_AS: os.path.expanduser(args["src"])}
        loaded = core.run_with_files(
            self, task_vars, sources, "community.docker.docker_image_load",
            lambda staged: {"path": args["src"] if args["on_node"] else self._connection._shell.join_path(staged, STAGED_AS),
                            "timeout": args["timeout"]})
        if loaded.get("failed"):
            loaded["msg"] = f"loading image_archive {args['src']} into the node's engine failed: {loaded.get('msg')}"
        return dict(result, **loaded)
