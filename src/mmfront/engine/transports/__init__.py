"""How P0 and P1 move envelopes: the transport interface and its implementations.

:mod:`~mmfront.engine.transports.base` holds the interface (and the pipe transport);
:mod:`~mmfront.engine.transports.zmq` the transport over vLLM 0.33's ZMQ sockets, which lays
envelopes out as vLLM's frames (:mod:`~mmfront.engine.transports.zmq_frames`) and over ``ipc://``
moves large frames on a side channel (:mod:`~mmfront.engine.transports.fd_channel`).
``ENGINE_TRANSPORTS`` names the ones an engine process can connect with from the command line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from mmfront.engine.transports.base import BaseTransport, EngineTransportFactory, PipeTransport
from mmfront.engine.transports.zmq import (
    ZmqAddresses,
    ZmqEngineTransport,
    ZmqFrontendTransport,
    engine_identity,
    zmq_engine_factory,
)

ENGINE_TRANSPORTS: Final[Mapping[str, Callable[[str, str], EngineTransportFactory]]] = MappingProxyType(
    {"zmq": zmq_engine_factory})
"""By name: (a frontend's input address, its output address) -> how an engine connects to it."""

__all__ = [
    "ENGINE_TRANSPORTS",
    "BaseTransport",
    "EngineTransportFactory",
    "PipeTransport",
    "ZmqAddresses",
    "ZmqEngineTransport",
    "ZmqFrontendTransport",
    "engine_identity",
    "zmq_engine_factory",
]
