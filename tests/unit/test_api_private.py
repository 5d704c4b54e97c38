"""The API's runner folder: variables through a 0600 file, the folder gone on every exit path.

These run the real ansible-runner and ansible-playbook against localhost; no node is needed.
"""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from torchfleet import api, runner

TOKEN = "tfleak-unit-7c1e55a0"

# Reads, while ansible-playbook runs: its command line (ps), the variables file's and the
# folder's modes, and what ansible-runner wrote to artifacts/<id>/command.
PLAYBOOK = """
- name: Look at how the variables arrived
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Record ps, the file modes and the runner's command file
      ansible.builtin.shell: |
        ps -eww -o args > {out}/ps.txt
        file=$(grep -o -- '-e @{root}/[^ ]*/env/extravars' {out}/ps.txt | head -n 1 | cut -c 5-)
        echo "$file" > {out}/file.txt
        stat -c '%a' "$file" "$(dirname "$(dirname "$file")")" > {out}/modes.txt
        cat "$(dirname "$(dirname "$file")")"/artifacts/*/command > {out}/command.txt
      changed_when: false

    - name: Write what the variable held
      ansible.builtin.copy:
        content: "{{{{ token }}}}"
        dest: "{out}/received.txt"
        mode: "0600"
"""

SLOW_PLAYBOOK = """
- name: Take a while
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Sleep
      ansible.builtin.command: sleep 60
      changed_when: false
"""


@pytest.fixture
def project(tmp_path, monkeypatch):
    # Made by the first run: TORCHFLEET_RUNNER_DIR may name a folder that is not there yet.
    root = tmp_path / "runner-root"
    monkeypatch.setenv("TORCHFLEET_RUNNER_DIR", str(root))
    out = tmp_path / "out"
    out.mkdir()
    proj = tmp_path / "project"
    proj.mkdir()
    (proj / "hosts.yml").write_text("all:\n  hosts:\n    localhost:\n      ansible_python_interpreter: "
                                    f"{sys.executable}\n")
    (proj / "look.yml").write_text(PLAYBOOK.format(out=out, root=root))
    (proj / "slow.yml").write_text(SLOW_PLAYBOOK)
    (proj / "ansible.cfg").write_text("[defaults]\n")
    return proj, root, out


def cluster(proj, progress=False):
    return api.Cluster(proj / "hosts.yml", project_dir=proj, progress=progress)


def test_variables_reach_ansible_playbook_through_a_private_file(project, monkeypatch):
    proj, root, out = project
    monkeypatch.setenv("https_proxy", f"http://user:{TOKEN}-proxy@proxy.invalid:3128")
    result, _ = cluster(proj)._run("look.yml", "look", {"token": TOKEN})
    assert result.ok, result
    assert (out / "received.txt").read_text() == TOKEN
    ps = (out / "ps.txt").read_text()
    assert "ansible-playbook" in ps and TOKEN not in ps
    assert (out / "file.txt").read_text().strip().startswith(str(root))
    assert (out / "modes.txt").read_text().split() == ["600", "700"]
    command = json.loads((out / "command.txt").read_text())
    assert command["command"][-2:] == ["-e", "@" + (out / "file.txt").read_text().strip()]
    # The environment's names stay, its values (a proxy password here) do not.
    assert "https_proxy" in command["env"] and TOKEN not in json.dumps(command)
    assert list(root.iterdir()) == []


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_the_folder_goes_when_the_caller_raises(project, error):
    proj, root, _ = project

    def hook(event):
        if event.get("event") == "playbook_on_start":
            raise error("stop here")

    with pytest.raises(BaseException) as caught:
        cluster(proj, progress=hook)._run("slow.yml", "slow", {"token": TOKEN})
    # ansible-runner wraps what a handler raises; the original is its cause.
    assert isinstance(caught.value, error) or isinstance(caught.value.__cause__, error)
    assert list(root.iterdir()) == []
    assert _playbook_pids(root) == []


DRIVER = """
import sys
from pathlib import Path
from torchfleet import api
api.Cluster(Path(sys.argv[1]) / "hosts.yml", project_dir=sys.argv[1], progress=False)._run(
    "slow.yml", "slow", {"token": sys.argv[2]})
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_the_folder_and_ansible_playbook_go_on_a_signal(project, signum):
    proj, root, _ = project
    # A suite started in the background (`cmd &`) ignores SIGINT, and the driver would
    # inherit that; the API leaves an ignored signal alone, by design.
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(proj), TOKEN], env=dict(os.environ),
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not _playbook_pids(root):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.2)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=30)
    # The signal went on to Python's own handling: the end of the process, or a
    # KeyboardInterrupt that Python turns back into death by SIGINT.
    assert proc.returncode == -signum
    assert ("KeyboardInterrupt" in stderr) == (signum == signal.SIGINT)
    assert list(root.iterdir()) == []
    assert _playbook_pids(root) == []


def test_ansible_playbook_ends_when_its_caller_is_killed_outright(project):
    """A controller killed with SIGKILL runs no handler: its ansible-playbook must not go on
    alone (the run is the guards' to supervise, and attach follows it again)."""
    proj, root, _ = project
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(proj), TOKEN], env=dict(os.environ))
    deadline = time.monotonic() + 60
    while not _playbook_pids(root):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 20
    while _playbook_pids(root) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _playbook_pids(root) == []


def _playbook_pids(root):
    """ansible-playbook processes whose command line names a folder under root."""
    ps = subprocess.run(["ps", "-eww", "-o", "pid=,args="], capture_output=True, text=True).stdout
    return [line.split()[0] for line in ps.splitlines() if "ansible-playbook" in line and str(root) in line]


def _dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_only_folders_of_processes_that_are_gone_are_removed(tmp_path):
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        live = f"torchfleet-runner-{sleeper.pid}-{runner.process_start(sleeper.pid)}-abc"
        mine = f"torchfleet-runner-{os.getpid()}-{runner.process_start(os.getpid())}-def"
        dead = f"torchfleet-runner-{_dead_pid()}-{runner.process_start(os.getpid())}-ghi"
        # The pid runs, but it is another process than the one that made the folder.
        reused = f"torchfleet-runner-{sleeper.pid}-1-jkl"
        other = "torchfleet-runner-notapid"
        for name in (live, mine, dead, reused, other):
            (tmp_path / name / "env").mkdir(parents=True)
        removed = runner.remove_stale_private_folders(tmp_path)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert sorted(p.name for p in removed) == sorted([dead, reused])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live, mine, other])


def test_a_run_removes_what_a_killed_run_left(project):
    proj, root, _ = project
    root.mkdir()
    left = root / f"torchfleet-runner-{_dead_pid()}-0-xyz"
    (left / "env").mkdir(parents=True)
    (left / "env" / "extravars").write_text(TOKEN)
    assert cluster(proj)._run("look.yml", "look", {"token": "x"})[0].ok
    assert list(root.iterdir()) == []


def test_the_folder_name_says_which_process_made_it(project):
    proj, root, out = project
    cluster(proj)._run("look.yml", "look", {"token": "x"})
    folder = Path((out / "file.txt").read_text().strip()).parents[1].name
    assert re.fullmatch(rf"torchfleet-runner-{os.getpid()}-{runner.process_start(os.getpid())}-\w+", folder)


def test_processes_that_end_during_the_scan_do_not_break_it(tmp_path):
    """The scan of /proc meets processes ending under it, as on a busy machine: it finds the
    one process naming the folder, and raises nothing for those that went."""
    folder = tmp_path / "torchfleet-runner-scan"
    named = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(folder)])
    done = threading.Event()

    def churn():
        while not done.is_set():
            subprocess.run(["true"])

    workers = [threading.Thread(target=churn) for _ in range(3)]
    for worker in workers:
        worker.start()
    try:
        for _ in range(50):
            assert runner.processes_naming(folder) == [named.pid]
    finally:
        done.set()
        for worker in workers:
            worker.join()
        named.kill()
        named.wait()
    assert runner.processes_naming(folder) == []
