"""Cluster.plan() returns the launch spec as the playbook showed it, unchanged."""

import json

from harness.inputs import role_guard
from torchfleet import spec
from torchfleet.api import Plan
from torchfleet.ranks import rank_table


def test_the_plan_is_the_spec_with_each_nodes_readiness():
    table = rank_table([{"name": "a", "address": "10.0.0.1", "procs": 2}, {"name": "b", "address": "10.0.0.2"}])
    node = {"address": "", "interface": "eth0", "nproc": 4, "pinning": [], "settings": {},
            "env_public": {}, "env_shown": {"TOKEN": "<secret>"}}
    built = spec.build({"run_id": "r1", "job": "j", "mode": "container", "image": "img", "args": ["--x"],
                        "workload_argv": ["python3", "t.py"], "guard": role_guard()},
                       table, {"a": node, "b": node})
    view = json.loads(json.dumps(dict(spec.redacted(built), ready={"a": True, "b": False})))
    # The inventory check's warnings come beside the spec, not in it (nodes never read them).
    plan = Plan.from_view(view, [{"message": "m"}])
    assert plan.to_dict() == dict(view, warnings=[{"message": "m"}]) and "warnings" not in built.to_dict()
    assert [(r.rank, r.host, r.runtime_ready, r.omp_num_threads) for r in plan.ranks] == [
        (0, "a", True, 2), (1, "a", True, 2), (2, "b", False, 4)]
    assert plan.master == "10.0.0.1:29500" and plan.launch_mode == "container" and plan.run_id == "r1"
    assert plan.warnings == [{"message": "m"}] and plan.ranks[2].secret_env == ["TOKEN"]
    assert plan.ranks[2].env["TOKEN"] == "<secret>"
