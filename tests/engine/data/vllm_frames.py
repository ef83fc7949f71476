"""Objects encoded by vLLM 0.33's own ``MsgpackEncoder`` into the ``vllm_*.msgpack`` files here.

``build(inputs, request_cls)`` builds the same objects from either vLLM's or mmfront's
``multimodal.inputs`` module (they share the names), so the tests can compare mmfront's frames
with vLLM's byte for byte and decode vLLM's frames with mmfront.

Regenerate (needs the vLLM peer venv, see ../shared/reference/vllm-peer.md)::

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 /tmp/vllm-peer-venv/bin/python tests/engine/data/vllm_frames.py

Each file is a msgpack array of the message's frames (bin), frame 0 first.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

HERE = Path(__file__).parent
NAMES = ("item", "feature", "feature_cached", "items", "arrays", "request")


def build(inputs: ModuleType, request_cls: Any) -> dict[str, Any]:
    m = inputs
    pixel_values = torch.arange(128, dtype=torch.float32).div(7).to(torch.bfloat16).reshape(2, 8, 8)  # 256 B: aux
    item = m.MultiModalKwargsItem({
        "pixel_values": m.MultiModalFieldElem(pixel_values, m.MultiModalBatchedField()),
        "image_grid_thw": m.MultiModalFieldElem(torch.tensor([[1, 4, 4]]), m.MultiModalSharedField(batch_size=2)),
        "embeds": m.MultiModalFieldElem(
            torch.linspace(-1, 1, 6, dtype=torch.float16).reshape(2, 3),
            m.MultiModalFlatField(slices=[(slice(None), slice(0, 3))], dim=1),
        ),
        "sizes": m.MultiModalFieldElem(
            [torch.tensor([3, -4], dtype=torch.int32), [7, 0.5]],
            m.MultiModalFlatField(slices=[slice(0, 2), slice(2, 5, 1)], keep_on_cpu=True),
        ),
    })
    audio = m.MultiModalKwargsItem({
        "input_features": m.MultiModalFieldElem(torch.ones(4, 80, dtype=torch.float32), m.MultiModalBatchedField()),
    })
    is_embed = torch.tensor([False, True, True, True, True, False])
    feature = m.MultiModalFeatureSpec(
        data=item, modality="image", identifier="lora-1:abc", mm_position=m.PlaceholderRange(5, 6, is_embed=is_embed),
        mm_hash="abc",
    )
    cached = m.MultiModalFeatureSpec(
        data=None, modality="audio", identifier="def", mm_position=m.PlaceholderRange(20, 3), mm_hash="def",
    )
    arrays = [
        np.arange(100, dtype="<f4").reshape(10, 10),
        np.array(2.5),
        np.arange(6, dtype=">i2").reshape(2, 3),
        np.asfortranarray(np.arange(80, dtype=np.int32).reshape(8, 10)),
        np.array([True, False, True]),
        torch.arange(200, dtype=torch.float32).reshape(10, 20).t(),
        torch.empty((0, 3), dtype=torch.float32),
        torch.tensor([1 + 2j, -3.5j], dtype=torch.complex64),
    ]
    request = request_cls(
        request_id="req-1", prompt_token_ids=[2, 105, 255999, 262144, 256000], mm_features=[feature, cached],
        sampling_params=None, pooling_params=None, arrival_time=1.25, lora_request=None, cache_salt=None,
        data_parallel_rank=None, client_index=1,
    )
    return {
        "item": item,
        "feature": feature,
        "feature_cached": cached,
        "items": m.MultiModalKwargsItems({"image": [item], "audio": [audio]}),
        "arrays": arrays,
        "request": request,
    }


def _main() -> None:
    import msgspec
    from vllm.multimodal import inputs
    from vllm.v1.engine import EngineCoreRequest
    from vllm.v1.serial_utils import MsgpackEncoder

    encoder = MsgpackEncoder(size_threshold=256)
    for name, obj in build(inputs, EngineCoreRequest).items():
        frames = [bytes(memoryview(f).cast("B")) for f in encoder.encode(obj)]
        (HERE / f"vllm_{name}.msgpack").write_bytes(msgspec.msgpack.encode(frames))
        print(name, [len(f) for f in frames], file=sys.stderr)


if __name__ == "__main__":
    _main()
