"""Issue 59, item 1: `plan` takes `launch`'s command line, flag for flag and with the same
meaning, so that the plan of a command line is what that launch runs; and `--version`."""

import argparse
import importlib.metadata
import subprocess
import sys

import pytest

from torchfleet import cli
from torchfleet.errors import TorchfleetError


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli._parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Each flag of ``parser`` (the script's arguments under their dest), to its action."""
    return {name: action for action in parser._actions if not isinstance(action, argparse._HelpAction)
            for name in action.option_strings or [action.dest]}


def sample(action: argparse.Action) -> list[str]:
    """A value for ``action`` on a command line."""
    if action.nargs == 0:
        return []
    if action.nargs == argparse.REMAINDER:
        return ["--", "--epoch", "3", "--run-id", "inside"]
    if action.choices:
        return [sorted(action.choices)[0]]
    return ["29555"] if action.type is int else ["K1=v1"]


def outcome(command: str, flag: str, action: argparse.Action):
    """What a command line with ``flag`` gives: the namespace's values, and the job's
    variables (or the error that refuses them)."""
    line = [command] + ([] if flag == action.dest else [flag]) + sample(action)
    args = cli._parser().parse_args(line)
    values = {k: v for k, v in vars(args).items() if k not in ("func", "command", "action")}
    try:
        job = cli._job(args).to_vars()
    except TorchfleetError as exc:
        job = f"refused: {exc.message}"
    return values, job


def test_every_launch_flag_that_shapes_the_run_is_a_plan_flag_with_the_same_meaning(monkeypatch):
    monkeypatch.setenv("K1", "v1")
    monkeypatch.chdir("/")
    launch, plan = flags(commands()["launch"]), flags(commands()["plan"])
    shaping = {flag: action for flag, action in launch.items() if flag not in cli.LAUNCH_ONLY}
    assert {"--env", "--secret-env", "--timeout", "--workload", "--entrypoint", "--job", "--master-port", "--run-id",
            "-e", "script_args"} <= set(shaping)
    missing = sorted(set(shaping) - set(plan))
    assert not missing, f"launch flags that plan does not take: {missing}"
    for flag, action in shaping.items():
        theirs = plan[flag]
        assert (theirs.dest, theirs.nargs, theirs.type, theirs.choices, theirs.default, type(theirs)) == \
            (action.dest, action.nargs, action.type, action.choices, action.default, type(action)), flag
        launch_values, launch_job = outcome("launch", flag, action)
        plan_values, plan_job = outcome("plan", flag, theirs)
        assert launch_job == plan_job, flag
        assert {k: v for k, v in plan_values.items() if k in launch_values} == \
            {k: v for k, v in launch_values.items() if k in plan_values}, flag


def test_plans_own_flags_are_none_of_launchs_and_launchs_own_are_refused_by_plan():
    launch, plan = flags(commands()["launch"]), flags(commands()["plan"])
    assert set(cli.LAUNCH_ONLY) <= set(launch)
    assert not set(cli.LAUNCH_ONLY) & set(plan)
    assert {"--show-env", "--file", "--format"} <= set(plan) - set(launch)
    for flag in cli.LAUNCH_ONLY:
        with pytest.raises(SystemExit):
            cli._parser().parse_args(["plan", flag])


def test_the_issues_command_line_keeps_its_run_id_and_env_on_plan(monkeypatch):
    """`plan --env A=B --run-id r1 -- --epoch 1` read `A=B` and the rest as the script's
    arguments before, and lost the run id."""
    monkeypatch.setenv("API_TOKEN", "tok-1")
    line = ["--env", "A=B", "--secret-env", "API_TOKEN", "--timeout", "60", "--run-id", "r1", "--", "--epoch", "1"]
    plan, launch = (cli._job(cli._parser().parse_args([c, *line])).to_vars() for c in ("plan", "launch"))
    assert plan == launch
    assert plan == {"launch_args": ["--epoch", "1"], "launch_extra_env": {"A": "B"},
                    "launch_secret_env": {"API_TOKEN": "tok-1"}, "launch_timeout": 60, "launch_run_id": "r1"}


def test_version_is_the_installed_packages():
    done = subprocess.run([sys.executable, "-m", "torchfleet.cli", "--version"], capture_output=True, text=True)
    assert done.returncode == 0
    assert done.stdout.strip() == f"torchfleet {importlib.metadata.version('torchfleet')}"
