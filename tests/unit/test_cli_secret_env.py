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
