"""A pytest plugin for bench/load.py: ``pytest -p load_rounds --rounds K`` runs every selected
test K times in one session, round after round (round 1 of every test, then round 2, ...),
so that a session's clusters are made once. A test's id gets ``[round-K]``, and its fixtures
can read the round as ``load_round``. With ``--rounds-until T`` (a Unix time) no round starts
after T: the session ends after the round that runs then, its report written."""

import time

import pytest


def pytest_addoption(parser):
    parser.addoption("--rounds", type=int, default=1, help="run every selected test this many times (bench/load.py)")
    parser.addoption("--rounds-until", type=float, default=0, help="start no round after this Unix time (0: no limit)")


@pytest.fixture
def load_round(request):
    return request.param


def pytest_generate_tests(metafunc):
    rounds = metafunc.config.getoption("rounds")
    if rounds > 1:
        metafunc.fixturenames.append("load_round")
        metafunc.parametrize("load_round", range(1, rounds + 1), indirect=True, ids=lambda k: f"round-{k}")


def round_of(item) -> int:
    """The round an item runs in: 1 without --rounds."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("load_round", 1) if callspec else 1


def pytest_collection_modifyitems(items):
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda item: (round_of(item), order[id(item)]))


def pytest_runtest_teardown(item, nextitem):
    until = item.config.getoption("rounds_until")
    if until and nextitem is not None and round_of(nextitem) != round_of(item) and time.time() > until:
        item.session.shouldstop = f"round {round_of(item)} ended after --rounds-until"
