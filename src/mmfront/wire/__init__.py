"""Everything that crosses the P0/P1 process boundary, and nothing else.

The msgpack codec and its tensor frames (byte-compatible with vLLM 0.33), the request and output
structs, and the messages of mmfront's P0/P1 protocol. This package sits at the bottom of the
house: it imports only :mod:`mmfront.inputs` and :mod:`mmfront.errors`, so the caches, the
preprocessor and the engine side can all speak it without importing each other.
"""

from __future__ import annotations

from mmfront.wire._tensors import Frame, frame_view, frame_views, tensor_bytes
from mmfront.wire.codec import DEFAULT_SIZE_THRESHOLD, MsgpackDecoder, MsgpackEncoder
from mmfront.wire.params import LoRARequest, PoolingParams, RequestOutputKind, SamplingParams
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason

__all__ = [
    "DEFAULT_SIZE_THRESHOLD",
    "EngineCoreOutput",
    "EngineCoreOutputs",
    "EngineCoreRequest",
    "FinishReason",
    "Frame",
    "LoRARequest",
    "MsgpackDecoder",
    "MsgpackEncoder",
    "PoolingParams",
    "RequestOutputKind",
    "SamplingParams",
    "frame_view",
    "frame_views",
    "tensor_bytes",
]
