"""Every action validates its arguments before it does anything: job_report, rank_plan,
wait_ranks and image_archive_info did not (issue 39), and a wrong type reached their code."""

from types import SimpleNamespace

import pytest
from ansible.errors import AnsibleActionFail
from ansible.playbook.play_context import PlayContext
from ansible.playbook.task import Task

from ansible_collections.torchfleet.cluster.plugins.action import image_archive_info, job_report, rank_plan, wait_ranks


def run(module, args):
    task = Task()
    task.args = args
    action = module.ActionModule(task, SimpleNamespace(_shell=SimpleNamespace(tmpdir="/tmp")), PlayContext(),
                                 None, None, None)
    action._execute_module = lambda **kwargs: pytest.fail("ran a module with arguments it should have refused")
    return action.run(task_vars={"inventory_hostname": "node-1", "hostvars": {}})


@pytest.mark.parametrize("module, args, named", [
    (job_report, {"run_id": "r", "run_dir": "/tmp/r", "spec": {}, "finals": "none"}, "finals"),
    (job_report, {"run_id": "r", "run_dir": "/tmp/r", "spec": {}, "finals": [], "lost": {"node-3": True}}, "lost"),
    (job_report, {"run_dir": "/tmp/r", "spec": {}, "finals": []}, "run_id"),
    (rank_plan, {"hosts": ["node-1"], "master_port": "soon"}, "master_port"),
    (rank_plan, {"hosts": ["node-1"], "overlay": "perhaps"}, "overlay"),
    (rank_plan, {"master_port": 29500}, "hosts"),
    (wait_ranks, {"labels": {}, "expected": 1, "timeout": "later"}, "timeout"),
    (image_archive_info, {}, "path"),
    (image_archive_info, {"path": "/tmp/a.tar", "pth": "/tmp/b.tar"}, "pth"),
], ids=lambda v: getattr(v, "__name__", "").rsplit(".", 1)[-1] or None)
def test_an_action_refuses_arguments_it_does_not_take(module, args, named):
    with pytest.raises(AnsibleActionFail, match=named):
        run(module, args)
