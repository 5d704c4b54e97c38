"""Read the image ID and tags of a `docker save` archive on the controller."""

from ansible.plugins.action import ActionBase

from ansible_collections.torchfleet.cluster.plugins.plugin_utils import core

from ansible_collections.community.docker.plugins.module_utils.image_archive import (
    ImageArchiveInvalidException,
    api_image_id,
    archived_image_manifest,
)

ARGS = {"path": {"type": "path", "required": True}}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        path = core.validate_args(self, ARGS)["path"]
        try:
            manifest = archived_image_manifest(path) if path else None
        except ImageArchiveInvalidException as exc:
            result.update(failed=True, msg=f"image_archive {path} is not a docker save archive: {exc}")
            return result
        if manifest is None:
            result.update(failed=True, msg=f"image_archive {path!r} does not exist on the controller")
            return result
        # Newer engines write "blobs/sha256/<id>" rather than "<id>.json" as the config name.
        image_id = manifest.image_id.rsplit("/", 1)[-1]
        result.update(changed=False, image_id=api_image_id(image_id), repo_tags=manifest.repo_tags)
        return result
