"""ansible-runner's plumbing: where torchfleet's playbooks are, the private folder each
playbook runs in (0700, named after this process, removed however the run ends, and a dead
process's removed by the next), and how SIGTERM or Ctrl-C cancels a run: ansible-playbook
and its workers are asked to stop, then killed after a grace period."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping



# torchfleet's playbooks, by their name in the collection: Ansible finds the checkout's
# (ansible.cfg's collections_path) or the installed one's (the wheel's, or ansible-galaxy's).
COLLECTION = "torchfleet.cluster"


def playbook(name: str) -> str:
    """The collection's playbook ``name`` (site, launch, plan, run, down, local_cluster)."""
    return f"{COLLECTION}.{name}"


def find_project(start: str | Path | None = None) -> Path | None:
    """The torchfleet checkout to run from: $TORCHFLEET_PROJECT, or the current folder or one
    above it that holds galaxy.yml, ansible.cfg and roles/launch. None when torchfleet runs as
    installed: its playbooks then come from the installed collection, and its Ansible
    settings from the package (:func:`ansible_config`)."""
    if os.environ.get("TORCHFLEET_PROJECT"):
        return Path(os.environ["TORCHFLEET_PROJECT"]).resolve()
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if all((folder / name).exists() for name in ("galaxy.yml", "ansible.cfg", "roles/launch")):
            return folder
    return None


def ansible_config(project: Path | None) -> Path:
    """The Ansible settings a playbook runs with: the checkout's ansible.cfg (a link to the
    package's), or the installed package's own."""
    if project is not None:
        return project / "ansible.cfg"
    return Path(str(resources.files("torchfleet") / "ansible.cfg"))


def collection_paths(project: Path | None) -> list[str]:
    """ansible.cfg's collections_path (:func:`ansible_config`), a relative folder taken from
    the file's own, as Ansible takes it: where this torchfleet's collection is found."""
    import configparser

    config = ansible_config(project)
    parser = configparser.ConfigParser()
    parser.read(config)
    paths = parser.get("defaults", "collections_path", fallback="")
    base = config.absolute().parent
    return [str((base / p).resolve()) if p.startswith(".") else os.path.expanduser(p) for p in paths.split(":") if p]


PRIVATE_PREFIX = "torchfleet-runner-"
PLAYBOOK_CHILD = str(Path(sys.executable).parent / "torchfleet-ansible-playbook")
# Seconds ansible-playbook gets to stop its workers before it is killed.
GRACE_S = 10.0


def _runner_root() -> Path:
    """Where the runner's private folders go: $TORCHFLEET_RUNNER_DIR, else the temp folder."""
    return Path(os.environ.get("TORCHFLEET_RUNNER_DIR") or tempfile.gettempdir())


def process_start(pid: int) -> str:
    """A process's start time (clock ticks since boot), so that a reused pid is not taken
    for the process that made a folder; "0" where /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "0"
    return stat.rsplit(")", 1)[1].split()[19]


def _owner_alive(name: str) -> bool:
    """Whether the process named in a private folder's name (prefix, pid, start) still runs."""
    pid_text, _, rest = name[len(PRIVATE_PREFIX):].partition("-")
    start = rest.partition("-")[0]
    try:
        pid = int(pid_text)
        os.kill(pid, 0)
    except ValueError:
        return True  # not named by us: leave it
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return start in ("0", process_start(pid))


def remove_stale_private_folders(root: str | Path | None = None) -> list[Path]:
    """Remove the runner folders of torchfleet processes that are gone (killed, say), and
    only those: a concurrent run, attach or logs -f keeps its own. Returns what it removed."""
    root = Path(root) if root else _runner_root()
    removed = []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(PRIVATE_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.stat(follow_symlinks=False).st_uid != os.getuid() or _owner_alive(entry.name):
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(Path(entry.path))
    return removed


@contextmanager
def private_folder() -> Iterator[Path]:
    """A 0700 folder named after this process, removed however the block is left."""
    root = _runner_root()
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    remove_stale_private_folders(root)
    pid = os.getpid()
    folder = Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{pid}-{process_start(pid)}-", dir=root))
    try:
        yield folder
    finally:
        # An exception out of ansible-runner (a caller's hook, say) leaves ansible-playbook
        # running, and writing into the folder.
        stop_processes(folder)
        shutil.rmtree(folder, ignore_errors=True)


def write_private(path: Path, text: str) -> None:
    """Write a file that only its owner can read, created with that mode."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def command_without_env(status: Mapping[str, Any], runner_config: Any) -> None:
    """ansible-runner writes the environment (proxies with passwords, say) beside the command
    in artifacts/<id>/command; keep only the names, before ansible-playbook starts."""
    if status.get("status") != "running":
        return
    path = Path(runner_config.artifact_dir) / "command"
    data = json.loads(path.read_text())
    data["env"] = sorted(data.get("env") or {})
    path.write_text(json.dumps(data))


class Cancel:
    """ansible-runner's cancel_callback. After SIGTERM or Ctrl-C it asks ansible-playbook
    to stop with SIGTERM, which stops its workers too (a kill of its process group, all
    ansible-runner does, misses them: each runs in a session of its own), and lets
    ansible-runner kill what is left after a grace period."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self.folder: Path | None = None
        self._asked_at: float | None = None

    def handler(self, signum: int, frame: Any) -> None:
        self.received.append(signum)

    def __call__(self) -> bool:
        if not self.received:
            return False
        if self._asked_at is None:
            self._asked_at = time.monotonic()
            signal_all(processes_naming(self.folder), signal.SIGTERM)
        return time.monotonic() - self._asked_at > GRACE_S


def signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def stop_processes(folder: Path) -> None:
    """Stop the processes that still use ``folder``: SIGTERM, then SIGKILL."""
    signal_all(processes_naming(folder), signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while processes_naming(folder) and time.monotonic() < deadline:
        time.sleep(0.1)
    signal_all(processes_naming(folder), signal.SIGKILL)


def processes_naming(folder: Path | None) -> list[int]:
    """Processes whose command line names ``folder``: this run's ansible-playbook and its
    workers (forks of it, in sessions of their own)."""
    found = []
    if folder is None:
        return found
    # Not Path.glob: it stats each match, and a process that ends in between raises
    # ProcessLookupError, which it does not catch (seen on a busy machine).
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                text = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in text:
            found.append(int(name))
    return found


@contextmanager
def cancel_on_signals(reraise: bool = True) -> Iterator[Cancel]:
    """SIGTERM or Ctrl-C cancels the run in hand; once the caller has cleaned up, the
    signal goes on to whatever handled it before (KeyboardInterrupt, or the end), unless
    the caller handles it itself."""
    cancel = Cancel()
    if threading.current_thread() is not threading.main_thread():
        yield cancel  # only the main thread may set signal handlers
        return
    # A signal this process ignores, or whose handler is not Python's, stays as it is.
    previous = {signum: signal.signal(signum, cancel.handler) for signum in (signal.SIGTERM, signal.SIGINT)
                if signal.getsignal(signum) not in (None, signal.SIG_IGN)}
    try:
        yield cancel
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if cancel.received and reraise:
        signal.raise_signal(cancel.received[0])
