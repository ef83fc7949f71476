"""vLLM 0.33's own engine-side decoding of mmfront's ZMQ frames, in the vLLM peer venv.

A stock engine core (tests/engine/data/vllm_engine_peer.py) connects to mmfront's P0 transport,
receives every kind of message exactly as ``EngineCoreProc``'s input thread does, and decodes it
with vLLM's ``MsgpackDecoder``. Each request it gets is re-encoded with vLLM's encoder: equal bytes
mean vLLM decoded every one of the 22 fields (and every ``SamplingParams`` field) to what mmfront
meant, and that it ignored mmfront's trailing stamp frame. The other direction: vLLM's decoder
reads mmfront's cache-miss reply, and mmfront reads vLLM's.

Skipped where no peer venv exists (:mod:`mmfront.testing.peer` says where it is looked for).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.engine.transports.zmq_frames import output_frames
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python
from mmfront.wire.codec import MsgpackEncoder
from mmfront.wire.messages import (
    ABORT,
    CACHE_MISS,
    ENGINE_OUTPUTS,
    MIRROR_ONLY,
    REQUEST,
    RESET_CACHE,
    CacheMiss,
    Direction,
    MirrorOnly,
    MirrorOp,
    MirrorStamp,
    decode_message,
    encode_envelope,
)
from mmfront.wire.structs import FinishReason

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
PEER_SCRIPT = DATA / "vllm_engine_peer.py"


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, DATA / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STRUCTS = _load("vllm_structs")


PEER = vllm_peer_python()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(PEER is None, reason=SKIP_REASON)]


def raw(frames: list[Any]) -> list[str]:
    return [bytes(memoryview(f).cast("B")).hex() for f in frames]


@pytest.fixture(scope="module")
def exchange(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run the stock engine once against one P0 and collect everything both sides saw."""
    assert PEER is not None
    encoder = MsgpackEncoder()
    built = STRUCTS.build(STRUCTS.mmfront_namespace())
    requests = [built["request_full"], built["request_pooling"], built["request_greedy"]]
    sent = [raw(encoder.encode(r)) for r in requests]
    miss_file = tmp_path_factory.mktemp("peer") / "miss.msgpack"
    miss = output_frames(encode_envelope(CACHE_MISS, encoder.encode(CacheMiss("r", ["h1", "h2"], 5))), engine_index=0)
    miss_file.write_bytes(msgspec.msgpack.encode([bytes(memoryview(f)) for f in miss]))
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    with ZmqFrontendTransport() as p0:
        count = len(requests) + 3
        cmd = [str(PEER), str(PEER_SCRIPT), p0.addresses.input, p0.addresses.output, str(count), str(miss_file)]
        peer = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            p0.wait_for_engines([0], timeout=180)
            for i, request in enumerate(requests):
                p0.send(encode_envelope(REQUEST, encoder.encode(request), MirrorStamp(1, i, b"\x01" * 16)))
            p0.send(encode_envelope(RESET_CACHE, encoder.encode(None)))
            p0.send(encode_envelope(MIRROR_ONLY, encoder.encode(MirrorOnly([MirrorOp("N", "h", 4)])),
                                    MirrorStamp(1, 9, b"\x02" * 16)))
            p0.send(encode_envelope(ABORT, encoder.encode(["req-full"])))
            reply = p0.recv(timeout=60)
            out, err = peer.communicate(timeout=60)
        finally:
            peer.kill()
    assert peer.returncode == 0, err[-3000:]
    return {"sent": sent, "peer": json.loads(out), "reply": reply}


def test_vllm_decodes_every_request_field_as_sent(exchange: dict[str, Any]) -> None:
    messages = exchange["peer"]["messages"]
    for sent, got, request_id in zip(exchange["sent"], messages, ["req-full", "req-pool", "req-greedy"]):
        assert (got["type"], got["request_id"]) == ("ADD", request_id)
        assert got["frames"] == len(sent) + 1  # the stamp frame came along, and vLLM ignored it
        assert got["reencoded"] == sent
    full, pool, greedy = messages[:3]
    assert (full["sampling_type"], full["lora_path"], full["embeds_shape"]) == ("SamplingParams", "/loras/ad", [16, 32])
    assert full["mm_shapes"] == [[2, 3, 8, 8]]
    assert (pool["sampling_type"], greedy["sampling_type"]) == (None, "SamplingParams")


def test_vllm_reads_utility_and_abort_messages(exchange: dict[str, Any]) -> None:
    reset, mirror_only, abort = exchange["peer"]["messages"][3:]
    assert reset == {"type": "UTILITY", "frames": 2, "decoded": [0, 0, "reset_mm_cache", []]}
    assert mirror_only == {"type": "UTILITY", "frames": 2, "decoded": [0, 1, "mmfront_mirror_only", [[[["N", "h", 4]]]]]}
    assert abort == {"type": "ABORT", "frames": 2, "decoded": ["req-full"]}


def test_vllm_frontend_reads_mmfront_cache_miss_reply(exchange: dict[str, Any]) -> None:
    assert exchange["peer"]["outputs"] == {
        "engine_index": 0, "finished_requests": ["r"], "outputs": [["r", [], "error", ["h1", "h2"]]]}


def test_mmfront_reads_vllm_cache_miss_reply(exchange: dict[str, Any]) -> None:
    message = decode_message(exchange["reply"], Direction.TO_FRONTEND)
    assert message.kind == ENGINE_OUTPUTS
    outputs = message.body
    assert outputs.finished_requests == {"r-miss"}
    [output] = outputs.outputs
    assert (output.request_id, output.new_token_ids, output.finish_reason, output.mm_cache_miss_hashes) == (
        "r-miss", [], FinishReason.ERROR, ["h9"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
