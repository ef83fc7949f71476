"""Starts the suite's Python commands (``mmfront worker``, the echo engine, ``python -c`` scripts)
from an interpreter that has imported torch, transformers and mmfront once, instead of a fresh
interpreter each time.

Importing them costs a fresh interpreter about 5 s of CPU, most of what such a command spends in a
test; the suite starts dozens, on CI's two cores (docs/testing.md, "`make test` and its 15-minute
budget"). :func:`popen` takes ``subprocess.Popen``'s arguments and returns an object with its
face, so a test reads the same either way; the command runs in a child forked by a multiprocessing
forkserver (a fresh, single-threaded interpreter that only imports and forks), exactly as the
interpreter would run it (``runpy`` for ``-m`` and script paths, ``exec`` for ``-c``), with the
environment, working directory, session and streams it was given.

What it does not give is a fresh interpreter, so these start real ones: tests of what importing
does (``import mmfront`` stays light, the torchvision and torchaudio shims, a script without a
``__main__`` guard), of a process's life and death (parent-death signals, a writer's SIGTERM),
and of what the product itself starts (``mmfront serve`` and its engines, the lane parent's own
start). The lane tests that are not about the parent start it from here
(``lane_processes.preloaded_lane_parents``).
A request's peak memory measured in a fork equals the fresh interpreter's within 1% (66.5 against
67.0 MB for the largest image, 256.3 against 257.8 MB for a long WAV), so those tests fork.
"""

from __future__ import annotations

import atexit
import io
import multiprocessing
import multiprocessing.connection
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from multiprocessing.connection import Connection
from typing import IO, Any

_PRELOAD = [  # mmfront first: its torchvision and torchaudio shims must be in place before either imports
    "mmfront", "torch", "transformers", "transformers.processing_utils", "transformers.image_processing_utils",
    "mmfront.cli", "mmfront.preprocess", "mmfront.engine.worker", "mmfront.engine.receiver",
    "mmfront.engine.runner", "mmfront.models.gemma3", "mmfront.fixtures.models.gemma3",
]
CONTEXT = multiprocessing.get_context("forkserver")
"""Also for tests that start their own ``multiprocessing`` children: the same preloaded forks."""
CONTEXT.set_forkserver_preload(_PRELOAD)


def _redirect(fd: int, target: Connection | None) -> None:
    if target is not None:
        os.dup2(target.fileno(), fd)
        target.close()


def _run(argv: list[str], env: dict[str, str], cwd: str, new_session: bool,
         stdout: Connection | None, stderr: Connection | None, stderr_to_stdout: bool,
         passed: dict[int, Connection]) -> None:
    """The child: the environment, streams and descriptors it was given, then the command as
    ``python`` runs it, then the interpreter's exit handlers (a forked child would skip them)."""
    if new_session:
        os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    _redirect(1, stdout)
    _redirect(2, stderr)
    if stderr_to_stdout:
        os.dup2(1, 2)
    received = {conn.fileno() for conn in passed.values()}
    for number, conn in passed.items():  # at the caller's numbers, as ``pass_fds`` keeps them
        if number != conn.fileno():
            taken = number in received or os.path.exists(f"/proc/self/fd/{number}")
            assert not taken, f"descriptor {number} to pass is in use in the preloaded child"
            os.dup2(conn.fileno(), number)
            conn.close()
        os.set_inheritable(number, True)
    sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), line_buffering=True)
    sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), line_buffering=True)
    if env.get("OMP_NUM_THREADS", "").isdigit():  # OpenMP read it when the preloaded torch loaded
        sys.modules["torch"].set_num_threads(int(env["OMP_NUM_THREADS"]))
    for entry in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    first, *rest = argv[1:]
    try:
        if first == "-m":
            sys.argv = rest
            runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
        elif first == "-c":
            sys.argv = ["-c", *rest[1:]]
            exec(compile(rest[0], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = [first, *rest]
            sys.path.insert(0, os.path.dirname(os.path.abspath(first)))
            runpy.run_path(first, run_name="__main__")
    finally:
        atexit._run_exitfuncs()


class Preloaded:
    """A command started by :func:`popen`: ``pid``, ``args``, ``stdout``, ``stderr``,
    ``returncode``, ``poll``, ``wait``, ``communicate``, ``send_signal``, ``terminate``, ``kill``,
    as ``subprocess.Popen`` has them. Thread-safe: an engine client's watcher may poll it while
    the test waits."""

    def __init__(self, args: list[str], process: Any, stdout: IO[Any] | None, stderr: IO[Any] | None) -> None:
        self.args = args
        self.process = process
        self.stdout = stdout
        self.stderr = stderr
        self.pid: int = process.pid
        self._lock = threading.Lock()  # multiprocessing reads the exit code off a pipe once
        self._readers: list[threading.Thread] = []
        self._read: dict[str, Any] = {}

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        with self._lock:
            return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        multiprocessing.connection.wait([self.process.sentinel], timeout)  # readable once it has exited
        code = self.poll()
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return code

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        """All of stdout and stderr (pipes) once the command has exited; ``TimeoutExpired`` keeps
        what was read for the next call, as ``Popen.communicate`` does."""
        if not self._readers:
            self._readers = [threading.Thread(target=self._read_all, args=(name,), daemon=True)
                             for name in ("stdout", "stderr") if getattr(self, name) is not None]
            for reader in self._readers:
                reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._read.get("stdout"), self._read.get("stderr")

    def _read_all(self, name: str) -> None:
        stream = getattr(self, name)
        self._read[name] = stream.read()
        stream.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self) -> Preloaded:
        return self

    def __exit__(self, *exc: object) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


def _stream(spec: Any, text: bool) -> tuple[Connection | None, IO[Any] | None]:
    """(the end the child writes to, the end this process reads when ``spec`` is ``PIPE``)."""
    if spec is None:
        return None, None
    if spec == subprocess.PIPE:
        read, write = os.pipe()
        return Connection(write, readable=False), os.fdopen(read, "r" if text else "rb")
    fd = spec if isinstance(spec, int) else spec.fileno()
    return Connection(os.dup(fd), readable=False), None


def popen(args: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
          stdout: Any = None, stderr: Any = None, text: bool = False, start_new_session: bool = False,
          stdin: Any = None, pass_fds: Sequence[int] = ()) -> Preloaded:
    """``subprocess.Popen(args, ...)`` for ``[sys.executable, "-m" | "-c" | script, ...]``, run
    from the preloaded interpreter (see the module's docstring). The child's stdin is /dev/null;
    ``pass_fds`` are open in it at the same numbers, inheritable."""
    argv = [str(a) for a in args]
    if argv[0] != sys.executable or len(argv) < (3 if argv[1:2] in (["-m"], ["-c"]) else 2) \
            or stdin not in (None, subprocess.DEVNULL):
        raise ValueError(f"not a command of this interpreter with no stdin: {argv}")
    out, out_read = _stream(stdout, text)
    to_stdout = stderr == subprocess.STDOUT
    err, err_read = (None, None) if to_stdout else _stream(stderr, text)
    passed = {fd: Connection(os.dup(fd)) for fd in pass_fds}
    process = CONTEXT.Process(
        target=_run, args=(argv, dict(os.environ if env is None else env), os.getcwd() if cwd is None else str(cwd),
                           start_new_session, out, err, to_stdout, passed),
        daemon=True)  # never outlives the test session
    try:
        process.start()
    finally:
        for conn in (out, err, *passed.values()):
            if conn is not None:
                conn.close()
    return Preloaded(argv, process, out_read, err_read)


def run(args: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float | None = None,
        check: bool = False) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(args, capture_output=True, text=True, ...)`` from the preloaded interpreter."""
    process = popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    done = subprocess.CompletedProcess(process.args, process.wait(), out, err)
    if check:
        done.check_returncode()
    return done
