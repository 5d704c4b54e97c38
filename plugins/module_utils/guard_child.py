"""A guarded unit's process: the unit as its guard starts, watches and stops it (UnitProcess);
a unit forked from its guard to run as ``python3 SCRIPT`` (or ``python3 -m MODULE``) would, as
a new ``__main__``; the fork server that starts a later attempt's unit from a process with no
thread of the guard's; and the waits and signals the guard uses on every kind of child.
Shipped beside guard.py into each run's folder (run_vocab.GUARD_SOURCES).
"""

from __future__ import annotations

import builtins
import collections
import importlib.machinery
import io
import json
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

try:
    from ansible_collections.torchfleet.cluster.plugins.module_utils import guard_policy as policy
    from ansible_collections.torchfleet.cluster.plugins.module_utils import run_vocab as vocab
except ImportError:  # on a node: imported by guard.py from the run's folder, where its siblings lie beside it
    import guard_policy as policy
    import run_vocab as vocab


class Forked:
    """A unit forked from the guard to run as ``python3 SCRIPT ARGS`` or ``python3 -m MODULE
    ARGS`` would (see guard_policy.preload_target), with what the guard uses of a Popen: pid, stdout,
    poll, wait, returncode. A unit that starts at once forks before the guard starts any
    thread; so does one that waits for an earlier phase (``held``), which then waits for
    release() before it runs anything of its own. A later attempt's unit comes from the
    fork server instead (ForkServer), since the guard then has threads."""

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


def interface_towards(address: str) -> str | None:
    """The interface that holds this node's IPv4 address towards ``address`` (the source of
    its route there, and on the master its own), or None where there is none."""
    import fcntl
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))  # no packet: a UDP connect only looks up the route
            source = probe.getsockname()[0]
            for _index, name in socket.if_nameindex():
                try:
                    found = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
                except OSError:
                    continue
                if socket.inet_ntoa(found[20:24]) == source:
                    return name
    except OSError:
        return None
    return None


def interface_gone(name: str) -> bool:
    try:
        socket.if_nametoindex(name)
    except OSError:
        return True
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


# How long a new start, or a guard that is done, waits for the unit's last lines (a traceback)
# to reach the log.
OUTPUT_DRAIN_S = 2.0


def own_group() -> None:
    """In a unit's process before it runs: a process group of its own, which the guard's
    signals reach whole, and SIGKILL when its parent ends."""
    os.setpgid(0, 0)
    die_with_parent()


class ForkServer:
    """A process forked from the guard before the guard starts any thread, that starts the
    guard's later units: a later attempt's (launch_max_restarts), and a unit held for an
    earlier phase that is not forked from the guard. A fork from the guard once its store
    threads run could copy a lock that one of them holds into the unit; this process has
    none of them (only torch's idle thread, as the guard had at its own first fork), and it
    forks a Python unit, or starts any other command, as the guard did at its start. It
    ignores the signals the guard gets, and dies with it (and its unit with it, as a unit
    forked from the guard would)."""

    def __init__(self, close_fds: tuple[int, ...] = ()) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()
        sys.stderr.flush()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch's idle thread: see Forked
            pid = os.fork()
        if pid == 0:
            ours.close()
            for fd in close_fds:
                os.close(fd)
            _serve(theirs)
        theirs.close()
        self.pid, self.sock, self.lock = pid, ours, threading.Lock()

    def start(self, target: tuple[str, str, list[str]] | None, argv: list[str], env: dict) -> "Served":
        """Start a unit: ``target`` forked (guard_policy.preload_target), else ``argv`` as its own
        program; ``env`` over the guard's environment as it was at its start."""
        read, write = os.pipe()
        try:
            with self.lock:
                request = {"target": list(target) if target else None, "argv": argv, "env": env}
                socket.send_fds(self.sock, [json.dumps(request).encode()], [write])
                reply = json.loads(self.sock.recv(1 << 16) or b"{}")
        finally:
            os.close(write)
        if "pid" not in reply:
            os.close(read)
            raise OSError(f"the fork server could not start the unit: {reply.get('error', 'it is gone')}")
        return Served(self, reply["pid"], os.fdopen(read, "rb"))

    def exit_of(self, served: "Served", timeout: float) -> int | None:
        """``served``'s exit as the server reports it (a Popen's returncode), waiting up to ``timeout``."""
        with self.lock:
            if served.returncode is None and select.select([self.sock], [], [], timeout)[0]:
                message = self.sock.recv(1 << 16)
                # A server gone takes its unit with it (PR_SET_PDEATHSIG).
                served.returncode = json.loads(message)["exit"] if message else -signal.SIGKILL
            return served.returncode


class Served:
    """A unit the fork server started, with what the guard uses of a Popen: pid, stdout, poll,
    wait, returncode."""

    held = False

    def __init__(self, server: ForkServer, pid: int, stdout) -> None:
        self.server, self.pid, self.stdout, self.returncode = server, pid, stdout, None

    def poll(self) -> int | None:
        return self.server.exit_of(self, 0)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.server.exit_of(self, 0.05) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["python3", "-"], timeout)
        return self.returncode


def _serve(sock: socket.socket) -> None:
    """The fork server's loop: one unit at a time, as the guard asks. Returns only in a forked
    unit, by ChildExit, as the guard's own first fork does."""
    die_with_parent()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    while True:
        try:
            message, fds, _flags, _address = socket.recv_fds(sock, 1 << 16, 1)
        except OSError:
            os._exit(0)
        if not message or not fds:
            os._exit(0)
        request, output = json.loads(message), fds[0]
        env = {str(k): str(v) for k, v in (request.get("env") or {}).items()}
        try:
            if request.get("target"):
                pid = os.fork()
                if pid == 0:
                    sock.close()
                    _run_target(tuple(request["target"]), output, lambda: (own_group(), os.environ.update(env)))
            else:
                def setup():
                    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                        signal.signal(signum, signal.SIG_DFL)  # an ignored signal stays ignored across exec
                    own_group()
                pid = subprocess.Popen(request["argv"], stdout=output, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, preexec_fn=setup,
                                       env=dict(os.environ, **env)).pid
        except OSError as exc:
            os.close(output)
            sock.send(json.dumps({"error": str(exc)}).encode())
            continue
        os.close(output)  # here only: a forked unit ends by ChildExit through this frame
        try:
            os.setpgid(pid, pid)  # also here, so that a stop right away reaches its group
        except OSError:
            pass
        sock.send(json.dumps({"pid": pid}).encode())
        _pid, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        sock.send(json.dumps({"exit": code}).encode())


class UnitProcess:
    """The guard's unit: started (forked from the guard, or from its fork server, or as a
    program of its own), its output passed on to the guard's output, its log and an
    attempt's log, its progress watched (output lines, its heartbeat file), and stopped.
    ``state`` is the unit's record, which it keeps the process's fields in; ``running`` is
    called once it runs."""

    def __init__(self, unit: dict, run_dir: str, poll: float, grace: float, wake: threading.Event, state: dict,
                 running) -> None:
        self.unit, self.run_dir, self.poll_s, self.grace, self.wake = unit, run_dir, poll, grace, wake
        self.state, self.on_running = state, running
        self.child = None
        self.output: threading.Thread | None = None
        self.server: ForkServer | None = None
        self.lock_fd: int | None = None
        self.last_progress = time.monotonic()
        self.has_progressed = False
        self.heartbeat_file = unit.get("heartbeat")
        self.heartbeat_mtime = 0.0
        # The unit's last lines: whether a failure blames a peer (guard_policy.peer_wait_over).
        self.recent: collections.deque[str] = collections.deque(maxlen=20)

    @property
    def waiting(self) -> bool:
        """Whether the unit still waits for the units it starts after: forked and held, or
        (a unit that is not forked) a NotStarted stand-in, which is held for good."""
        return getattr(self.child, "held", False)

    def running_now(self) -> bool:
        return self.child is not None and not self.waiting and self.child.poll() is None

    def poll(self) -> int | None:
        return self.child.poll()

    def start(self, argv: list[str], target, env: dict | None = None, hold: bool = False, attempt: int = 1) -> None:
        """Start the unit: ``argv``, forked where ``target`` (guard_policy.preload_target) says so
        and torch is there, with ``env`` over the guard's own environment. The guard's first
        start forks from the guard itself, which has no thread yet; with ``hold``, a forked
        unit is forked now and runs once a later call releases it (a unit that is not forked
        starts with that later call). Every later start comes from the fork server."""
        if self.waiting and not hold and isinstance(self.child, Forked):
            self.child.release()
            self._running(attempt)
            return
        if self.output is not None:
            # The last attempt's lines first: its reader must not count them as this one's progress.
            self.output.join(OUTPUT_DRAIN_S)
        forkable = target is not None and import_torch()
        if self.child is not None and self.server is not None:
            self.child = self.server.start(target if forkable else None, argv, env or {})
        elif forkable:
            self.child = Forked(target, lambda: self._forked_setup(env), held=hold)
        elif hold:
            self.child = NotStarted()
        else:
            self.child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, preexec_fn=own_group,
                                          env=dict(os.environ, **env) if env else None)
        if not hold:
            self._running(attempt)

    def _forked_setup(self, env: dict | None) -> None:
        own_group()
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # the guard's alone: the unit's life is not the guard's
        if self.server is not None:
            self.server.sock.close()
        os.environ.update(env or {})

    def _running(self, attempt: int) -> None:
        self.last_progress, self.has_progressed = time.monotonic(), False
        self.recent.clear()
        self.output = threading.Thread(target=self._pass_output, args=(self.child, attempt), daemon=True)
        self.output.start()
        self.on_running(self.child.pid)

    def _pass_output(self, child, attempt: int) -> None:
        outs = [sys.stdout.buffer]
        if self.unit.get("log"):
            outs.append(open(self.unit["log"], "ab"))
        if attempt > 1:
            outs.append(open(os.path.join(self.run_dir, self.attempt_log(attempt)), "ab"))
        for line in iter(child.stdout.readline, b""):
            self.last_progress, self.has_progressed = time.monotonic(), True
            self.recent.append(line.decode(errors="replace"))
            for out in outs:
                out.write(line)
                out.flush()
        # The pipe closes a moment before the process can be reaped; a wake in between finds
        # it still running and the loop sleeps a whole poll. Bounded: a unit may close its
        # output and go on.
        try:
            await_exit(child, self.poll_s)
        except subprocess.TimeoutExpired:
            pass
        for out in outs[1:]:
            out.close()
        self.wake.set()

    def attempt_log(self, attempt: int) -> str:
        """The name of the copy of attempt ``attempt``'s lines, beside the unit's log."""
        if self.unit.get("log"):
            log = os.path.basename(self.unit["log"])
        else:
            ranks = self.unit.get("ranks") or []
            log = vocab.unit_log(self.unit["role"], ranks[0] if ranks else None)
        return vocab.attempt_log(log, attempt)

    def stop(self) -> int:
        """SIGTERM to the unit's process group, SIGKILL after the grace period: the exit code
        as a shell reports it. The record says when the first of each was sent
        (``sigterm_at``, ``sigkill_at``). A unit that never started ends as a stopped one
        would (143), and its record says so."""
        if self.waiting:
            if self.child.pid is not None:
                # Held since the guard's start, it ran nothing of the unit: nothing to grant.
                killpg(self.child.pid, signal.SIGKILL)
                await_exit(self.child, None)
            self.state["not_started"] = True
            return policy.exit_code(-signal.SIGTERM)
        if self.child.poll() is None:
            self.state.setdefault("sigterm_at", time.time())
            killpg(self.child.pid, signal.SIGTERM)
            try:
                await_exit(self.child, self.grace)
            except subprocess.TimeoutExpired:
                self.state["sigkill_at"] = time.time()
                killpg(self.child.pid, signal.SIGKILL)
                await_exit(self.child, None)
        else:
            killpg(self.child.pid, signal.SIGKILL)  # what the unit left in its group
        return policy.exit_code(self.child.returncode)

    def progressed(self) -> float:
        """Seconds since the unit last wrote a line or touched its heartbeat file."""
        if self.heartbeat_file:
            try:
                mtime = os.stat(self.heartbeat_file).st_mtime
            except OSError:
                mtime = 0.0
            if mtime > self.heartbeat_mtime:
                self.heartbeat_mtime = mtime
                self.last_progress, self.has_progressed = time.monotonic(), True
        return time.monotonic() - self.last_progress
