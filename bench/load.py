#!/usr/bin/env python3
"""The guard, restart and recovery tests under load: each test K times beside a CPU hog.

A 2-core machine that also runs molecule, the cluster stages and other sessions' tests
starves the guards; a race that needs a thread to stand still for seconds shows there and
nowhere else. This runs the chosen suites K rounds in one pytest session per suite
(tests/load_rounds.py: round 1 of every test, then round 2, ...; a suite's cluster is made
once) while Debian's stress-ng keeps CPU workers busy beside them, and reports each test's
passes out of its runs. It is not part of scripts/test.sh.

Suites:
  guard      tests/unit/test_guard.py, test_guard_sync.py, test_guard_report.py (real guards
             on this machine, with stand-ins for torch where the test says so)
  restarts   tests/unit/test_guard_restarts.py (three real guards and their store on loopback)
  recovery   tests/recovery: test_recovery.py, test_store_forgery.py and test_thawed_node.py
             (three docker hosts of their own: slower; its cluster's name and subnet follow
             TORCHFLEET_TEST_PREFIX and TORCHFLEET_TEST_SUBNET_BASE, see tests/recovery/conftest.py)

Run from the repository root with the venv active:

    python bench/load.py                          # guard and restarts, 20 rounds, 2 hog workers
    python bench/load.py --rounds 5 recovery      # the recovery cases 5 times
    python bench/load.py --hog 0 restarts         # no hog: the same rounds on a quiet machine
    python bench/load.py --together restarts recovery   # both suites at once, beside one hog
    python bench/load.py --minutes 90 recovery    # as many whole rounds as start within 90 minutes
    python bench/load.py -k crashed recovery      # only the tests that match, as pytest's -k

Exit status 0 when every run of every test passed. ``--json FILE`` writes the counts; each suite's
pytest output and its tests' temporary folders stay in ``--keep DIR`` (default: a new folder).
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

SUITES = {
    "guard": ["tests/unit/test_guard.py", "tests/unit/test_guard_sync.py", "tests/unit/test_guard_report.py"],
    "restarts": ["tests/unit/test_guard_restarts.py"],
    "recovery": ["tests/recovery/test_recovery.py", "tests/recovery/test_store_forgery.py",
                 "tests/recovery/test_thawed_node.py"],
}
# A round's part of a test's id: alone, or beside the test's own parameters.
ROUND = re.compile(r"\[round-\d+\]$|(?<=\[)round-\d+-|-round-\d+(?=[-\]])")


def start_hog(workers: int) -> subprocess.Popen | None:
    """stress-ng's CPU workers, in a process group of their own."""
    if workers <= 0:
        return None
    if not shutil.which("stress-ng"):
        sys.exit("stress-ng is not installed (Debian: apt-get install stress-ng)")
    return subprocess.Popen(["stress-ng", "--cpu", str(workers), "--quiet"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def stop_hog(hog: subprocess.Popen | None) -> None:
    if hog is None:
        return
    try:
        os.killpg(hog.pid, signal.SIGTERM)
        hog.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(hog.pid, signal.SIGKILL)
        hog.wait()


def test_name(case) -> str:
    """A junit testcase's test, without its round."""
    name = ROUND.sub("", case.get("name", ""))
    return f"{case.get('classname', '')}::{name}"


def outcomes(report: str) -> dict[str, list[str]]:
    """Each test's outcome in every round: passed, failed, error or skipped."""
    found: dict[str, list[str]] = collections.defaultdict(list)
    for case in ET.parse(report).getroot().iter("testcase"):
        if not case.get("name"):
            continue  # what an interrupted session (Ctrl-C) writes for the test it cut short
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        found[test_name(case)].append({"failure": "failed"}.get(kinds[0], kinds[0]) if kinds else "passed")
    return dict(found)


def run_suite(name: str, rounds: int, folder: str, until: float = 0, select: str = "") -> tuple[dict[str, list[str]], float, int]:
    """The suite's rounds; pytest's output (``NAME.log``), its report and each test's temporary
    folder (what a failed test's guards wrote) are kept in ``folder``."""
    report = os.path.join(folder, f"{name}.xml")
    log = os.path.join(folder, f"{name}.log")
    started = time.monotonic()
    # Written as it runs, a line a test, so that a round that failed can be read before the end.
    with open(log, "w") as fh:
        done = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "load_rounds", "--rounds", str(rounds),
                               "--rounds-until", str(until), "-p", "no:cacheprovider", f"--junitxml={report}",
                               f"--basetemp={os.path.join(folder, name + '-tmp')}", *(["-k", select] if select else []),
                               *SUITES[name]],
                              stdout=fh, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seconds = time.monotonic() - started
    with open(log) as fh:
        text = fh.read()
    tail = text.strip().splitlines()[-60:]
    code = done.returncode
    if code == 2 and "after --rounds-until" in text:
        # pytest's exit for a session ended early; the rounds that ran are in the report.
        code = 0
    if code not in (0, 1):
        print("\n".join(tail))
    if not os.path.exists(report):
        return {}, seconds, code
    if code == 1:
        print("\n".join(line for line in tail if line.startswith(("FAILED", "ERROR")) or "Error" in line))
    return outcomes(report), seconds, code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suites", nargs="*", default=["guard", "restarts"], help=f"of {', '.join(SUITES)}")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--hog", type=int, default=os.cpu_count() or 2, help="stress-ng CPU workers (0: none)")
    parser.add_argument("--minutes", type=float, default=0,
                        help="start no round after this many minutes: the rounds that ran are counted (0: no limit)")
    parser.add_argument("-k", dest="select", default="", help="only the tests that match, as pytest's -k")
    parser.add_argument("--together", action="store_true", help="run the suites at the same time, beside one hog")
    parser.add_argument("--json", help="write the counts here")
    parser.add_argument("--keep", help="the folder for each suite's output and temporary folders (default: a new one "
                                       "under the system's temporary folder)")
    args = parser.parse_args()
    unknown = [s for s in args.suites if s not in SUITES]
    if unknown:
        parser.error(f"no suite {', '.join(unknown)}; the suites are {', '.join(SUITES)}")
    results = {}
    until = time.time() + args.minutes * 60 if args.minutes else 0
    folder = args.keep or tempfile.mkdtemp(prefix="load-")
    os.makedirs(folder, exist_ok=True)

    def counts(found: dict[str, list[str]], seconds: float, code: int) -> dict:
        return {"seconds": round(seconds), "pytest_exit": code, "load_1min_at_end": round(os.getloadavg()[0], 1),
                "tests": {t: {"runs": len(o), "passed": o.count("passed"),
                              "outcomes": dict(collections.Counter(o))} for t, o in found.items()}}

    if args.together:
        # Each suite is load for the others too: a harder test than one suite beside the hog.
        hog = start_hog(args.hog)
        try:
            with concurrent.futures.ThreadPoolExecutor(len(args.suites)) as pool:
                futures = {s: pool.submit(run_suite, s, args.rounds, folder, until, args.select) for s in args.suites}
                for suite, future in futures.items():
                    results[suite] = counts(*future.result())
        finally:
            stop_hog(hog)
    else:
        for suite in args.suites:
            hog = start_hog(args.hog)
            try:
                found, seconds, code = run_suite(suite, args.rounds, folder, until, args.select)
            finally:
                stop_hog(hog)
            results[suite] = counts(found, seconds, code)
    ok = True
    for suite, result in results.items():
        tests = result["tests"]
        runs = sum(t["runs"] for t in tests.values())
        passed = sum(t["passed"] for t in tests.values())
        skipped = sum(t["outcomes"].get("skipped", 0) for t in tests.values())
        done = max((t["runs"] for t in tests.values()), default=0)
        print(f"\n{suite}: {passed} of {runs} runs passed ({skipped} skipped), {len(tests)} tests x {done} of {args.rounds} rounds, "
              f"hog {args.hog} worker(s){', beside ' + ', '.join(s for s in args.suites if s != suite) if args.together else ''}, "
              f"{result['seconds']} s, load {result['load_1min_at_end']} at the end")
        for test, tally in sorted(tests.items()):
            mark = "" if tally["passed"] + tally["outcomes"].get("skipped", 0) == tally["runs"] else "   <--"
            print(f"  {tally['passed']:>3}/{tally['runs']:<3} {test}{mark}")
        ok = ok and result["pytest_exit"] == 0 and runs == passed + skipped and runs > 0
    print(f"\noutput, reports and the tests' temporary folders: {folder}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rounds": args.rounds, "hog_workers": args.hog, "suites": results}, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
