"""A stock vLLM 0.33 engine core's socket side, run by tests/engine/test_vllm_compat.py in the vLLM
peer venv (see tests/engine/data/vllm_frames.py for how to build one).

    python vllm_engine_peer.py INPUT_ADDRESS OUTPUT_ADDRESS COUNT OUTPUT_FRAMES_FILE

It connects a DEALER (identity engine 0) and a PUSH as vLLM's ``EngineCoreProc`` does, says
hello, and reads COUNT messages the way its input thread does (``type_frame, *data_frames =
recv_multipart(copy=False)``, ``MsgpackDecoder(EngineCoreRequest).decode(data_frames)`` for ADD,
the generic decoder otherwise). Each decoded request is re-encoded with vLLM's encoder, so the
test can compare it with what mmfront sent byte for byte. It then decodes the engine-output frames
in OUTPUT_FRAMES_FILE (a msgpack array of bin frames) as a stock frontend does, and pushes vLLM's
own cache-miss reply to P0. Prints one JSON document.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import msgspec
import zmq


def _main(input_address: str, output_address: str, count: int, outputs_file: str) -> None:
    from vllm.v1.engine import (
        EngineCoreOutput,
        EngineCoreOutputs,
        EngineCoreRequest,
        EngineCoreRequestType,
        FinishReason,
    )
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    add_request_decoder = MsgpackDecoder(EngineCoreRequest)
    generic_decoder = MsgpackDecoder()
    encoder = MsgpackEncoder()
    report: dict[str, Any] = {"messages": []}
    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, (0).to_bytes(2, "little"))
    dealer.connect(input_address)
    push = ctx.socket(zmq.PUSH)
    push.connect(output_address)
    dealer.send(b"ready")
    for _ in range(count):
        type_frame, *data_frames = dealer.recv_multipart(copy=False)
        request_type = EngineCoreRequestType(bytes(type_frame.buffer))
        entry: dict[str, Any] = {"type": request_type.name, "frames": len(data_frames)}
        if request_type == EngineCoreRequestType.ADD:
            req = add_request_decoder.decode(data_frames)
            entry["reencoded"] = [bytes(memoryview(f).cast("B")).hex() for f in encoder.encode(req)]
            entry["request_id"] = req.request_id
            entry["sampling_type"] = None if req.sampling_params is None else type(req.sampling_params).__name__
            entry["lora_path"] = None if req.lora_request is None else req.lora_request.lora_path
            entry["embeds_shape"] = None if req.prompt_embeds is None else list(req.prompt_embeds.shape)
            entry["mm_shapes"] = [list(f.data["pixel_values"].data.shape) for f in req.mm_features or [] if f.data]
        else:
            entry["decoded"] = generic_decoder.decode(data_frames)
        report["messages"].append(entry)
    with open(outputs_file, "rb") as f:
        frames = msgspec.msgpack.decode(f.read())
    outputs = MsgpackDecoder(EngineCoreOutputs).decode(frames)
    report["outputs"] = {
        "engine_index": outputs.engine_index,
        "finished_requests": sorted(outputs.finished_requests or ()),
        "outputs": [[o.request_id, o.new_token_ids, str(o.finish_reason), o.mm_cache_miss_hashes]
                    for o in outputs.outputs],
    }
    miss = EngineCoreOutputs(engine_index=0, finished_requests={"r-miss"}, outputs=[EngineCoreOutput(
        request_id="r-miss", new_token_ids=[], finish_reason=FinishReason.ERROR, mm_cache_miss_hashes=["h9"])])
    push.send_multipart(encoder.encode(miss), copy=False)
    ctx.destroy(linger=2000)
    print(json.dumps(report))


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4])
