"""What vLLM's engine receives from mmfront equals what vLLM 0.33's own frontend sends, family by family.

For each family proven so far, ``vllm_parity.run_family`` runs the same prompts and media through
mmfront's ``create_processor(folder).apply`` and, in the vLLM peer venv, through
``MULTIMODAL_REGISTRY.create_processor(ModelConfig(folder)).apply`` for the implementation vLLM's
``--model-impl auto`` resolves (the native class). Compared: prompt ids, placeholder ranges with
``is_embed``, hashes, and every item's keys, field class (with ``dim`` and ``keep_on_cpu``), dtype,
shape and bytes after vLLM's own ``MsgpackDecoder`` read mmfront's frames. Several image sizes and
aspect ratios, two images in one prompt, the same image twice, and videos (all frames kept, sampled,
two clips) where the family takes them.

The peer tests skip where no peer venv exists (:mod:`mmfront.testing.peer`); the refusal and cache
tests run everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from packaging.version import Version
from vllm_parity import assert_a_hit_sends_the_miss, default_cases, family_folder, prompt_for, run_family, video_clip

from mmfront import MultiModalConfig
from mmfront.errors import UnsupportedModelError
from mmfront.models.native import VLLM_NATIVE_ARCHITECTURES
from mmfront.models.registry import create_processor
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()
needs_peer = pytest.mark.skipif(PEER is None, reason=SKIP_REASON)

PROVEN = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Exaone4_5_Processor", "LlavaProcessor")
"""Families whose native inputs are declared (``ModelSpec.native``) and proven here."""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity")


@needs_peer
@pytest.mark.slow
@pytest.mark.parametrize("processor_class", PROVEN)
def test_engine_inputs_equal_vllm_native(processor_class: str, root: Path) -> None:
    result = run_family(processor_class, root)
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    resolved = result["vllm"]["resolved"]
    assert resolved["model_impl"].endswith("auto") and resolved["processor"].endswith("MultiModalProcessor")
    assert resolved["processor"] != "MultiModalProcessor"  # vLLM's native class, not its transformers backend
    assert result["diff"], "no case ran"
    for name, diff in result["diff"].items():
        assert diff == {"differs": [], "details": []}, f"{processor_class} {name}: {diff}"
    cases = result["vllm"]["cases"]
    if processor_class != "LlavaProcessor":  # the Qwen2-VL layout
        (item,) = cases["image_one"]["mm_kwargs"]["image"]
        assert item["pixel_values"]["data"][1] == "uint8"  # the engine normalises (mm_device_do_normalize)
        assert item["image_grid_thw"]["field"] == ["batched", {"keep_on_cpu": True}]
        assert resolved["mm_device_do_normalize"] is True
        if "video" in create_processor(family_folder(processor_class, root)[0]).info.get_supported_mm_limits():
            assert {"video_all_frames", "video_sampled", "video_two"} <= set(result["diff"])
        else:  # transformers 5.14 builds these folders without a video processor
            assert Version(transformers.__version__) < Version("5.15"), transformers.__version__
    else:
        (item,) = cases["image_one"]["mm_kwargs"]["image"]
        assert item["pixel_values"]["data"][1:3] == ["bfloat16", [3, 224, 224]]  # a float32 checkpoint, served bf16
        assert resolved["mm_device_do_normalize"] is False
    assert resolved["dtype"] == "bfloat16"
    ranges = cases["image_two"]["mm_placeholders"]["image"]
    assert len(ranges) == 2 and all(r[2] is None for r in ranges)


@needs_peer
@pytest.mark.slow
def test_native_architectures_are_vllm_s() -> None:
    from vllm_parity import native_architectures

    assert PEER is not None
    assert set(native_architectures(PEER)) == VLLM_NATIVE_ARCHITECTURES


@pytest.mark.parametrize("processor_class", ["Qwen2_5_VLProcessor", "LlavaProcessor"])
def test_cache_hit_sends_what_a_miss_sends(processor_class: str, root: Path) -> None:
    folder, _ = family_folder(processor_class, root)
    config = MultiModalConfig()
    proc = create_processor(folder, config)
    [case] = [c for c in default_cases(["image"]) if c.name == "image_two"]
    assert_a_hit_sends_the_miss(proc, "image", case.media)


def test_qwen2_5_vl_short_clip_keeps_every_frame(root: Path) -> None:
    """Fix 6: 8 frames at 2 fps, every frame kept (``do_sample_frames`` true in the metadata)."""
    folder, _ = family_folder("Qwen2_5_VLProcessor", root)
    proc = create_processor(folder)
    if "video" not in proc.info.get_supported_mm_limits():
        pytest.skip(f"transformers {transformers.__version__} builds no video processor for this folder")
    clip = video_clip(8, 2.0, range(8))
    ids = proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str("video", 0), 1), add_special_tokens=False)
    out = proc.apply(ids, {"video": [clip]})
    (item,) = out["mm_kwargs"]["video"]
    assert item is not None
    assert item["video_grid_thw"].data.tolist() == [4, 24, 24]  # 8 frames, 2 per temporal patch; 336 px / 14 px
    assert item["pixel_values_videos"].data.dtype == torch.uint8


def test_unproven_native_family_is_refused(root: Path) -> None:
    folder, architecture = family_folder("Kimi_K25Processor", root)
    assert architecture in VLLM_NATIVE_ARCHITECTURES
    for impl in ("auto", "vllm"):
        with pytest.raises(UnsupportedModelError, match="--model-impl transformers"):
            create_processor(folder, MultiModalConfig(model_impl=impl))
    proc = create_processor(folder, MultiModalConfig(model_impl="transformers"))
    assert proc.info.native is None and not proc.info.device_normalize


def test_model_impl_vllm_needs_a_native_class(tmp_path: Path, root: Path) -> None:
    import json
    import shutil

    folder, _ = family_folder("LlavaProcessor", root)
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    config = json.loads((other / "config.json").read_text())
    config["architectures"] = ["NoSuchNativeClass"]
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="no native class"):
        create_processor(other, MultiModalConfig(model_impl="vllm"))
    assert create_processor(other).info.native is None  # auto: vLLM's transformers backend


def test_device_normalize_follows_the_class(root: Path) -> None:
    qwen, _ = family_folder("Qwen2VLProcessor", root)
    llava, _ = family_folder("LlavaProcessor", root)
    assert create_processor(qwen).info.device_normalize
    assert not create_processor(qwen, MultiModalConfig(mm_device_do_normalize=False)).info.device_normalize
    # vLLM turns it off where the class cannot normalise on the device
    assert not create_processor(llava, MultiModalConfig(mm_device_do_normalize=True)).info.device_normalize
    off = create_processor(qwen, MultiModalConfig(mm_device_do_normalize=False))
    ids = off.info.get_tokenizer().encode(prompt_for(off.get_placeholder_str("image", 0), 1), add_special_tokens=False)
    [case] = [c for c in default_cases(["image"]) if c.name == "image_one"]
    (item,) = off.apply(ids, {"image": case.media})["mm_kwargs"]["image"]
    assert item is not None and item["pixel_values"].data.dtype == torch.bfloat16
