"""Issue 59, item 2: a running 3-node job's curves, live in TensorBoard, as a real browser
(Debian's headless Chromium, driven by chromedriver) sees them. The run restarts once (rank 2
crashes in attempt 1), so each rank has a curve per attempt. On the three hosts the restart
cases use (conftest.py): a 3-node job needs three."""

import base64
import json
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .conftest import ENV, MNIST, WORKLOAD

CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER), reason="needs Debian's chromium and chromium-driver")

RUN = "live-curves"
# Late enough that every rank has flushed events of attempt 1 (SummaryWriter writes every 5 s).
CRASH_AT = 200
NAMES = {f"tensorboard/rank-{rank}/attempt-{attempt}" for rank in range(3) for attempt in (1, 2)}
SERVING = re.compile(r"TensorBoard at (http://\S+/)")


def free_port():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        return free.getsockname()[1]


class Browser:
    """Headless Chromium through chromedriver's W3C WebDriver protocol (plain HTTP and JSON)."""

    def __init__(self, profile: Path):
        port = free_port()
        self.driver = subprocess.Popen([DRIVER, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                self.call("GET", "/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        args = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={profile}", "--window-size=1400,1000"]
        session = self.call("POST", "/session", {"capabilities": {"alwaysMatch": {
            "browserName": "chrome", "goog:chromeOptions": {"binary": CHROMIUM, "args": args}}}})
        self.session = f"/session/{session['sessionId']}"

    def call(self, method, path, body=None):
        request = urllib.request.Request(self.base + path, method=method, headers={"Content-Type": "application/json"},
                                         data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(request, timeout=120) as answer:
            return json.loads(answer.read())["value"]

    def open(self, url):
        self.call("POST", f"{self.session}/url", {"url": url})

    def reload(self):
        self.call("POST", f"{self.session}/refresh", {})

    def text(self):
        script = {"script": "return document.body.innerText", "args": []}
        return self.call("POST", f"{self.session}/execute/sync", script)

    def last_steps(self, runs):
        """From the page, each run's loss series as TensorBoard's scalars endpoint serves it: its last step."""
        script = """
            const [runs, done] = [arguments[0], arguments[arguments.length - 1]];
            Promise.all(runs.map(run => fetch('data/plugin/scalars/scalars?tag=train%2Floss&run=' +
                                              encodeURIComponent(run)).then(r => r.json())))
              .then(series => done(series.map(points => points.length ? points[points.length - 1][1] : null)),
                    error => done(String(error)));"""
        steps = self.call("POST", f"{self.session}/execute/async", {"script": script, "args": [sorted(runs)]})
        assert isinstance(steps, list), steps
        return dict(zip(sorted(runs), steps))

    def screenshot(self, path):
        path.write_bytes(base64.b64decode(self.call("GET", f"{self.session}/screenshot")))

    def close(self):
        try:
            self.call("DELETE", self.session)
        finally:
            self.driver.terminate()
            self.driver.wait(10)


def test_a_running_jobs_curves_are_live_in_tensorboard_one_per_rank_and_attempt(recovery, tmp_path):
    r = recovery
    code, out = r.cli("launch", "--detach", "--workload", str(WORKLOAD), "--job", "curves", "--run-id", RUN,
                      "-e", "launch_max_restarts=1", "--", *MNIST, "--epoch", "300", "--checkpoint-every", "50",
                      "--crash-rank", "2", "--crash-at-step", str(CRASH_AT), "--crash-on-attempt", "0")
    assert code == 0, out
    board = subprocess.Popen(r.args("tensorboard", RUN, "--interval", "2", "--port", str(free_port())),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=r.env,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    url = None
    try:
        for line in board.stdout:
            if (found := SERVING.search(line)):
                url = found.group(1)
                break
        assert url, board.stderr.read()
        browser = Browser(Path(tempfile.mkdtemp(dir=tmp_path)))
        try:
            # Attempt 2's curves appear once it runs: the page is loaded again until it shows them,
            # as a user would reload it.
            browser.open(url + "#timeseries")
            deadline = time.monotonic() + 180
            while True:
                time.sleep(3)
                shown = browser.text()
                if all(name in shown for name in NAMES):
                    break
                assert time.monotonic() < deadline, f"the page shows {shown[:2000]}"
                browser.reload()
            first = browser.last_steps(NAMES)
            time.sleep(10)
            second = browser.last_steps(NAMES)
            logs = Path(ENV["TORCHFLEET_STATE_DIR"]) / "test-logs"
            logs.mkdir(parents=True, exist_ok=True)
            browser.screenshot(logs / f"tensorboard-{RUN}.png")
        finally:
            browser.close()
        for rank in range(3):
            # Attempt 1 ended at the crash; attempt 2 resumed from its checkpoint and goes on,
            # and its curve with it.
            ended, going = f"tensorboard/rank-{rank}/attempt-1", f"tensorboard/rank-{rank}/attempt-2"
            assert first[ended] == second[ended] and 0 < second[ended] <= CRASH_AT + 1, (first, second)
            assert second[going] > first[going] > CRASH_AT - 50, (first, second)
    finally:
        board.send_signal(signal.SIGINT)
        stdout, stderr = board.communicate(timeout=60)
        r.cli("stop", RUN)
    assert board.returncode == 0 and "stopped TensorBoard" in stdout, stdout + stderr
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)
