"""A JPEG decoded straight into pixels (:mod:`mmfront.media.jpeg`) sends the engine exactly what
Pillow's decode of it sends: prompt ids, placeholder ranges, hashes and every item's wire frames,
for the families whose processors read the pixels without a PIL image (the Qwen2-VL family's image
processor, Gemma 3's native path), under each backend. Each case runs once with the fast decode
and once with Pillow's alone, on fresh items. A processing lane decodes into pixels as the
in-place executor does; a processor that reads PIL images gets Pillow's decode."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from vllm_parity import family_folder, prompt_for, wire_frames

from markers import NEEDS_TORCHVISION
from mmfront import MultiModalConfig
from mmfront.media import DecodeBudget, load_image_bytes
from mmfront.media import image as image_module
from mmfront.models.registry import create_processor
from mmfront.processing.executors import InPlaceExecutor, ItemJob, LaneSpec, LocalProcessExecutor
from mmfront.testing.media import make_image
from mmfront.wire import MsgpackEncoder

QWEN_FAMILIES = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor")
QWEN_CONFIGS: dict[str, dict[str, Any]] = {"native": {}, "transformers": {"model_impl": "transformers"},
                "legacy": {"model_impl": "transformers", "transformers_backend": "legacy"}}


def _jpeg(width: int, height: int, seed: int, mode: str = "RGB", **params: Any) -> bytes:
    buffer = io.BytesIO()
    make_image(width, height, seed=seed).convert(mode).save(buffer, format="JPEG", **params)
    return buffer.getvalue()


JPEGS = [_jpeg(48, 40, 0), _jpeg(41, 73, 1, subsampling=0, quality=95), _jpeg(100, 30, 2, progressive=True),
         _jpeg(33, 57, 3, mode="L")]


def sent(proc: Any, payloads: list[bytes], config: MultiModalConfig, kwargs: dict[str, Any] | None = None,
         ) -> dict[str, Any]:
    """Everything the engine receives of one prompt holding ``payloads`` as fresh lazy items."""
    items = [load_image_bytes(p, config=config, budget=DecodeBudget(1 << 30)) for p in payloads]
    ids = proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str("image", 0), len(items)),
                                           add_special_tokens=False)
    out = proc.apply(ids, {"image": items}, hf_processor_mm_kwargs=kwargs)
    return {"ids": list(out["prompt_token_ids"]), "hashes": list(out["mm_hashes"]["image"]),
            "ranges": [(r.offset, r.length, None if r.is_embed is None else r.is_embed.tolist())
                       for r in out["mm_placeholders"]["image"]],
            "frames": wire_frames(out), "pixels": [item.pixels is not None for item in items]}


def both(monkeypatch: pytest.MonkeyPatch, proc: Any, payloads: list[bytes], config: MultiModalConfig,
         kwargs: dict[str, Any] | None = None) -> None:
    fast = sent(proc, payloads, config, kwargs)
    with monkeypatch.context() as patch:
        patch.setattr(image_module, "decode_jpeg_rgb", lambda payload: None)
        slow = sent(proc, payloads, config, kwargs)
    assert fast["pixels"] == [True] * len(payloads) and slow["pixels"] == [False] * len(payloads)
    for key in ("ids", "hashes", "ranges", "frames"):
        assert fast[key] == slow[key], key


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("jpeg_miss")


@NEEDS_TORCHVISION
@pytest.mark.backend
@pytest.mark.parametrize("backend", QWEN_CONFIGS)
@pytest.mark.parametrize("family", QWEN_FAMILIES)
def test_qwen_family_sends_what_pillows_decode_sends(monkeypatch: pytest.MonkeyPatch, family: str, backend: str,
                                                     root: Path) -> None:
    folder, _ = family_folder(family, root)
    config = MultiModalConfig(**QWEN_CONFIGS[backend])
    proc: Any = create_processor(folder, config)
    for case in ([JPEGS[0]], JPEGS, [JPEGS[1], JPEGS[1]]):
        both(monkeypatch, proc, case, config)
    both(monkeypatch, proc, JPEGS[:2], config, {"min_pixels": 28 * 28 * 4, "max_pixels": 28 * 28 * 6})


@NEEDS_TORCHVISION
def test_qwen_image_processor_reads_the_pixels_without_a_pil_image(root: Path) -> None:
    folder, _ = family_folder("Qwen2_5_VLProcessor", root)
    config = MultiModalConfig()
    proc: Any = create_processor(folder, config)
    item = load_image_bytes(JPEGS[0], config=config, budget=DecodeBudget(1 << 30))
    ids = proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str("image", 0), 1), add_special_tokens=False)
    proc.apply(ids, {"image": [item]})
    assert repr(item).startswith("MediaWithBytes(pixels,"), "the miss must not have made a PIL image"


@pytest.mark.parametrize("kwargs", [None, {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8,
                                           "pan_and_scan_min_ratio_to_activate": 1.0}], ids=["plain", "pan-and-scan"])
def test_gemma3_sends_what_pillows_decode_sends(monkeypatch: pytest.MonkeyPatch, gemma3_dir: Path,
                                                kwargs: dict[str, Any] | None) -> None:
    config = MultiModalConfig()
    proc: Any = create_processor(gemma3_dir, config)
    wide = _jpeg(96, 32, 4, quality=95)
    for case in ([JPEGS[0]], [*JPEGS, wide], [wide, wide]):
        both(monkeypatch, proc, case, config, kwargs)


def test_gemma3_native_path_reads_the_pixels_without_a_pil_image(gemma3_dir: Path) -> None:
    config = MultiModalConfig()
    proc: Any = create_processor(gemma3_dir, config)
    exact = _jpeg(32, 32, 5)  # the fixture's own size: no resize, the pixels read where they lie
    items = [load_image_bytes(p, config=config, budget=DecodeBudget(1 << 30)) for p in (exact, JPEGS[1])]
    ids = proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str("image", 0), 2), add_special_tokens=False)
    out = proc.apply(ids, {"image": items})
    assert all(repr(item).startswith("MediaWithBytes(pixels,") for item in items)
    assert np.isfinite(out["mm_kwargs"]["image"][0]["pixel_values"].data.float().numpy()).all()
    pixels = items[0].pixels
    with Image.open(io.BytesIO(exact)) as image:
        assert pixels is not None and np.array_equal(pixels, np.asarray(image.convert("RGB")))


@pytest.mark.usefixtures("preloaded_lane_parents")
def test_a_lane_decodes_into_pixels_and_sends_what_in_place_sends(gemma3_dir: Path) -> None:
    config = MultiModalConfig()
    proc: Any = create_processor(gemma3_dir, config)
    spec = LaneSpec.of(proc)
    assert spec is not None and proc.reads_pixels
    lazy = [load_image_bytes(p, config=config, budget=DecodeBudget(1 << 30)) for p in JPEGS]
    job = ItemJob(proc.info.parse_mm_data({"image": lazy}), {})
    with LocalProcessExecutor(spec, 1) as lanes:
        assert lanes.encode_job(job) is not None, "undecoded JPEGs travel to the lane as their bytes"
        on_lane = [bytes(f) for f in MsgpackEncoder().encode(lanes.run(job, proc))]
    assert not any(item.is_decoded for item in lazy)
    in_place = [bytes(f) for f in MsgpackEncoder().encode(InPlaceExecutor().run(job, proc))]
    assert on_lane == in_place
    assert all(repr(item).startswith("MediaWithBytes(pixels,") for item in lazy)


@NEEDS_TORCHVISION
def test_a_processor_that_reads_pil_images_gets_pillows_decode(root: Path) -> None:
    folder, _ = family_folder("LlavaProcessor", root)
    config = MultiModalConfig()
    proc: Any = create_processor(folder, config)
    assert not proc.reads_pixels
    item = load_image_bytes(JPEGS[0], config=config, budget=DecodeBudget(1 << 30))
    InPlaceExecutor().run(ItemJob(proc.info.parse_mm_data({"image": [item]}), {}), proc)
    assert repr(item).startswith("MediaWithBytes(JpegImageFile,"), "no array made only to make a PIL image of it"
    assert item.pixels is None
