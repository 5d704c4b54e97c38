"""A launch mode is one module behind torchfleet.modes.LaunchMode: a new one is added through
that interface alone, and everything that reads a launch (input, spec, checks, plan, report)
takes it from there."""

import json

import pytest

from harness.inputs import launch_values, role_guard
from torchfleet import inputs, modes, preflight, report, spec
from torchfleet.api import Plan
from torchfleet.errors import InventoryError
from torchfleet.ranks import rank_table

HOSTS = [("a", "10.0.0.1", 2), ("b", "10.0.0.2", 3)]


class Toy(modes.LaunchMode):
    """One "toylaunch" process per node that starts the node's ranks itself, with a
    setting of its own and a file it needs on every node."""

    name = "toy"
    SETTINGS = {"greeting": ("launch_toy_greeting", str)}

    def runtime(self, job):
        return "process"

    def probe(self, settings):
        return {"paths": ["/opt/toy/bin/toylaunch"]}

    def node_checks(self, host, reading, image_account, settings, table, image):
        return [{"that": "/opt/toy/bin/toylaunch" not in (reading.get("missing") or []), "kind": "node",
                 "variable": "launch_mode", "msg": "launch_mode=toy needs /opt/toy/bin/toylaunch"}]

    def build(self, ctx):
        name = "toylaunch"
        env = dict(ctx.env(), TOY_GREETING=ctx.settings["greeting"], TOY_NPROC=str(len(ctx.rows)))
        argv = ["/opt/toy/bin/toylaunch", *ctx.workload_argv(), *ctx.args()]
        ctx.unit(name=name, role="toy", phase=0 if ctx.is_master else 1, argv=argv, env=env,
                 ranks=[int(r["rank"]) for r in ctx.rows], labels=ctx.labels("toy"), listen=ctx.master_listen())
        for i, row in enumerate(ctx.rows):
            ctx.rank(row, i, self.name, name, ctx.workload_argv(), ctx.rank_env(row, i))

    def run_files(self, host, master):
        return [("toylaunch.log", f"toylaunch-{host}.log")]


@pytest.fixture
def toy():
    mode = modes.register(Toy())
    yield mode
    modes._MODES.pop(mode.name)


def values(**over):
    return launch_values(**{"launch_mode": "toy", "launch_python": "/opt/venv/bin/python3",
                            "launch_toy_greeting": "hello", **over})


def plan_of(job_over=None, **over):
    table = rank_table([{"name": h, "address": a, "procs": p} for h, a, p in HOSTS], 29500)
    nodes = {}
    for host, address, _ in HOSTS:
        checked = inputs.node_input(values(**over), host)
        nodes[host] = {"address": address, "interface": "eth0", "nproc": 6, "pinning": [],
                       "settings": checked["settings"], "env_public": checked["env_public"],
                       "env_shown": checked["env_shown"]}
    job = {"run_id": "r1", "job": "j", "mode": "toy", "image": "img", "args": ["--epochs", "1"],
           "workload_argv": ["python3", "t.py"], "guard": role_guard(), **(job_over or {})}
    return spec.build(job, table, nodes)


def test_a_toy_mode_added_through_the_interface_alone_gets_its_input_spec_and_plan(toy):
    assert "toy" in modes.names() and "launch_toy_greeting" in inputs.input_variables()
    checked = inputs.node_input(values(), "a")
    assert checked["settings"]["greeting"] == "hello" and checked["bare"] is True
    assert checked["mode_probe"] == {"paths": ["/opt/toy/bin/toylaunch"]}

    built = plan_of()
    assert built.mode == "toy" and built.image is None and built.world_size == 5
    # One unit per node, of the kind the launch role starts: a process, under its guard.
    assert [(u.host, u.kind, u.role, u.ranks, u.phase) for u in built.units] == [
        ("a", "process", "toy", [0, 1], 0), ("b", "process", "toy", [2, 3, 4], 1)]
    b = built.units[1]
    assert b.argv == ["/opt/toy/bin/toylaunch", "/opt/venv/bin/python3", "t.py", "--epochs", "1"]
    assert b.command[:2] == ["/opt/venv/bin/python3", "/var/lib/torchfleet/runs/r1/guard.py"]
    assert b.command[b.command.index("--") + 1:] == b.argv
    assert (b.env["TOY_GREETING"], b.env["TOY_NPROC"]) == ("hello", "3")
    # Its ranks, each with the variables it sees.
    assert [(r.rank, r.host, r.local_rank, r.runner, r.unit) for r in built.ranks] == [
        (0, "a", 0, "toy", "toylaunch"), (1, "a", 1, "toy", "toylaunch"), (2, "b", 0, "toy", "toylaunch"),
        (3, "b", 1, "toy", "toylaunch"), (4, "b", 2, "toy", "toylaunch")]
    assert built.ranks[4].env["RANK"] == "4" and built.ranks[4].env["WORLD_SIZE"] == "5"
    assert built.ranks[4].env["MASTER_ADDR"] == "10.0.0.1"
    # The guards supervise its units as any other's; the store is on the master's unit.
    assert [u["ranks"] for u in built.guard["units"]] == [[0, 1], [2, 3, 4]] and built.guard["store_unit"] == 0

    # The plan is the spec as the playbook shows it.
    view = json.loads(json.dumps(dict(spec.redacted(built), ready={"a": True, "b": True})))
    plan = Plan.from_view(view)
    assert plan.launch_mode == "toy" and [r.host for r in plan.ranks] == ["a", "a", "b", "b", "b"]

    # Its checks of a node, and its own files collected.
    table = {"master_port": 29500, "master_addr": "10.0.0.1", "master_host": "a"}
    checks = preflight.node_checks("b", {"missing": ["/opt/toy/bin/toylaunch"]}, True, [], table, bare=True,
                                   runtime="/opt/venv/bin/python3", settings=checked["settings"], job="j",
                                   planning=False, replace=False, mode="toy")
    assert [c["variable"] for c in checks if not c["that"]] == ["launch_mode"]
    assert ("toylaunch.log", "toylaunch-b.log") in report.run_files(view, "b")


def test_a_mode_refuses_what_its_runtime_cannot_apply_naming_the_variable(toy):
    with pytest.raises(InventoryError) as err:
        plan_of(launch_extra_volumes=["/x:/y"])
    assert err.value.variable == "launch_extra_volumes" and "launch_mode=toy" in str(err.value)


def test_an_unknown_mode_is_refused_naming_launch_mode():
    with pytest.raises(InventoryError) as err:
        inputs.node_input(values(launch_mode="toy"), "a")
    assert err.value.variable == "launch_mode" and "container" in str(err.value)


def test_no_module_outside_the_modes_names_a_mode_it_branches_on():
    """The spec builder, the checks, the report and the launch action ask the mode; none
    compares a mode's name."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    plugins = root / "collections/ansible_collections/torchfleet/cluster/plugins"
    files = [root / "torchfleet" / f for f in ("spec.py", "inputs.py", "preflight.py", "report.py", "settings.py")]
    files += [plugins / "action" / f for f in ("launch_input.py", "launch_spec.py", "job_report.py")]
    import re

    # A mode's name compared: mode == "mpirun", spec["mode"] in ("torchrun", ...).
    compares = re.compile(r"mode[\"'\]]*\s*(==|!=|\bin\b)\s*[\[(]?\s*[\"']")
    for path in files:
        assert not compares.search(path.read_text()), path.name
    roles = root / "roles" / "launch"
    conditions = [line for f in roles.rglob("*.yml") for line in f.read_text().splitlines()
                  if re.search(r"launch_mode\s*(==|!=|\bin\b)", line)]
    # One is left: wireguard's check of mpirun's sshd_config (docs/adding-a-launch-mode.md).
    assert len(conditions) <= 1, conditions


@pytest.mark.parametrize("mode", ["container", "process"])
def test_a_checkpoint_folder_reaches_every_rank_as_torchfleet_checkpoint_dir(mode):
    built = plan_of({"mode": mode}, launch_mode=mode, launch_checkpoint_dir="/srv/ckpt/mnist")
    seen = {r.env["TORCHFLEET_CHECKPOINT_DIR"] for r in built.ranks}
    if mode == "container":
        assert seen == {"/checkpoints"}
        assert all({"type": "bind", "source": "/srv/ckpt/mnist", "target": "/checkpoints", "read_only": False}
                   in u.mounts for u in built.units)
    else:
        assert seen == {"/srv/ckpt/mnist"}
    # Without one, the ranks get no such variable, and a user may not set it.
    assert all("TORCHFLEET_CHECKPOINT_DIR" not in r.env for r in plan_of({"mode": mode}, launch_mode=mode).ranks)
    with pytest.raises(InventoryError) as err:
        plan_of({"mode": mode}, launch_mode=mode, launch_extra_env={"TORCHFLEET_CHECKPOINT_DIR": "/x"})
    assert err.value.variable == "launch_extra_env"


def test_a_relative_checkpoint_folder_is_refused_naming_the_variable():
    with pytest.raises(InventoryError) as err:
        inputs.node_input(values(launch_mode="process", launch_checkpoint_dir="ckpt"), "a")
    assert err.value.variable == "launch_checkpoint_dir" and err.value.host == "a"
