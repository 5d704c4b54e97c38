"""Issue 59, item 5: where neither --job nor launch_job names the job, it is named after its
workload (the script's name less ".py", or the folder's), as the launch role's default
renders it in a play."""

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from harness import ROOT
from torchfleet import inputs
from torchfleet.errors import InventoryError


def default_job(workload: str) -> str:
    template = yaml.safe_load((ROOT / "roles" / "launch" / "defaults" / "main.yml").read_text())["launch_job"]
    templar = Templar(loader=DataLoader(), variables={"launch_workload": workload})
    return templar.template(trust_as_template(template))


# A workload, and the job it names.
NAMES = {"/home/me/train.py": "train", str(ROOT / "files" / "workloads" / "mnist.py"): "mnist",
         "/home/me/resnet-cifar": "resnet-cifar", "/home/me/resnet-cifar/": "resnet-cifar", "/home/me/v1.2": "v1.2",
         "/home/me/model.py.py": "model.py"}


def test_a_job_without_a_name_is_named_after_its_workload():
    assert {workload: default_job(workload) for workload in NAMES} == NAMES
    assert all(inputs.check_job(job) == job for job in NAMES.values())


def test_a_workload_whose_name_is_no_job_name_is_refused_as_any_bad_job_name():
    with pytest.raises(InventoryError) as err:
        inputs.check_job(default_job("/home/me/my train.py"))
    assert err.value.variable == "launch_job" and "'my train'" in err.value.message
