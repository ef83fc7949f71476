"""``mmfront serve --api-server-count N``: N API server processes on one port, every engine
connected to each of them, as ``vllm serve --api-server-count N`` runs.

Each API server process is a whole frontend: its own processing (and lanes), its own P0
processor cache, its own data sockets (``ZmqFrontendTransport`` with its ``client_index``). API
server 0 runs vLLM's start-up handshake and names every server's sockets in its answer
(``other_frontends``), so each engine, local (``mmfront worker``) or headless (vLLM's or
mmfront's), connects to all of them and writes its ready response to each; the others read
theirs (``wait_for_ready_responses``). An engine keeps one receiver cache per API server, so the
processor cache stays on however many there are (vLLM turns it off above one API server). The
port is shared with ``SO_REUSEPORT``: each API server listens on a socket of its own and the
kernel spreads new connections over them.

This process starts the API servers and the local engines and relays what they must know of
each other; then it supervises: an API server that exits unasked stops the whole server (an
engine's exit is logged here and seen by the API servers, whose requests fail and which exit with
status 1 unless ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH`` keeps them up, answering 503 on ``/health``); SIGINT or SIGTERM stops the API servers (each finishes its requests), then
the engines.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import signal
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any

from mmfront.config import DataParallelConfig
from mmfront.engine.handshake import wait_for_ready_responses
from mmfront.errors import HandshakeError
from mmfront.process_end import end_the_process
from mmfront.serve.banner import engines_banner
from mmfront.serve.launcher import (
    KEEP_ALIVE,
    STOP_GRACE_S,
    EngineProcesses,
    bind_handshake,
    bind_link,
    check_start,
    client_over,
    engine_kind,
    exit_on_sigterm,
    keep_alive_on_engine_death,
    listening_socket,
    log_engine_exit,
    meet_engines,
    run_app,
    show_logs,
    start_engines,
)
from mmfront.serve.settings import ServePlan

logger = logging.getLogger(__name__)

def _api_server(index: int, plan: ServePlan, port: int, conn: Connection) -> None:
    """One API server process: bind its link and tell the parent where it is; server 0 runs the
    handshake (naming the others' sockets), the others read their ready responses; then serve
    HTTP on its own socket of the shared port. A start-up error ends the process (status 1), and
    so does an engine's death unless kept alive."""
    signal.signal(signal.SIGTERM, exit_on_sigterm)
    link = bind_link(plan, client_index=index)
    conn.send(("link", link.transport.addresses, link.shm_name))
    if index == 0:
        handshake = bind_handshake(link, plan, other_frontends=conn.recv())
        conn.send(("handshake", handshake.address))
        infos = meet_engines(link, handshake, plan, None)
        conn.send(("engines", infos))
    else:
        try:
            infos = wait_for_ready_responses(link.transport, conn.recv(), plan.engine_ready_timeout_s)
        except BaseException:
            link.close()
            raise
    frontend = client_over(link, plan, infos, None)
    sock = listening_socket(plan.settings.host, port, reuse_port=True)
    sock.listen(2048)
    conn.send(("serving",))
    conn.close()
    try:
        status = run_app(frontend, plan.settings, sockets=[sock], keep_alive=keep_alive_on_engine_death())
    except SystemExit as ended:  # SIGTERM's way out of run_app (exit_on_sigterm)
        status = ended.code if isinstance(ended.code, int) else int(ended.code is not None)
    end_the_process(status, run_exit_handlers=True)  # the teardown took 3-10 s of every stop


def _stop_processes(processes: list[BaseProcess], grace_s: float = STOP_GRACE_S) -> None:
    for process in processes:
        if process.is_alive():
            process.terminate()
    for process in processes:
        process.join(grace_s)
        if process.is_alive():
            process.kill()
            process.join()


def serve_api_servers(plan: ServePlan) -> int:
    """Run ``plan.settings.api_server_count`` API servers and the local engines until SIGINT or
    SIGTERM; the exit status (1 when a process exited unasked)."""
    count = plan.settings.api_server_count
    show_logs()
    reserved = listening_socket(plan.settings.host, plan.settings.port, reuse_port=True)  # fails early if taken
    port = int(reserved.getsockname()[1])
    try:
        check_start(plan)
    except BaseException:
        reserved.close()
        raise
    logger.info("%s; %d API servers", engines_banner(plan, engine_kind(plan)), count)
    if (refusal := no_rejoin(plan.parallel, count, keep_alive_on_engine_death())) is not None:
        logger.warning("%s", refusal)
    context = multiprocessing.get_context("spawn")
    servers: list[BaseProcess] = []
    engines: EngineProcesses | None = None
    stop_signal: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        stop_signal.append(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        pipes = []
        for index in range(count):
            parent_end, child_end = context.Pipe()
            process = context.Process(target=_api_server, args=(index, plan, port, child_end),
                                      name=f"mmfront-api-server-{index}")
            process.start()
            child_end.close()
            servers.append(process)
            pipes.append(parent_end)
        links = [_receive(pipe, server, "link") for pipe, server in zip(pipes, servers)]
        pipes[0].send([addresses for addresses, _ in links[1:]])
        [handshake] = _receive(pipes[0], servers[0], "handshake")
        engines = start_engines(plan, handshake, [name for _, name in links])
        [infos] = _receive(pipes[0], servers[0], "engines", engines)
        for pipe in pipes[1:]:
            pipe.send(infos)
        for pipe, server in zip(pipes, servers):
            _receive(pipe, server, "serving", engines)
        logger.info("%d API servers on port %d", count, port)
        if engines is not None:
            engines.watch(functools.partial(log_engine_exit, engine=engines.name))
        return _supervise(servers, stop_signal)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _stop_processes(servers)
        if engines is not None:
            engines.stop()
        reserved.close()


def no_rejoin(parallel: DataParallelConfig, api_server_count: int, keep_alive: bool) -> str | None:
    """Why a restarted headless engine cannot rejoin these API servers, where keep-alive asks for
    it: API server 0 closes the handshake after start-up, since a rejoining engine would greet it
    alone and the others would never hear of it; ``None`` where no rejoin is asked for."""
    if not keep_alive or api_server_count < 2 or parallel.local_ranks == parallel.data_parallel_size:
        return None
    return (f"{KEEP_ALIVE}=1 with --api-server-count {api_server_count}: a headless engine restarted after its "
            "death cannot rejoin (the handshake closes after start-up; rejoining needs one API server). The API "
            "servers stay up, answering 503 on /health, until the whole server is restarted.")


def _receive(pipe: Connection, process: BaseProcess, tag: str, engines: EngineProcesses | None = None) -> list[Any]:
    """The next message of an API server in start-up (``tag`` and its values); an error when it,
    or a local engine, exits first."""
    while not pipe.poll(0.2):
        if not process.is_alive():
            raise HandshakeError(f"{process.name} exited with status {process.exitcode} during start-up; "
                                 "its output above says why.")
        exited = engines.exited() if engines is not None else []
        if exited and engines is not None:
            rank, code = exited[0]
            raise HandshakeError(f"Engine rank {rank} ({engines.name}) exited with status {code} before it was "
                                 "ready; its output above says why.")
    try:
        got, *values = pipe.recv()
    except EOFError:
        process.join(5)
        raise HandshakeError(f"{process.name} exited with status {process.exitcode} during start-up; its output "
                             "above says why.") from None
    assert got == tag, (got, tag)
    return values


def _supervise(servers: list[BaseProcess], stop_signal: list[int]) -> int:
    while not stop_signal:
        ready = wait([p.sentinel for p in servers], timeout=0.2)
        if ready:
            for process in servers:
                if not process.is_alive():
                    logger.error("%s exited (status %s): stopping the server.", process.name, process.exitcode)
            return 1
    return 0


__all__ = ["no_rejoin", "serve_api_servers"]
