"""vLLM 0.33's own frontend on one model folder: what its engine would receive. Runs in the peer venv.

``python vllm_apply_peer.py SPEC.json`` (``VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1``). SPEC names the
folder, the model dtype (the one vLLM resolves for a GPU engine; the driver passes it so that the
CPU this runs on does not change it), ``model_impl``, the cases (token ids and media files) and the
files of mmfront's encoded items. For each case the script runs
``MULTIMODAL_REGISTRY.create_processor(ModelConfig(folder)).apply(...)`` and prints, as JSON, the
prompt ids, the placeholder ranges with ``is_embed``, the hashes and every item's fields after
vLLM's ``MsgpackEncoder``/``MsgpackDecoder`` round trip; and it decodes mmfront's frames with the
same decoder and describes them the same way, so the two sides compare as plain JSON
(``tests/models/vllm_parity.py``). Imports nothing of mmfront: it describes what vLLM decoded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
import traceback
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import msgspec
import numpy as np
import torch

FIELD_NAMES = {"MultiModalBatchedField": "batched", "MultiModalFlatField": "flat", "MultiModalSharedField": "shared"}


def describe_value(value: Any) -> Any:
    """A tensor as ``[dtype, shape, sha256 of its bytes]``; lists recursively; scalars as is."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu().contiguous()
        raw = data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""
        return ["tensor", str(data.dtype).removeprefix("torch."), list(data.shape), hashlib.sha256(raw).hexdigest()[:16]]
    if isinstance(value, (list, tuple)):
        return [describe_value(v) for v in value]
    if isinstance(value, slice):
        return ["slice", value.start, value.stop, value.step]
    return value


def describe_field(field: Any) -> list[Any]:
    """The field class (batched / flat / shared) and its dataclass fields (a flat field's slices, dim)."""
    name = FIELD_NAMES.get(type(field).__name__, type(field).__name__)
    values = {f.name: describe_value(getattr(field, f.name)) for f in dataclasses.fields(field)}
    return [name, values]


def describe_item(item: Any) -> Any:
    if item is None:
        return None
    return {key: {"field": describe_field(elem.field), "data": describe_value(elem.data)} for key, elem in sorted(item.items())}


def round_trip(item: Any) -> Any:
    from vllm.multimodal.inputs import MultiModalKwargsItem
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    frames = MsgpackEncoder().encode(item)
    return MsgpackDecoder(MultiModalKwargsItem, share_mem=False).decode([bytes(memoryview(f).cast("B")) for f in frames])


def load_media(modality: str, entry: Any) -> Any:
    if modality == "image":
        from PIL import Image

        with Image.open(entry) as image:
            return image.convert("RGB")
    if modality == "audio":
        return (np.load(entry["path"]), entry["sr"])
    if modality == "video":
        frames = np.load(entry["path"])
        return (frames, entry["metadata"])
    raise ValueError(modality)


def run_case(processor: Any, case: dict[str, Any]) -> dict[str, Any]:
    from vllm.multimodal.processing import ProcessorInputs, TimingContext

    data = {m: [load_media(m, e) for e in entries] for m, entries in case["media"].items()}
    items = processor.info.parse_mm_data(data)
    out = processor.apply(
        ProcessorInputs(prompt=list(case["prompt_token_ids"]), mm_data_items=items,
                        hf_processor_mm_kwargs=case.get("mm_processor_kwargs") or {}),
        TimingContext(enabled=False),
    )
    placeholders = {
        m: [[r.offset, r.length, None if r.is_embed is None else [bool(x) for x in r.is_embed.tolist()]] for r in ranges]
        for m, ranges in out["mm_placeholders"].items()
    }
    kwargs = {m: [describe_item(round_trip(i)) for i in items_] for m, items_ in out["mm_kwargs"].items()}
    return {"prompt_token_ids": list(out["prompt_token_ids"]), "mm_placeholders": placeholders,
            "mm_hashes": {m: list(h) for m, h in out["mm_hashes"].items()}, "mm_kwargs": kwargs}


def decode_mmfront(path: str) -> Any:
    from vllm.multimodal.inputs import MultiModalKwargsItem
    from vllm.v1.serial_utils import MsgpackDecoder

    with open(path, "rb") as f:
        encoded = msgspec.msgpack.decode(f.read())
    decoder = MsgpackDecoder(MultiModalKwargsItem, share_mem=False)
    return {m: [None if frames is None else describe_item(decoder.decode(frames)) for frames in items]
            for m, items in encoded.items()}


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    result: dict[str, Any] = {"cases": {}, "decoded": {}}
    try:
        from vllm.config import ModelConfig
        from vllm.multimodal import MULTIMODAL_REGISTRY

        config = ModelConfig(model=spec["folder"], tokenizer=spec["folder"], dtype=spec.get("dtype", "auto"),
                             model_impl=spec.get("model_impl", "auto"))
        processor = MULTIMODAL_REGISTRY.create_processor(config)
        mm_config = config.get_multimodal_config()
        result["resolved"] = {
            "architecture": config.architecture, "model_impl": str(config.model_impl),
            "processor": type(processor).__name__, "dtype": str(config.dtype).removeprefix("torch."),
            "mm_device_do_normalize": bool(mm_config.mm_device_do_normalize),
            "placeholders": {m: _placeholder(config, m) for m in ("image", "video", "audio")},
        }
    except Exception as exc:  # the folder is not one vLLM serves: say why, once
        result["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        result["traceback"] = traceback.format_exc()[-3000:]
        print(json.dumps(result))
        return 0
    for case in spec["cases"]:
        try:
            result["cases"][case["name"]] = run_case(processor, case)
        except Exception as exc:
            result["cases"][case["name"]] = {"error": f"{type(exc).__name__}: {exc}"[:2000],
                                             "traceback": traceback.format_exc()[-2000:]}
    for name, path in (spec.get("mmfront") or {}).items():
        try:
            result["decoded"][name] = decode_mmfront(path)
        except Exception as exc:
            result["decoded"][name] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
    print(json.dumps(result))
    return 0


def _placeholder(config: Any, modality: str) -> str | None:
    from vllm.model_executor.models.registry import ModelRegistry

    try:
        cls, _ = ModelRegistry.resolve_model_cls(config.architectures, model_config=config)
        return cls.get_placeholder_str(modality, 0)
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
