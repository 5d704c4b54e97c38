import pytest

from torchfleet import cli
from torchfleet.errors import InventoryError


def test_secret_env_takes_its_value_from_the_environment_not_the_command_line(monkeypatch):
    monkeypatch.setenv("API_TOKEN", "tok-123")
    args = cli._parser().parse_args(["launch", "--secret-env", "API_TOKEN", "--env", "A=1", "--", "--epoch", "1"])
    variables = cli._job(args).to_vars()
    assert variables["launch_secret_env"] == {"API_TOKEN": "tok-123"}
    assert variables["launch_extra_env"] == {"A": "1"}
    assert variables["launch_args"] == ["--epoch", "1"]


def test_secret_env_of_an_unset_variable_is_bad_input(monkeypatch):
    monkeypatch.delenv("API_TOKEN", raising=False)
    args = cli._parser().parse_args(["launch", "--secret-env", "API_TOKEN"])
    with pytest.raises(InventoryError) as err:
        cli._job(args)
    assert err.value.variable == "launch_secret_env"


def test_a_launch_without_secrets_sets_none():
    assert "launch_secret_env" not in cli._job(cli._parser().parse_args(["launch"])).to_vars()


def test_extra_vars_take_a_mapping_as_ansible_playbook_does(tmp_path):
    args = cli._parser().parse_args(["plan", "-e", '{"launch_secret_env": {"T": "s"}, "launch_job": "x=y"}',
                                     "-e", "launch_master_port=29600", "-i", str(tmp_path)])
    assert cli._cluster(args).extra_vars == {"launch_secret_env": {"T": "s"}, "launch_job": "x=y",
                                             "launch_master_port": 29600}


@pytest.mark.parametrize("item", ['{"launch_secret_env": {"T": "s3cr3t-value"', "s3cr3t-value"])
def test_an_extra_var_that_cannot_be_read_is_refused_without_echoing_it(item, tmp_path):
    args = cli._parser().parse_args(["plan", "-e", item, "-i", str(tmp_path)])
    with pytest.raises(InventoryError) as err:
        cli._cluster(args)
    assert err.value.variable == "extra_vars" and "s3cr3t-value" not in str(err.value)
