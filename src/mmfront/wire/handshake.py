"""The messages of vLLM 0.33's engine start-up handshake, as msgspec structs.

An engine connects a DEALER (identity: its data-parallel rank, 2 bytes little-endian) to the
frontend's handshake ROUTER and says :class:`HandshakeStatus` ``HELLO``; the frontend answers
:class:`EngineHandshakeMetadata` (where the engine's input and output sockets connect); the
engine's first message on the input socket is its :class:`EngineCoreReadyResponse`; then it
says ``READY`` on the handshake socket. All of them are msgpack maps, as vLLM sends them.

mmfront's extras ride in more keys of the engine's ``HELLO``, ``mmfront_extras`` (and
``mmfront_side_secret``, the engine's key to the side channel): vLLM's frontend reads
``status``, ``local`` and ``headless`` from that map and ignores the rest, so an
mmfront engine still starts behind a stock vLLM frontend, and a stock engine (no such key)
announces no extras. docs/engine.md ("The start-up handshake") walks through it.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

EXTRA_MIRROR: Final = "mirror"
"""The engine checks mirror stamps and answers a miss with mmfront's ``CacheMiss``."""
EXTRA_ADMITTED: Final = "admitted"
"""The engine answers every request with ``Admitted`` once its features are filled in."""
EXTRA_HEARTBEAT: Final = "heartbeat"
"""The engine greets and repeats ``EngineHello`` while it lives, so silence means death."""
EXTRA_SIDE_CHANNEL: Final = "side_channel"
"""Over ``ipc``, the engine opened the memfd side channel for large frames."""
MMFRONT_EXTRAS: Final = frozenset({EXTRA_MIRROR, EXTRA_ADMITTED, EXTRA_HEARTBEAT, EXTRA_SIDE_CHANNEL})
"""Every extra an mmfront engine (one embedding ``EngineCoreReceiver``) may announce."""
EXTRA_REFERENCE_LIMITS: Final = "reference_limits"
"""The engine is mmfront's reference engine (``mmfront worker``): it refuses what it cannot honour
(``mmfront.engine.reference_limits``), and P0 refuses the same requests before sending them, so a
stream is refused with a 400 too. A limit, not a feature: no engine is assumed to have it."""
ENGINE_CORE_DEAD: Final = b"ENGINE_CORE_DEAD"
"""The single frame a stock engine pushes on its output socket when it dies of an error."""


class HandshakeStatus(msgspec.Struct, omit_defaults=True):
    """An engine's ``HELLO`` (it is there) or ``READY`` (it serves) on the handshake socket.
    ``local``: started by this frontend's host; ``headless``: started without a frontend."""

    status: Literal["HELLO", "READY"]
    local: bool
    headless: bool
    parallel_config_hash: Any = None
    mmfront_extras: list[str] | None = None
    mmfront_side_secret: str | None = None
    """In an mmfront engine's ``HELLO`` (hex): what it presents on the ``ipc`` side channel."""


class HandshakeAddresses(msgspec.Struct):
    """Where an engine connects its data sockets (vLLM's ``EngineZmqAddresses``); every key is
    written, as vLLM's engine decodes them all."""

    inputs: list[str]
    outputs: list[str]
    coordinator_input: str | None = None
    coordinator_output: str | None = None
    frontend_stats_publish_address: str | None = None


class EngineHandshakeMetadata(msgspec.Struct):
    """The frontend's answer to a ``HELLO``. ``parallel_config`` is filled only for coordinated
    data parallelism (MoE), which mmfront does not run."""

    addresses: HandshakeAddresses
    parallel_config: dict[str, Any] = {}


class EngineCoreReadyResponse(msgspec.Struct):
    """What an engine tells the frontend first on its input socket: its limits after start-up.
    vLLM's fields, in its order; fields mmfront never reads are plain data."""

    max_model_len: int
    num_gpu_blocks: int
    block_size: int
    dp_stats_address: str | None = None
    dtype: str = "auto"
    vllm_version: str = ""
    world_size: int = 1
    data_parallel_size: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    data_parallel_rank: int = 0
    max_num_seqs: int = 0
    max_num_batched_tokens: int = 0
    instance_id: str = ""
    supports_lora: bool = False
    max_loras: int = 0
    mamba_block_size: Any = None
    kv_cache_size_tokens: Any = None
    kv_cache_max_concurrency: Any = None
    kv_events_config: Any = None
    weight_transfer_backend: Any = None
    enable_sleep_mode: bool = False
    supports_draft_weight_updates: bool = False
    effective_attention_block_size: Any = None
    coord_store_port: int = 0
    coordinator_input_address: str | None = None
    coordinator_output_address: str | None = None


__all__ = [
    "ENGINE_CORE_DEAD",
    "EXTRA_ADMITTED",
    "EXTRA_HEARTBEAT",
    "EXTRA_MIRROR",
    "EXTRA_REFERENCE_LIMITS",
    "EXTRA_SIDE_CHANNEL",
    "MMFRONT_EXTRAS",
    "EngineCoreReadyResponse",
    "EngineHandshakeMetadata",
    "HandshakeAddresses",
    "HandshakeStatus",
]
