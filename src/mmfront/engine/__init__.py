"""The link between the frontend (P0) and an engine (P1): the clients, the receiver an engine
embeds, the transports (a pipe, vLLM's ZMQ sockets), vLLM's start-up handshake, the reference worker and
prefix-cache keys.

Importing this package loads neither transformers nor a model: ``ModelRunner`` and the worker
live in :mod:`mmfront.engine.runner` and :mod:`mmfront.engine.worker`.
"""

from mmfront.engine.async_client import AsyncEngineClient, BlockingEngineClient
from mmfront.engine.client import EngineClient
from mmfront.engine.client_events import RequestAdmitted, RequestFailed, RequestOutput
from mmfront.engine.handshake import DataParallelConfig, EngineInfo, FrontendHandshake, engine_handshake
from mmfront.engine.receiver import EngineCoreReceiver, EngineReceiver
from mmfront.engine.transports import (
    BaseTransport,
    PipeTransport,
    ZmqAddresses,
    ZmqEngineTransport,
    ZmqFrontendTransport,
)

__all__ = [
    "AsyncEngineClient",
    "BaseTransport",
    "BlockingEngineClient",
    "DataParallelConfig",
    "EngineClient",
    "EngineCoreReceiver",
    "EngineInfo",
    "EngineReceiver",
    "FrontendHandshake",
    "PipeTransport",
    "RequestAdmitted",
    "RequestFailed",
    "RequestOutput",
    "ZmqAddresses",
    "ZmqEngineTransport",
    "ZmqFrontendTransport",
    "engine_handshake",
]
