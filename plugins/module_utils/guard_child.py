"""A guarded unit's process: a unit forked from its guard to run as ``python3 SCRIPT`` (or
``python3 -m MODULE``) would, as a new ``__main__``, and the waits and signals the guard uses
on either kind of child. Shipped beside guard.py into each run's folder (run_vocab.GUARD_SOURCES).
"""

from __future__ import annotations

import builtins
import importlib.machinery
import io
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import types
import warnings


class Forked:
    """A unit forked from the guard to run as ``python3 SCRIPT ARGS`` or ``python3 -m MODULE
    ARGS`` would (see guard_policy.preload_target), with what the guard uses of a Popen: pid, stdout,
    poll, wait, returncode. A unit that starts at once forks before the guard starts any
    thread; so does one that waits for an earlier phase (``held``), which then waits for
    release() before it runs anything of its own. A later attempt forks while the guard's
    other threads sleep or wait on store sockets that the unit never uses."""

    def __init__(self, target: tuple[str, str, list[str]], setup, held: bool = False) -> None:
        read, write = os.pipe()
        go, self._go = os.pipe() if held else (None, None)
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            # Python 3.12 warns of forking a process with threads; torch's import leaves one
            # idle thread, and its at-fork handlers are what make its DataLoader's fork safe.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            os.close(read)
            if self._go is not None:
                os.close(self._go)
            _run_target(target, write, setup, go)
        os.close(write)
        if go is not None:
            os.close(go)
        try:
            os.setpgid(pid, pid)  # also here, so that a stop right away reaches its group
        except OSError:
            pass  # the child did it first
        self.pid, self.returncode, self.held = pid, None, held
        self.stdout = os.fdopen(read, "rb")
        self._reaping = threading.Lock()

    def release(self) -> None:
        """Let a held unit run."""
        os.write(self._go, b"1")
        os.close(self._go)
        self._go, self.held = None, False

    def poll(self) -> int | None:
        with self._reaping:
            if self.returncode is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid:
                    self.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """As Popen waits with a timeout: polls 0.5 ms apart at first, then up to 50 ms."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["python3", "-"], timeout)
            time.sleep(delay)
            delay = min(2 * delay, 0.05)
        return self.returncode


class NotStarted:
    """The unit of a guard whose start waits for an earlier phase to listen (the spec's
    ``after``): it runs as long as its guard, and there is nothing of it to stop."""

    pid = None
    returncode = None
    held = True

    def poll(self) -> None:
        return None


def answers(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether ``host``:``port`` accepts a TCP connection (a guard's listen, and the
    listen_wait module's)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def import_torch() -> bool:
    try:
        from torch.distributed import TCPStore  # noqa: F401 - what the store needs, loaded once for both
    except Exception:  # noqa: BLE001 - no torch: the unit starts on its own, and the store reports it
        return False
    return True


class ChildExit(BaseException):
    """Raised in a forked unit once its script has ended: it unwinds to guard.main(), so that the
    interpreter ends as the script's own would (its exit functions, threads and objects
    finalized, its sockets closed last), not at once. A peer still joining the group may
    depend on that time."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


def _exec_as_main(path: str) -> None:
    """Run a script as the interpreter runs one: in a new ``__main__`` module that stays
    ``__main__`` to the end (runpy's would give the guard's back as soon as the script
    returns, before its exit functions and threads, which may pickle its classes)."""
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None, __builtins__=builtins,
                         __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = main
    with io.open_code(path) as fh:
        code = compile(fh.read(), path, "exec")
    exec(code, main.__dict__)  # noqa: S102 - the unit's own script, which it would run anyway


def _run_target(target: tuple[str, str, list[str]], output: int, setup, go: int | None = None) -> None:
    """In the forked child: become ``python3 SCRIPT ARGS`` (or ``-m MODULE``), then raise
    ChildExit with its exit code. Held (``go``), it first waits for its guard's word: a
    guard that ends instead kills it, or closes the pipe."""
    code = 1
    try:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL if go is not None else signal.default_int_handler)
        setup()
        if go is not None:
            released = os.read(go, 1)
            os.close(go)
            if not released:
                os._exit(128 + signal.SIGTERM)
            signal.signal(signal.SIGINT, signal.default_int_handler)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(null)
        os.close(output)
        sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
        kind, name, args = target
        sys.argv = [name if kind == "script" else "-m", *args]
        # As the interpreter starts a script (or -m): its folder (or the working folder) first
        # on the import path, where the guard's folder was, unless safe_path keeps it off.
        if not getattr(sys.flags, "safe_path", False):
            sys.path[0] = os.path.dirname(os.path.realpath(name)) if kind == "script" else os.getcwd()
        try:
            if kind == "script":
                _exec_as_main(name)
            else:
                runpy.run_module(name, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                sys.stderr.write(f"{exc.code}\n")
        except KeyboardInterrupt:
            # As the interpreter ends on one: its traceback, then killed by SIGINT (130).
            sys.excepthook(*sys.exc_info())
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except BaseException:  # noqa: BLE001 - reported as the interpreter reports it
            sys.excepthook(*sys.exc_info())
    except BaseException:  # noqa: BLE001 - whatever happens, the child never goes on as a guard
        traceback.print_exc()
    raise ChildExit(code & 0xFF)


def await_exit(child, timeout: float | None) -> int:
    """``child.wait(timeout)``, woken by the exit itself through a pidfd where Linux and
    Python have one. Popen's and Forked's own waits poll, backing off to 50 ms apart, so a
    unit that takes a while to end (48 at once on 2 cores) was reaped up to 50 ms late."""
    if child.poll() is None and hasattr(os, "pidfd_open"):
        try:
            fd = os.pidfd_open(child.pid)
        except OSError:  # reaped meanwhile, or no pidfd in this kernel: the wait below decides
            fd = None
        if fd is not None:
            try:
                exited = select.poll()
                exited.register(fd, select.POLLIN)
                if not exited.poll(None if timeout is None else max(0, int(timeout * 1000))):
                    raise subprocess.TimeoutExpired(getattr(child, "args", "unit"), timeout)
            finally:
                os.close(fd)
    return child.wait(timeout)


def killpg(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def die_with_parent() -> None:
    """The unit gets SIGKILL if its guard is killed outright (Linux only)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass
