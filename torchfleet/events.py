"""What a playbook's events mean: ansible-runner's event stream read into failures (each
with its host, variable and kind), the debug variables a playbook shows, its stats and the
inventory check's warnings; and the input failures of many nodes worded as one error."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any, Callable, Iterable, Mapping, Sequence

from torchfleet.errors import InventoryError
from torchfleet.results import Failure

# Argument specs report bad input in their own shape; every other input check of
# torchfleet's returns ``torchfleet_error`` with its kind, host and variable.
_ARGUMENT_SPEC_ACTIONS = {"validate_argument_spec", "ansible.builtin.validate_argument_spec"}
_VARIABLE = re.compile(
    r"\b((?:torchfleet|launch|image|dataset|cpu_pinning|tls_pki|container_runtime|local_cluster|"
    r"kubelet_cpu_manager|ssh_mesh|python_env)_[a-z0-9_]+|gloo_tls|sgx_devices|GLOO_TCP_IFACE)\b"
)
_HOST_PREFIX = re.compile(r"^host (\S+?):")
# "host h: " or "hosts h, g: ", as check_input and InventoryError begin a sentence.
_HOSTS_PREFIX = re.compile(r"^(host|hosts) ([^\s:,]+(?:, [^\s:,]+)*): ")

EventHook = Callable[[Mapping[str, Any]], None]


class Collector:
    """Keeps what the results need from ansible-runner's event stream."""

    def __init__(self, hook: EventHook | None, on_warning: Callable[[dict[str, Any]], None] | None = None):
        self.hook = hook
        self.on_warning = on_warning
        self.failures: list[Failure] = []
        self.stats: dict[str, dict[str, int]] = {}
        self.debug_vars: dict[str, Any] = {}
        # The inventory check's lookalike warnings (torchfleet.lookalike), failed or not, and
        # the nodes it found: the play on localhost that ran it is none of them.
        self.warnings: list[dict[str, Any]] = []
        self.nodes: list[str] | None = None

    def __call__(self, event: Mapping[str, Any]) -> bool:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind in ("runner_on_ok", "runner_on_failed") and isinstance(data.get("res"), dict):
            for warning in data["res"].get("torchfleet_warnings") or []:
                self.warnings.append(warning)
                if self.on_warning:
                    self.on_warning(warning)
            if "torchfleet_hosts" in data["res"]:
                self.nodes = list(data["res"]["torchfleet_hosts"])
        if kind in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            res = data.get("res") or {}
            # A loop fails as "One or more items failed": the failed item says what and why.
            item = next((r for r in res.get("results") or [] if isinstance(r, dict) and r.get("failed")), None)
            res = item if item is not None else res
            message = str(res.get("msg") or res.get("stderr") or res.get("reason") or "failed").strip()
            if data.get("task_action") in _ARGUMENT_SPEC_ACTIONS and res.get("argument_errors"):
                # Ansible's "Validation of arguments failed:" heading, without the heading.
                message = "; ".join(str(e) for e in res["argument_errors"])
            host = res.get("host") if isinstance(res.get("host"), str) else None
            match = _HOST_PREFIX.match(message)
            typed = res.get("torchfleet_error") if isinstance(res.get("torchfleet_error"), dict) else {}
            variable = typed.get("variable") or (res.get("variable") if isinstance(res.get("variable"), str) else None)
            action = data.get("task_action", "")
            is_input = typed.get("kind") == "input" or (action in _ARGUMENT_SPEC_ACTIONS and "argument_errors" in res)
            if not variable and is_input:
                found = _VARIABLE.search(message)
                variable = found.group(1) if found else None
            # The inventory check runs on the controller's localhost, which is no node: an error of
            # its about no one host (the group, the run id) names none.
            about_none = typed.get("kind") == "input" and not typed.get("host") and not match \
                and data.get("host") == "localhost"
            self.failures.append(Failure(
                host=None if about_none else typed.get("host") or host or (match.group(1) if match
                                                                           else data.get("host", "?")),
                task=data.get("task", ""),
                message=message,
                unreachable=kind == "runner_on_unreachable",
                action=action,
                variable=variable,
                kind="input" if is_input else typed.get("kind") or "node",
            ))
            # The display tells input (said once, by the error) from a node's failure.
            event = dict(event, torchfleet_failure=asdict(self.failures[-1]))
        elif kind == "runner_on_ok":
            res = data.get("res") or {}
            if data.get("task_action") in ("debug", "ansible.builtin.debug"):
                for key, value in res.items():
                    if not key.startswith("_") and key not in ("changed", "failed", "msg"):
                        self.debug_vars[key] = value
        elif kind == "playbook_on_stats":
            self.stats = {k: data.get(k) or {} for k in ("ok", "changed", "failures", "dark", "skipped")}
        if self.hook:
            self.hook(event)
        return False  # runner need not keep the event on disk


def input_error(failures: Sequence[Failure]) -> InventoryError:
    """One error for the input failures of every node: each sentence once, after the hosts
    it is about (a bad group variable fails on every node, each naming itself)."""
    hosts_of: dict[str, list[str]] = {}
    for f in failures:
        named = _HOSTS_PREFIX.match(f.message)
        hosts = named.group(2).split(", ") if named else [f.host] if f.host else []
        sentence = f.message[named.end():] if named else f.message
        hosts_of.setdefault(sentence, [])
        hosts_of[sentence] += [h for h in hosts if h not in hosts_of[sentence]]
    # In the nodes' order (node-2 before node-10), not the order their failures came in.
    hosts_of = {s: sorted(h, key=lambda name: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)])
                for s, h in hosts_of.items()}
    message = "; ".join(f"host{'s' if len(h) > 1 else ''} {', '.join(h)}: {s}" if h else s
                        for s, h in hosts_of.items())
    hosts = list(dict.fromkeys(h for named in hosts_of.values() for h in named))
    first_named = next(iter(hosts_of.values()))
    return InventoryError(message, first_named[0] if first_named else None, failures[0].variable, failures[0].task,
                          hosts=hosts)


def lost_only(failures: Iterable[Failure], lost: Iterable[str]) -> bool:
    """Whether every failure of a run's playbook is a node the report already names as lost
    (it stopped answering the controller), so that the run's own verdict stands."""
    failures, lost = list(failures), set(lost)
    return bool(failures) and all(f.unreachable and f.host in lost for f in failures)
