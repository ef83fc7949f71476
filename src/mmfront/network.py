"""Free local TCP ports, for the commands that start servers on this machine (``mmfront demo``,
the benchmarks) and the tests that do. vLLM names them the same (``vllm.utils.network_utils``)."""

from __future__ import annotations

import socket
from contextlib import ExitStack

__all__ = ["get_open_port", "get_open_ports_list"]


def get_open_ports_list(count: int = 5) -> list[int]:
    """``count`` distinct ports of 127.0.0.1 free now: all are bound at once, so none repeats, then
    released for the caller's server to bind (another process could take one in between)."""
    with ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in sockets]


def get_open_port() -> int:
    """One port of 127.0.0.1 free now."""
    return get_open_ports_list(1)[0]
