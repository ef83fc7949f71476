"""vLLM 0.33's P0 -> P1 hop for one request holding a (5, 3, 896, 896) float32 tensor, measured the
way ``bench_wire.py`` measures mmfront's: encode with vLLM's ``MsgpackEncoder``, send on a ROUTER
bound to ``ipc://`` as ``[identity, ADD, *frames]``, receive on the engine's DEALER, decode with
``MsgpackDecoder(EngineCoreRequest)``.

Runs inside the vLLM peer venv (``/work/shared/peer/vllm_peer_setup.sh``), never in mmfront's, and
stays up so that ``bench_wire.py`` can alternate rounds with mmfront's: it prints one JSON line with
the frame sizes, then for each number N read from stdin one JSON line with the median of N hops
(after one warm-up hop), until stdin closes::

    echo 10 | VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 /tmp/vllm-peer-venv/bin/python benchmarks/peer/vllm_wire.py
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time


def main() -> None:
    import torch
    import zmq
    from vllm import SamplingParams
    from vllm.multimodal.inputs import (
        MultiModalBatchedField,
        MultiModalFeatureSpec,
        MultiModalFieldElem,
        MultiModalKwargsItem,
        PlaceholderRange,
    )
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    pixels = torch.rand((5, 3, 896, 896), generator=torch.Generator().manual_seed(0))
    item = MultiModalKwargsItem({"pixel_values": MultiModalFieldElem(pixels, MultiModalBatchedField())})
    mm_hash = "9" * 64
    request = EngineCoreRequest(
        request_id="chatcmpl-0123456789abcdef-0",
        prompt_token_ids=list(range(2, 2 + 5 * 260 + 24)),
        mm_features=[MultiModalFeatureSpec(data=item, modality="image", identifier=mm_hash,
                                           mm_position=PlaceholderRange(offset=3, length=5 * 260), mm_hash=mm_hash)],
        sampling_params=SamplingParams(max_tokens=64, temperature=0.0),
        pooling_params=None, arrival_time=time.time(), lora_request=None, cache_salt=None, data_parallel_rank=None,
    )
    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(EngineCoreRequest)
    identity = (0).to_bytes(2, "little")
    folder = tempfile.mkdtemp(prefix="vllm-wire-")
    ctx = zmq.Context()
    router, dealer = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
    for sock in (router, dealer):
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    dealer.setsockopt(zmq.IDENTITY, identity)
    router.bind(f"ipc://{folder}/input")
    dealer.connect(f"ipc://{folder}/input")
    dealer.send(b"")
    router.recv_multipart()

    def hop() -> EngineCoreRequest:
        router.send_multipart([identity, b"\x00", *encoder.encode(request)], copy=False)
        frames = dealer.recv_multipart(copy=False)
        return decoder.decode([frame.buffer for frame in frames[1:]])

    try:
        got = hop().mm_features[0].data["pixel_values"].data
        assert torch.equal(got, pixels)
        print(json.dumps({"frame_bytes": [memoryview(f).nbytes for f in encoder.encode(request)]}), flush=True)
        for line in sys.stdin:
            hop()
            samples = []
            for _ in range(int(line)):
                t0 = time.perf_counter()
                hop()
                samples.append(time.perf_counter() - t0)
            print(json.dumps({"hop_ms": statistics.median(samples) * 1e3}), flush=True)
    finally:
        ctx.destroy(linger=0)
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
