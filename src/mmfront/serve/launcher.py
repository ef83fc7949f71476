"""What ``mmfront serve`` does after parsing: start the engines, meet them, serve HTTP, stop.

The engines come the way ``vllm serve`` brings them: ``data_parallel_size_local`` of them are
started here (ranks ``0 .. local - 1``) and meet this API server through vLLM's start-up
handshake; the remaining ranks are headless engines started elsewhere (``vllm serve MODEL
--headless`` or ``mmfront worker MODEL --data-parallel-address HEAD``) that connect to
``tcp://data_parallel_address:data_parallel_rpc_port``. The local ones are vLLM's engine cores
(``--engine vllm``: one ``vllm serve MODEL --headless`` process per rank, with the user's engine
flags, :mod:`mmfront.serve.vllm_engine`; they greet a ``tcp`` handshake on
``data_parallel_address``, on a free port when every engine is local, as headless engines do) or
``mmfront worker`` processes (``--engine mmfront``, over ``ipc`` when every engine is local).

Local engines are this process's children for their whole life: each runs in its own session
(a Ctrl-C at the terminal reaches only the server, which then stops them in order), is told by
the kernel to stop when the server dies (``PR_SET_PDEATHSIG`` on Linux), and its process group
(vLLM's engine core runs in a child of its ``vllm serve``) is stopped with SIGTERM, then SIGKILL
after a grace period, when the server shuts down or exits (``atexit``). One
that exits on its own is a dead engine: the client watches each local engine's process
(``AsyncEngineClient.watch_process``), so the requests that rank owed fail at once and
``/health`` answers 503; the launcher logs the exit.

Start and stop follow ``vllm serve``: the HTTP port is bound before anything starts (a port in
use fails at once), ``--max-model-len`` is checked against the model's limit, a banner names the
model, the engines and the addresses, and the wait for headless engines is logged every
:data:`WAIT_LOG_INTERVAL_S`. An engine's death stops the server with status 1 (a supervisor
restarts it), as vLLM 0.33's API server exits, unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH`` is set:
then it stays up, answering 503 on ``/health`` until the rank is heard again, and the handshake
socket stays open, so that a headless engine restarted elsewhere (vLLM's or ``mmfront worker``)
greets it again and rejoins as its rank (:class:`~mmfront.engine.handshake.RejoinListener`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import gc
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from mmfront.cache import ShmObjectStoreSenderCache
from mmfront.config import DataParallelConfig, MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient, exit_fd
from mmfront.engine.handshake import EngineInfo, FrontendHandshake, RejoinListener
from mmfront.engine.transports import ZmqAddresses, ZmqFrontendTransport
from mmfront.errors import AddressInUseError, ConfigError, HandshakeError
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.serve.banner import engines_banner, listen_address, log_routes
from mmfront.serve.model_limits import check_max_model_len
from mmfront.serve.settings import LocalEngineOptions, ServePlan, ServeSettings
from mmfront.serve.vllm_engine import VLLM_ENGINE_KIND, VLLM_ENGINE_NAME, tcp_host_port, vllm_engine_command

if TYPE_CHECKING:
    from mmfront.serve.http_protocol import HttpLimits

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

STOP_GRACE_S = 10.0
"""How long a local engine gets to stop after SIGTERM before it is killed."""
_WATCH_INTERVAL_S = 0.2
GROUP_SETTLE_S = 1.0
"""How long what is left of a stopped engine's process group may take to end on its own before it
is killed: vLLM's resource tracker, unlinking the shared memory of the engine core its
``vllm serve --headless`` killed, ends when that process has."""
_SETTLE_POLL_S = 0.02
WAIT_LOG_INTERVAL_S = 10.0
"""How often the wait for headless engines is logged (vLLM's ``wait_for_engine_startup`` polls as often)."""
KEEP_ALIVE = "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH"
ENGINE_NAME = "mmfront worker"
ENGINE_KIND = f"{ENGINE_NAME} (mmfront's reference engine on HF transformers)"
"""What the local engines are with ``--engine mmfront``, as the banner says it."""
ENGINE_DEATH_STATUS = 1
"""The server's exit status after an engine died (not kept alive)."""


def keep_alive_on_engine_death(env: Mapping[str, str] = os.environ) -> bool:
    """``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH`` as vLLM 0.33 reads it (``bool(int(value))``: ``1`` keeps the
    server up, ``0`` or unset lets it exit); a value that is not an integer is refused."""
    value = env.get(KEEP_ALIVE, "0")
    try:
        return bool(int(value))
    except ValueError:
        raise ConfigError(f"{KEEP_ALIVE}={value!r}: give 1 (keep the server up after an engine dies) or 0.") from None


def listening_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A socket bound on ``host``:``port`` (``reuse_port``: other ``SO_REUSEPORT`` sockets of this
    user may share it, for ``--api-server-count``); :class:`~mmfront.errors.AddressInUseError` when the
    address is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise AddressInUseError(f"Cannot listen on {host}:{port}: {e.strerror or e}. Another process holds the "
                                "port: stop it or choose another --port.") from e
    return sock


def worker_command(
    model: Path, rank: int, handshakes: Sequence[str], config: MultiModalConfig, options: LocalEngineOptions, *,
    shm_names: Sequence[str] = (),
) -> list[str]:
    """``mmfront worker`` as this server starts engine ``rank``: a local engine meeting each API
    server through its handshake address (one per API server), with the processor cache they
    mirror (``shm``: one segment name per API server, in the same order)."""
    command = [sys.executable, "-m", "mmfront.cli", "worker", str(model)]
    for address in handshakes:
        command += ["--handshake", address]
    command += ["--local", "--engine-index", str(rank), "--cache", config.mm_processor_cache_type,
                "--cache-gb", str(config.mm_processor_cache_gb)]
    for name in shm_names:
        command += ["--shm-name", name]
    if options.device is not None:
        command += ["--device", options.device]
    if options.dtype is not None:
        command += ["--dtype", options.dtype]
    return command


def engine_kind(plan: ServePlan) -> str:
    """What the local engines of ``plan`` are, as the banner says it."""
    return VLLM_ENGINE_KIND if plan.engine.engine == "vllm" else ENGINE_KIND


def engine_name(plan: ServePlan) -> str:
    """The local engines' name in logs and errors."""
    return VLLM_ENGINE_NAME if plan.engine.engine == "vllm" else ENGINE_NAME


def handshake_parallel(plan: ServePlan) -> DataParallelConfig:
    """The handshake's view of the ranks: ``plan.parallel``, except that vLLM's engines started here
    greet as headless ones (vLLM's CLI starts no other kind), on a ``tcp`` handshake on
    ``data_parallel_address``: on a free port when every engine is local."""
    parallel = plan.parallel
    if plan.engine.engine != "vllm" or not parallel.local_ranks:
        return parallel
    return dataclasses.replace(parallel, data_parallel_size_local=0,
                               data_parallel_rpc_port=0 if parallel.all_local else parallel.data_parallel_rpc_port)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the server process dies, even by SIGKILL (Linux)."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


class LastingSpawner:
    """Starts processes from one daemon thread that lives as long as this process, for callers
    off the main thread: Linux sends the parent-death signal when the *thread* that forked a child
    ends, so an engine started from a short-lived thread (a test's, an executor's) would be told
    to stop as that thread ends, while its server lives on. The main thread lasts as long as the
    process and starts its engines itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] | None = None

    def run(self, start: Callable[[], _T]) -> _T:
        """``start()`` on the main thread or on the lasting one; its result or exception."""
        if threading.current_thread() is threading.main_thread():
            return start()
        with self._lock:
            if self._queue is None:
                self._queue = queue.SimpleQueue()
                threading.Thread(target=self._loop, args=(self._queue,), name="mmfront-engine-spawner",
                                 daemon=True).start()
        future: Future[_T] = Future()
        self._queue.put((start, future))
        return future.result()

    @staticmethod
    def _loop(jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]]) -> None:
        while True:
            start, future = jobs.get()
            try:
                future.set_result(start())
            except BaseException as e:  # handed to the caller
                future.set_exception(e)


SPAWNER = LastingSpawner()
"""The one lasting thread that starts local engines for callers off the main thread."""


class EngineProcesses:
    """The local engine processes, by rank: started, watched and stopped by this server."""

    def __init__(self, commands: Sequence[Sequence[str]], *, env: dict[str, str] | None = None,
                 name: str = ENGINE_NAME) -> None:
        self.name = name
        """What the engines are, in logs and errors (``mmfront worker``, vLLM's engine core)."""
        self.processes: list[subprocess.Popen[bytes]] = []
        self.stopping = threading.Event()
        self._watcher: threading.Thread | None = None
        self._on_exit: Callable[[int, int], None] | None = None
        self._reported: set[int] = set()
        self._report_lock = threading.Lock()
        self._terminated_at = 0.0
        atexit.register(self.stop)
        linux = sys.platform.startswith("linux")

        def start(command: Sequence[str]) -> subprocess.Popen[bytes]:
            return subprocess.Popen(list(command), env=env, start_new_session=True,
                                    preexec_fn=_die_with_parent if linux else None)  # noqa: PLW1509 (prctl only)

        try:
            for command in commands:
                self.processes.append(SPAWNER.run(partial(start, command)))
        except OSError:
            self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.processes]

    def exited(self) -> list[tuple[int, int]]:
        """``(rank, exit status)`` of every engine that has exited."""
        return [(rank, code) for rank, p in enumerate(self.processes) if (code := p.poll()) is not None]

    def watch(self, on_exit: Callable[[int, int], None]) -> None:
        """Call ``on_exit(rank, status)`` once for each engine that exits before :meth:`stop`: from a
        thread, and from :meth:`stop` itself for an exit the thread had not seen yet (the server may
        stop on the client's news of the death before the thread's next look)."""
        self._on_exit = on_exit

        def run() -> None:
            exits = {fd: p for p in self.processes if (fd := exit_fd(p)) is not None}
            if len(exits) < len(self.processes):
                for fd in exits:
                    os.close(fd)
                while not self.stopping.wait(_WATCH_INTERVAL_S):
                    self._report_exits()
                return
            try:  # each pidfd turns readable once its engine exits (stop() makes them all exit)
                while exits and not self.stopping.is_set():
                    ended, _, _ = select.select(list(exits), [], [])
                    self._report_exits()
                    for fd in ended:
                        # poll() says nothing while another thread's wait() reaps it: look again
                        if exits[fd].poll() is not None:
                            del exits[fd]
                            os.close(fd)
                    if any(fd in exits for fd in ended):
                        self.stopping.wait(_WATCH_INTERVAL_S)
            finally:
                for fd in exits:
                    os.close(fd)

        self._watcher = threading.Thread(target=run, name="mmfront-engine-watch", daemon=True)
        self._watcher.start()

    def _report_exits(self) -> None:
        with self._report_lock:
            if self._on_exit is None or self.stopping.is_set():
                return  # after stop() began, exits are the ones it asked for
            for rank, code in self.exited():
                if rank not in self._reported:
                    self._reported.add(rank)
                    self._on_exit(rank, code)

    def terminate(self) -> None:
        """SIGTERM every running engine's process group (once), so that the engines stop while the
        server closes the rest; :meth:`stop` waits for them."""
        self._report_exits()
        with self._report_lock:
            if self.stopping.is_set():
                return
            self.stopping.set()
        self._terminated_at = time.monotonic()
        for p in self.processes:
            if p.poll() is None:
                _signal_group(p, signal.SIGTERM)

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM every engine's process group (unless :meth:`terminate` did), SIGKILL the engines
        still running ``grace_s`` after it; then SIGKILL what is left of each group (a child its
        engine left behind) once it had :data:`GROUP_SETTLE_S` to end on its own."""
        self.terminate()
        deadline = self._terminated_at + grace_s
        for p in self.processes:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()
            settled = time.monotonic() + GROUP_SETTLE_S
            while group_running(p.pid) and time.monotonic() < settled:
                time.sleep(_SETTLE_POLL_S)
            _signal_group(p, signal.SIGKILL)
        atexit.unregister(self.stop)


def group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` runs: zombies aside where ``/proc`` tells (a process
    reparented to an init that reaps nothing stays one), else any process of the group."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                state, _, group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
            except (OSError, IndexError, ValueError):
                continue
            if int(group) == pgid and state != "Z":
                return True
    return False


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    """Signal ``process``'s group: it leads one (its own session, :class:`EngineProcesses`), which
    outlives it while a child it left behind runs."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signum)


def log_engine_exit(rank: int, status: int, engine: str = ENGINE_NAME) -> None:
    """What ``mmfront serve`` does when a local engine exits unasked: say which and how (the
    client has failed what that rank owed; the watchdog of :func:`run_app` decides what follows)."""
    how = f"killed by signal {-status}" if status < 0 else f"exit status {status}"
    logger.error("Engine rank %d (%s) died: %s. The requests it had fail.", rank, engine, how)


@dataclass
class Frontend:
    """One API server's side of the engine link, ready to serve: the client, and the engines it
    started (``None`` when every engine is headless)."""

    client: AsyncEngineClient
    preprocessor: InputPreprocessor
    engines: EngineProcesses | None
    infos: list[EngineInfo]
    rejoins: RejoinListener | None = None
    """The handshake kept open for restarted headless engines (``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``)."""

    def close(self) -> None:
        """Stop the engines this server started, the client and the processing: the engines are
        told first and waited for last, so that they stop while the rest closes."""
        if self.rejoins is not None:
            self.rejoins.close()
        if self.engines is not None:
            self.engines.terminate()
        try:
            self.client.close_blocking()
            self.preprocessor.close()
        finally:
            if self.engines is not None:
                self.engines.stop()


class _EngineWait:
    """``handshake.wait`` on a daemon thread, so that a local engine exiting during start-up
    fails the start at once. The wait cannot be interrupted: once abandoned, the thread closes
    the handshake and the transport itself when its wait ends (they are not thread-safe)."""

    def __init__(self, handshake: FrontendHandshake, transport: ZmqFrontendTransport, timeout: float) -> None:
        self.handshake = handshake
        self.transport = transport
        self.done = threading.Event()
        self.abandoned = threading.Event()
        self.result: list[EngineInfo] | BaseException = HandshakeError("The handshake did not run.")
        threading.Thread(target=self._run, args=(timeout,), name="mmfront-handshake", daemon=True).start()

    def _run(self, timeout: float) -> None:
        try:
            self.result = self.handshake.wait(timeout)
        except BaseException as e:  # handed to the waiting thread
            self.result = e
        finally:
            self.done.set()
            if self.abandoned.is_set():
                self.handshake.close()
                self.transport.close()

    def join(self, engines: EngineProcesses | None, waiting: str | None = None) -> list[EngineInfo]:
        """The engines' start-up answers; :class:`HandshakeError` naming a local engine that exited
        first. ``waiting`` is logged every :data:`WAIT_LOG_INTERVAL_S` while the wait lasts."""
        started = logged = time.monotonic()
        try:
            while not self.done.wait(_WATCH_INTERVAL_S):
                if waiting is not None and time.monotonic() - logged >= WAIT_LOG_INTERVAL_S:
                    logged = time.monotonic()
                    logger.info("%s (%.0f s so far)", waiting, logged - started)
                exited = engines.exited() if engines is not None else []
                if exited and engines is not None:
                    rank, code = exited[0]
                    raise HandshakeError(f"Engine rank {rank} ({engines.name}) exited with status {code} before it "
                                         "was ready; its output above says why.")
        except BaseException:
            self.abandoned.set()
            if self.done.is_set():
                self.handshake.close()
                self.transport.close()
            raise
        if isinstance(self.result, BaseException):  # the handshake failed: nothing is left to meet
            self.handshake.close()
            self.transport.close()
            raise self.result
        return self.result


@dataclass
class Link:
    """One API server's side of the engine link, bound and not yet met: the processing and the
    data sockets (``transport``)."""

    preprocessor: InputPreprocessor
    transport: ZmqFrontendTransport

    @property
    def shm_name(self) -> str | None:
        """The ``shm`` cache's segment, which the engines read (``None`` for other caches)."""
        cache = self.preprocessor.cache
        return cache.shm_name if isinstance(cache, ShmObjectStoreSenderCache) else None

    def close(self) -> None:
        self.transport.close()
        self.preprocessor.close()


def bind_link(plan: ServePlan, *, client_index: int = 0) -> Link:
    """Load the processing and bind the data sockets: ``ipc`` when every engine is local, else
    ``tcp`` on ``data_parallel_address``, as vLLM binds."""
    parallel = plan.parallel
    preprocessor = InputPreprocessor(plan.model_folder, plan.config)
    try:
        preprocessor.warmup()
        transport = (ZmqFrontendTransport("ipc", client_index=client_index) if parallel.all_local
                     else ZmqFrontendTransport("tcp", host=parallel.data_parallel_address, client_index=client_index))
    except BaseException:
        preprocessor.close()
        raise
    return Link(preprocessor, transport)


def bind_handshake(link: Link, plan: ServePlan, other_frontends: Sequence[ZmqAddresses] = ()) -> FrontendHandshake:
    """The handshake socket engines greet: a private ``ipc`` path when every engine is a local
    ``mmfront worker``, else ``tcp://data_parallel_address:data_parallel_rpc_port``
    (:func:`handshake_parallel`). It names every API server's sockets, this one's first
    (``other_frontends``: the others', with ``--api-server-count``)."""
    try:
        return FrontendHandshake(link.transport, handshake_parallel(plan), other_frontends=other_frontends)
    except BaseException:
        link.close()
        raise


def client_over(link: Link, plan: ServePlan, infos: list[EngineInfo], engines: EngineProcesses | None) -> Frontend:
    """The client over the engines met (``infos``), watching the processes of ``engines`` (an
    exit is that rank's death). Without ``engines`` and with every engine local (another process
    started them: ``--api-server-count``), a dropped connection is an engine's death."""
    try:
        if engines is None and plan.parallel.all_local:
            link.transport.watch_disconnects()  # a local engine's connection drops only when its process ends
        client = AsyncEngineClient(InputProcessor(link.preprocessor), link.transport, engines=infos,
                                   engine_timeout_s=plan.engine_timeout_s)
        for rank, process in enumerate(engines.processes if engines is not None else []):
            client.watch_process(rank, process)
    except BaseException:
        link.close()
        raise
    return Frontend(client, link.preprocessor, engines, infos)


def meet_engines(link: Link, handshake: FrontendHandshake, plan: ServePlan,
                 engines: EngineProcesses | None, *, keep_open: bool = False) -> list[EngineInfo]:
    """Every rank's start-up answer through ``handshake`` (failing at once, naming the rank, when
    a local engine of ``engines`` exits first); the handshake is closed after, unless
    ``keep_open`` (for :class:`RejoinListener`). On failure the link is closed. The wait for
    headless ranks is logged every :data:`WAIT_LOG_INTERVAL_S`, as vLLM logs its own."""
    parallel = plan.parallel
    headless = parallel.data_parallel_size - parallel.local_ranks  # the local ones are started by this command
    waiting = None
    if headless:
        waiting = f"Waiting for {headless} engine(s) at {handshake.address}"
        logger.info("%s: start them with 'vllm serve MODEL --headless' or 'mmfront worker MODEL "
                    "--data-parallel-address %s --data-parallel-rpc-port %d'", waiting,
                    parallel.data_parallel_address, parallel.data_parallel_rpc_port)
    try:
        infos = _EngineWait(handshake, link.transport, plan.engine_ready_timeout_s).join(engines, waiting)
    except BaseException:
        link.preprocessor.close()
        raise
    if not keep_open:
        handshake.close()
    return infos


def engine_commands(plan: ServePlan, handshake: str, shm_names: Sequence[str | None]) -> list[list[str]]:
    """The command line of each local engine (rank ``0 .. data_parallel_size_local - 1``), greeting
    ``handshake``: vLLM's ``vllm serve MODEL --headless`` or ``mmfront worker``."""
    ranks = range(plan.parallel.local_ranks)
    if plan.engine.engine == "vllm":
        host, port = tcp_host_port(handshake)
        return [vllm_engine_command(plan.engine.vllm_cli, plan.engine.vllm_args, rank,
                                    plan.parallel.data_parallel_size, handshake_host=host, handshake_port=port)
                for rank in ranks]
    names = [name for name in shm_names if name is not None]
    return [worker_command(plan.model_folder, rank, [handshake], plan.config, plan.engine, shm_names=names)
            for rank in ranks]


def start_engines(plan: ServePlan, handshake: str, shm_names: Sequence[str | None],
                  env: dict[str, str] | None = None) -> EngineProcesses | None:
    """The ``data_parallel_size_local`` local engines, each greeting ``handshake``;
    ``None`` when every engine is headless."""
    if not plan.parallel.local_ranks:
        return None
    return EngineProcesses(engine_commands(plan, handshake, shm_names), env=env, name=engine_name(plan))


def start_frontend(plan: ServePlan, *, env: dict[str, str] | None = None,
                   on_engine_exit: Callable[[int, int], None] | None = None, keep_alive: bool = False) -> Frontend:
    """One API server: bind the engine link, start the local engines, meet every rank through
    the handshake and return the client. On any failure what was started is stopped again. A
    local engine's exit is logged (:func:`log_engine_exit`) unless ``on_engine_exit`` is given;
    with ``keep_alive`` and headless ranks, the handshake stays open for their restarts
    (:class:`RejoinListener`)."""
    link = bind_link(plan)
    handshake = bind_handshake(link, plan)
    try:
        engines = start_engines(plan, handshake.address, [link.shm_name], env)
    except BaseException:
        handshake.close()
        link.close()
        raise
    rejoinable = range(plan.parallel.local_ranks, plan.parallel.data_parallel_size) if keep_alive else range(0)
    try:
        infos = meet_engines(link, handshake, plan, engines, keep_open=bool(rejoinable))
        frontend = client_over(link, plan, infos, engines)
    except BaseException:
        if engines is not None:
            engines.stop()
        raise
    if rejoinable:
        frontend.rejoins = RejoinListener(handshake, infos, rejoinable, frontend.client.engine_rejoined)
    if engines is not None:
        engines.watch(on_engine_exit or functools.partial(log_engine_exit, engine=engines.name))
    return frontend


def run_app(frontend: Frontend, settings: ServeSettings, sockets: list[socket.socket] | None = None, *,
            keep_alive: bool = False) -> int:
    """The app over ``frontend.client`` under uvicorn until SIGINT or SIGTERM (on ``sockets``
    when given, else on ``settings.host``:``settings.port``), then close the frontend; the exit
    status: 0, or :data:`ENGINE_DEATH_STATUS` when an engine died and ``keep_alive`` is off (the
    server shuts down as on SIGTERM, as vLLM 0.33's watchdog stops its server).

    uvicorn shuts down gracefully on either signal, then raises it again with the handler it
    found; SIGTERM's is set here to end the process through ``finally``, so the engines are
    stopped in order and the processing lanes closed."""
    from mmfront.serve.app import create_app
    from mmfront.serve.quiet_server import QuietServer

    signal.signal(signal.SIGTERM, exit_on_sigterm)
    show_logs()
    watchdog = None
    try:
        app = create_app(frontend.client, settings)
        log_routes(listen_address(settings), app.routes)
        server = QuietServer(uvicorn_config(app, settings))
        watchdog = EngineWatchdog(frontend, server, keep_alive)
        freeze_startup_heap()
        with contextlib.suppress(KeyboardInterrupt):
            server.run(sockets=sockets)
    finally:
        if watchdog is not None:
            watchdog.stop()
        frontend.close()
    return ENGINE_DEATH_STATUS if watchdog is not None and watchdog.stopped_server else 0


def freeze_startup_heap() -> None:
    """vLLM's ``freeze_gc_heap``, which its server runs once started: what start-up left is
    collected, then frozen, so that the collector's oldest generation no longer walks the
    process's models, tokenizers and modules on every full collection while requests wait (a
    full collection of an `mmfront serve` heap took ~120 ms)."""
    for generation in range(3):
        gc.collect(generation)
    gc.freeze()


class EngineWatchdog:
    """Watches the client for dead engines from a thread: logs each death (with the client's
    reason: a local engine's exit status, a headless one's dropped link or silence) and, unless
    kept alive, tells uvicorn to shut down (``should_exit``, which wakes :class:`QuietServer`).
    The thread sleeps until the client reports a change of health (it polled five times a second)."""

    def __init__(self, frontend: Frontend, server: Any, keep_alive: bool) -> None:
        self.frontend = frontend
        self.server = server
        self.keep_alive = keep_alive
        self.stopped_server = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._wake.set()  # look once at the start: an engine may have died already
        frontend.client.add_health_observer(self._wake.set)
        self._thread = threading.Thread(target=self._run, name="mmfront-engine-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = self.frontend.client
        reported = False
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            if not client.errored:
                if reported:
                    logger.info("Every engine answers again: /health answers 200.")
                reported = False
                continue
            if reported:
                continue
            reported = True
            if self.keep_alive:
                logger.error("%s The server stays up (%s=1): /health answers 503 until the engine is back.",
                             client.dead_error, KEEP_ALIVE)
                continue
            logger.error("%s Stopping the server (exit status %d) as vllm serve does; set %s=1 to keep it up.",
                         client.dead_error, ENGINE_DEATH_STATUS, KEEP_ALIVE)
            self.stopped_server = True
            self.server.should_exit = True
            return

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(5)


def uvicorn_config(app: Any, settings: ServeSettings) -> Any:
    """uvicorn's configuration for ``app`` from ``vllm serve``'s HTTP flags (TLS, Unix socket,
    access log; the root path is the app's, as FastAPI's); the paths of ``--disable-access-log-for-endpoints`` are filtered out
    of the access log. Connections are :class:`LimitedHttpToolsProtocol`'s, under the settings'
    :class:`HttpLimits`, with the open-file soft limit raised first (vLLM's ``set_ulimit``), and
    large buffers (request bodies) given back to the OS when freed."""
    import uvicorn

    from mmfront.serve.http_protocol import LimitedHttpToolsProtocol, raise_fd_soft_limit
    from mmfront.wire.allocator import unmap_large_buffers

    unmap_large_buffers()

    if settings.disable_access_log_for_endpoints:
        quiet = frozenset(p.strip() for p in settings.disable_access_log_for_endpoints.split(",") if p.strip())
        logging.getLogger("uvicorn.access").addFilter(AccessLogFilter(quiet))
    return uvicorn.Config(
        app, host=settings.host, port=settings.port, uds=settings.uds, log_level=settings.uvicorn_log_level,
        access_log=not settings.disable_uvicorn_access_log,
        ssl_keyfile=settings.ssl_keyfile, ssl_certfile=settings.ssl_certfile, ssl_ca_certs=settings.ssl_ca_certs,
        ssl_cert_reqs=settings.ssl_cert_reqs, ssl_ciphers=settings.ssl_ciphers,
        http=cast(Any, partial(LimitedHttpToolsProtocol, limits=http_limits(settings, raise_fd_soft_limit()))),
        timeout_keep_alive=settings.http_timeout_keep_alive)


def http_limits(settings: ServeSettings, fd_soft_limit: int) -> HttpLimits:
    """The bounds every HTTP connection is held to (docs/security.md, "The HTTP front door")."""
    from mmfront.serve.http_protocol import HttpLimits, connection_cap

    return HttpLimits(
        header_read_timeout_s=settings.header_read_timeout, body_read_timeout_s=settings.body_read_timeout,
        max_head_bytes=settings.h11_max_incomplete_event_size, max_header_count=settings.h11_max_header_count,
        max_url_bytes=settings.max_url_length, max_connections=connection_cap(settings.max_connections, fd_soft_limit))


def show_logs() -> None:
    """mmfront's INFO logs (request logs among them) go to stderr, as vLLM's do, unless the
    embedding application configured the ``mmfront`` logger itself."""
    root = logging.getLogger("mmfront")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(name)s] %(message)s", "%m-%d %H:%M:%S"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)


class AccessLogFilter(logging.Filter):
    """Drops uvicorn access-log records of the given paths (their query string aside)."""

    def __init__(self, paths: frozenset[str]) -> None:
        super().__init__()
        self.paths = paths

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            return args[2].split("?", 1)[0] not in self.paths
        return True


def exit_on_sigterm(signum: int, frame: object) -> None:
    """A SIGTERM handler that ends the process through ``finally`` blocks (status 0)."""
    raise SystemExit(0)


def check_start(plan: ServePlan) -> None:
    """What is refused before anything starts, as ``vllm serve`` refuses it: a
    ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH`` that is not an integer, a ``--max-model-len`` above the model's limit."""
    keep_alive_on_engine_death()
    check_max_model_len(plan.config.max_model_len, plan.model_folder,
                        trust_remote_code=plan.config.trust_remote_code)


def http_sockets(settings: ServeSettings) -> list[socket.socket] | None:
    """The HTTP socket, bound now so that a port in use fails before any engine starts
    (``None`` for ``--uds``, which uvicorn binds)."""
    return None if settings.uds else [listening_socket(settings.host, settings.port)]


def serve(plan: ServePlan) -> int:
    """Run ``mmfront serve`` with one API server until SIGINT or SIGTERM, or an engine's death
    (status :data:`ENGINE_DEATH_STATUS` unless kept alive): the port, the checks, the engines, the
    client, the app under uvicorn."""
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    show_logs()
    sockets = http_sockets(plan.settings)
    try:
        check_start(plan)
        logger.info("%s", engines_banner(plan, engine_kind(plan)))
        frontend = start_frontend(plan, keep_alive=keep_alive_on_engine_death())
    except BaseException:
        for sock in sockets or []:
            sock.close()
        raise
    return run_app(frontend, plan.settings, sockets, keep_alive=keep_alive_on_engine_death())


__all__ = [
    "ENGINE_DEATH_STATUS",
    "ENGINE_KIND",
    "ENGINE_NAME",
    "GROUP_SETTLE_S",
    "KEEP_ALIVE",
    "SPAWNER",
    "WAIT_LOG_INTERVAL_S",
    "AccessLogFilter",
    "EngineProcesses",
    "EngineWatchdog",
    "Frontend",
    "LastingSpawner",
    "Link",
    "bind_handshake",
    "bind_link",
    "check_start",
    "client_over",
    "engine_commands",
    "engine_kind",
    "engine_name",
    "exit_on_sigterm",
    "freeze_startup_heap",
    "group_running",
    "handshake_parallel",
    "http_limits",
    "http_sockets",
    "keep_alive_on_engine_death",
    "listening_socket",
    "log_engine_exit",
    "meet_engines",
    "run_app",
    "serve",
    "show_logs",
    "start_engines",
    "start_frontend",
    "uvicorn_config",
    "worker_command",
]
