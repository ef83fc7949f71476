"""Issue 22, class 4: bounded work per wire message at P1. A request whose features all point at
one tensor, thousands of times, used to cost seconds to decode and walk. The engine now counts
a request's features against its limit before it decodes them, and refuses a tensor that points
at an aux frame another tensor already took (an honest encoder gives every tensor its own frame),
so decoding costs time in proportion to the bytes, and the sender alone gets a DecodeError."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest
import torch

import local_services
from mmfront import MultiModalConfig
from mmfront.cache.factory import engine_receiver_cache_from_config
from mmfront.engine.receiver import DEFAULT_MAX_MM_FEATURES, EngineCoreReceiver, EngineReceiver, mm_feature_limit
from mmfront.errors import ConfigError, DecodeError
from mmfront.inputs import MultiModalFeatureSpec, MultiModalKwargsItem, PlaceholderRange
from mmfront.wire import Frame
from mmfront.wire.codec import MsgpackDecoder, MsgpackEncoder
from mmfront.wire.messages import ENGINE_OUTPUTS, REQUEST, Direction, MirrorStamp, decode_message, encode_envelope
from mmfront.wire.structs import EngineCoreRequest

ENC = MsgpackEncoder()


def feature(key: str, offset: int, nbytes: int = 4096) -> MultiModalFeatureSpec:
    return MultiModalFeatureSpec(MultiModalKwargsItem.dummy(nbytes), "image", key, PlaceholderRange(offset, 2), key)


def request(request_id: str, *features: MultiModalFeatureSpec) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, [1] * 8, list(features) or None, None, None, 0.0, None, None, None)


def one_tensor_everywhere(request_id: str, count: int, stamp: MirrorStamp | None = None) -> list[Frame]:
    """A request of ``count`` features whose tensors all point at the one aux frame of the first."""
    frames = ENC.encode(request(request_id, feature("k0", 0)))
    body = msgspec.msgpack.decode(frames[0])
    first = body[2][0]
    body[2] = [{**first, "identifier": f"k{i}", "mm_hash": f"k{i}", "mm_position": {"offset": 2 * i, "length": 2}}
               for i in range(count)]
    return encode_envelope(REQUEST, [msgspec.msgpack.encode(body), *frames[1:]], stamp)


class Inbox(local_services.Inbox):
    """What the engine answered: each utility call's failure message."""

    def failures(self) -> list[str]:
        out = []
        for frames in self.sent:
            message = decode_message(frames, Direction.TO_FRONTEND)
            if message.kind == ENGINE_OUTPUTS and message.body.utility_output is not None:
                out.append(message.body.utility_output.failure_message)
        return out


@pytest.mark.parametrize("stamped", [False, True], ids=["unstamped", "stamped"])
def test_thousands_of_features_on_one_tensor_are_refused_before_the_walk(stamped: bool) -> None:
    hostile = one_tensor_everywhere("hostile", 50_000, MirrorStamp(1, 1, bytes(16)) if stamped else None)
    honest = encode_envelope(REQUEST, ENC.encode(request("honest", feature("a", 0), feature("b", 4))))
    frontend = Inbox(hostile, honest)
    cache = engine_receiver_cache_from_config(MultiModalConfig())
    with EngineCoreReceiver(frontend, cache, heartbeat_s=60) as receiver:
        start = time.monotonic()
        ready = receiver.poll(timeout=5)
        took = time.monotonic() - start
    assert [r.request_id for r in ready] == ["honest"]
    assert took < 0.5  # it was 2 s and more: decoded, then walked
    [failure] = frontend.failures()
    assert failure.startswith("DecodeError: A request carries 50000 multimodal features")
    assert f"at most {DEFAULT_MAX_MM_FEATURES}" in failure and "limit_mm_per_prompt" in failure


def test_the_limit_follows_the_engines_config() -> None:
    config = MultiModalConfig(limit_mm_per_prompt={"image": 2, "audio": 1})
    limit = mm_feature_limit(config)
    assert limit == 2 + 1 + MultiModalConfig().get_limit_per_prompt("video")
    receiver = EngineReceiver(None, max_mm_features=3)
    ready, _ = receiver.handle(encode_envelope(REQUEST, ENC.encode(request("three", *(feature(f"k{i}", 2 * i)
                                                                                      for i in range(3))))))
    assert [r.request_id for r in ready] == ["three"]
    with pytest.raises(DecodeError, match="carries 4 multimodal features; this engine takes at most 3"):
        receiver.handle(encode_envelope(REQUEST, ENC.encode(request("four", *(feature(f"k{i}", 2 * i)
                                                                              for i in range(4))))))
    with pytest.raises(ConfigError, match="max_mm_features"):
        EngineReceiver(None, max_mm_features=0)


def test_two_tensors_of_a_request_cannot_share_one_aux_frame() -> None:
    frames = one_tensor_everywhere("shared", 2)
    with pytest.raises(DecodeError, match="aux frame 1 twice"):
        EngineReceiver(None).handle(frames)
    same = torch.ones(4096, dtype=torch.uint8)  # one tensor sent twice travels twice: an honest request decodes
    item = MultiModalKwargsItem.dummy(1)
    twice = [MultiModalFeatureSpec(item, "image", k, PlaceholderRange(2 * i, 2), k) for i, k in enumerate("ab")]
    for f in twice:
        f.data["dummy"].data = same  # type: ignore[index]
    ready, _ = EngineReceiver(None).handle(encode_envelope(REQUEST, ENC.encode(request("honest", *twice))))
    assert [torch.equal(f.data["dummy"].data, same) for f in ready[0].mm_features] == [True, True]  # type: ignore[index,union-attr]


def test_the_codec_alone_still_decodes_repeated_references_as_views() -> None:
    """The generic decoder keeps its contract (many views of one frame cost nothing); only what
    travels to the engine is held to one reference per frame."""
    body: Any = msgspec.msgpack.encode([["uint8", [8], 1]] * 3)
    views = MsgpackDecoder(list[torch.Tensor]).decode([body, bytearray(8)])
    assert len(views) == 3
