"""Cosmos3 Edge and Qwen3-Omni send what vLLM 0.33's native frontend sends (the harness is
``vllm_parity``, see ``test_vllm_parity.py``).

Cosmos3 Edge (vLLM's ``Cosmos3EdgeMultiModalProcessor``, a Qwen3-VL processor): Qwen2-VL's fields,
normalised patches in the model dtype, each video's frame ``timestamps``; its video placeholder is the
chat template's ``<|vision_start|><|video_pad|><|vision_end|>``, replaced whole by the frames with
their own markers. Three image sizes and aspect ratios, two images, the same image twice; a short
clip with every frame kept, a sampled clip, two clips.

Qwen3-Omni (``Qwen3OmniMoeThinkerMultiModalProcessor``): Qwen2.5-VL's image and video fields with
``second_per_grid_ts`` and the shared ``use_audio_in_video``; a clip's ``input_audio_features`` flat
along time by ``audio_feature_lengths``, its float32 ``feature_attention_mask`` of ones, after vLLM's
padding to whole hops. The image and video cases above; clips of two lengths, one whose length is no
whole number of hops, two clips of one length, the same clip twice, and two clips of different
lengths, where the one intended difference lies: vLLM processes them in one HF call that pads the
shorter to the longer, which changes its last frames; mmfront sends each clip as vLLM sends it alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_parity import (
    Case,
    assert_a_hit_sends_the_miss,
    default_cases,
    family_folder,
    prompt_for,
    run_family,
    video_clip,
)

from mmfront import MultiModalConfig
from mmfront.errors import ProcessorError, PromptUpdateError, ValidationError
from mmfront.models.catalog import model_specs
from mmfront.models.cosmos3_edge import COSMOS3_EDGE_NATIVE
from mmfront.models.registry import create_processor
from mmfront.models.transformers import OFFSETS_MIN_VERSION, TRANSFORMERS_VERSION
from mmfront.testing.media import make_audio
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()
needs_peer = pytest.mark.skipif(PEER is None, reason=SKIP_REASON)

LEGACY = TRANSFORMERS_VERSION < OFFSETS_MIN_VERSION
NO_COSMOS = "transformers before 5.15 (the Legacy backend here: 5.14.1) has no Cosmos3EdgeProcessor, so no folder of it loads"
LEGACY_OMNI = ("under transformers before 5.15 (Legacy) Qwen3-Omni's images of one prompt expand in one run of tokens that the "
               "Legacy backend cannot split per image: the processor is refused with ProcessorError "
               "(test_qwen3_omni_refused_before_5_15)")

COSMOS_VIDEO = "<|vision_start|><|video_pad|><|vision_end|>"
HOP = 160
"""The Whisper feature extractor's hop (samples per mel frame) in the Qwen3-Omni fixture."""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity-omni3-cosmos")


def _clip(seconds: float, seed: int) -> tuple[Any, int]:
    return make_audio(seconds, 16000, seed=seed), 16000


SHORT, LONG, ODD, SHORT_B = _clip(1.0, 0), _clip(1.6, 1), _clip(16050 / 16000, 3), _clip(1.0, 2)
"""1.0 s and 1.6 s (whole hops), 16050 samples (not: vLLM pads it to 16160), another 1.0 s clip."""


def omni_cases() -> list[Case]:
    audio = [Case("audio_one", "audio", [SHORT]), Case("audio_long", "audio", [LONG]),
             Case("audio_odd_length", "audio", [ODD]), Case("audio_two_one_length", "audio", [SHORT, SHORT_B]),
             Case("audio_same_twice", "audio", [LONG, LONG]), Case("audio_two", "audio", [SHORT, LONG])]
    return [*default_cases(["image", "video"]), *audio]


def _equal(diff: dict[str, Any]) -> bool:
    return diff == {"differs": [], "details": []}


def _engine_view(item: dict[str, Any]) -> dict[str, Any]:
    """An item as the engine reads it: a flat field's slices (of the whole request) left out."""
    return {key: {"field": [entry["field"][0], {k: v for k, v in entry["field"][1].items() if k != "slices"}],
                  "data": entry["data"]} for key, entry in item.items()}


@needs_peer
@pytest.mark.slow
def test_cosmos3_edge_equals_vllm_native(root: Path) -> None:
    if LEGACY:
        pytest.skip(NO_COSMOS)
    result = run_family("Cosmos3EdgeProcessor", root)
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    resolved = result["vllm"]["resolved"]
    assert resolved["processor"] == "Cosmos3EdgeMultiModalProcessor" and result["mmfront_impl"] == "native"
    assert resolved["dtype"] == "bfloat16" and resolved["mm_device_do_normalize"] is False
    assert resolved["placeholders"]["video"] == COSMOS_VIDEO
    assert set(result["diff"]) == {"image_one", "image_tall", "image_two", "image_same_twice", "video_all_frames",
                                   "video_sampled", "video_two"}
    for name, diff in result["diff"].items():
        assert _equal(diff), f"{name}: {diff}"
    cases = result["vllm"]["cases"]
    (image,) = cases["image_one"]["mm_kwargs"]["image"]
    assert sorted(image) == ["image_grid_thw", "pixel_values"]
    assert image["image_grid_thw"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert image["pixel_values"]["field"][0] == "flat" and image["pixel_values"]["data"][1:3] == ["bfloat16", [288, 768]]
    assert all(r[2] is None for r in cases["image_two"]["mm_placeholders"]["image"])
    first, second = cases["video_two"]["mm_kwargs"]["video"]
    assert sorted(first) == ["pixel_values_videos", "timestamps", "video_grid_thw"]
    assert [first["timestamps"]["data"], second["timestamps"]["data"]] == [
        [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5], [0.0, 0.5, 1.0, 1.5]]  # one frame per temporal patch
    assert first["timestamps"]["field"] == ["batched", {"keep_on_cpu": True}]
    (sampled,) = cases["video_sampled"]["mm_kwargs"]["video"]
    assert sampled["timestamps"]["data"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]  # frames 0, 2, ... 14 at 2 fps
    video_range = cases["video_all_frames"]["mm_placeholders"]["video"][0]
    assert video_range[2] is not None and not all(video_range[2])  # the frames' timestamps and markers are text


@needs_peer
@pytest.mark.slow
def test_qwen3_omni_equals_vllm_native(root: Path) -> None:
    if LEGACY:
        pytest.skip(LEGACY_OMNI)
    result = run_family("Qwen3OmniMoeProcessor", root, cases=omni_cases())
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    resolved = result["vllm"]["resolved"]
    assert resolved["processor"] == "Qwen3OmniMoeThinkerMultiModalProcessor" and result["mmfront_impl"] == "native"
    assert resolved["dtype"] == "bfloat16" and resolved["mm_device_do_normalize"] is False
    assert set(result["diff"]) == {c.name for c in omni_cases()}
    for name, diff in result["diff"].items():
        if name != "audio_two":
            assert _equal(diff), f"{name}: {diff}"
    assert result["diff"]["audio_two"] == {"differs": ["bytes"], "details": []}
    vllm, mine = result["vllm"]["cases"], result["mmfront"]
    # The intended difference: mmfront's clips are vLLM's clips sent alone. vLLM pads the shorter clip to the
    # longer one in its HF call (its last frames change), and leaves the longer as it is alone.
    alone = [vllm["audio_one"]["mm_kwargs"]["audio"][0], vllm["audio_long"]["mm_kwargs"]["audio"][0]]
    assert [_engine_view(i) for i in mine["audio_two"]["mm_kwargs"]["audio"]] == [_engine_view(i) for i in alone]
    together = [_engine_view(i) for i in vllm["audio_two"]["mm_kwargs"]["audio"]]
    assert together[1] == _engine_view(alone[1]) and together[0] != _engine_view(alone[0])
    assert together[0]["input_audio_features"]["data"][:3] == alone[0]["input_audio_features"]["data"][:3]
    assert vllm["audio_two"]["mm_hashes"] == mine["audio_two"]["mm_hashes"]

    short, long_ = alone
    assert sorted(short) == ["audio_feature_lengths", "feature_attention_mask", "input_audio_features"]
    assert short["input_audio_features"]["field"] == ["flat", {
        "keep_on_cpu": False, "slices": [[["slice", None, None, None], ["slice", 0, 100, None]]], "dim": 1}]
    assert short["input_audio_features"]["data"][1:3] == ["bfloat16", [80, 100]]
    assert short["feature_attention_mask"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert short["feature_attention_mask"]["data"][1:3] == ["float32", [100]]
    assert (short["audio_feature_lengths"]["data"][1:3], long_["input_audio_features"]["data"][2]) == (["int64", []], [80, 160])
    (odd,) = vllm["audio_odd_length"]["mm_kwargs"]["audio"]
    assert odd["input_audio_features"]["data"][2] == [80, -(-16050 // HOP)]  # padded to 101 whole hops
    ranges = vllm["audio_two"]["mm_placeholders"]["audio"]
    assert [r[1] for r in ranges] == [13, 21] and all(r[2] is None for r in ranges)
    first, second = vllm["audio_same_twice"]["mm_hashes"]["audio"]
    assert first == second

    (image,) = vllm["image_one"]["mm_kwargs"]["image"]
    assert sorted(image) == ["image_grid_thw", "pixel_values"] and image["pixel_values"]["data"][1] == "bfloat16"
    clips = vllm["video_two"]["mm_kwargs"]["video"]
    assert sorted(clips[0]) == ["pixel_values_videos", "second_per_grid_ts", "use_audio_in_video", "video_grid_thw"]
    assert clips[0]["use_audio_in_video"]["field"][0] == "shared" and clips[0]["use_audio_in_video"]["data"][1] == "bool"
    assert clips[0]["second_per_grid_ts"]["field"] == ["batched", {"keep_on_cpu": True}]


@pytest.mark.parametrize(("processor_class", "modality"), [
    ("Cosmos3EdgeProcessor", "image"), ("Cosmos3EdgeProcessor", "video"), ("Qwen3OmniMoeProcessor", "image"),
    ("Qwen3OmniMoeProcessor", "video"), ("Qwen3OmniMoeProcessor", "audio")])
def test_cache_hit_sends_what_a_miss_sends(processor_class: str, modality: str, root: Path) -> None:
    if LEGACY:
        pytest.skip(NO_COSMOS if processor_class == "Cosmos3EdgeProcessor" else LEGACY_OMNI)
    folder, _ = family_folder(processor_class, root)
    proc = create_processor(folder, MultiModalConfig())
    assert proc.info.native is not None
    media = {"image": next(c for c in default_cases(["image"]) if c.name == "image_two").media,
             "video": [video_clip(8, 2.0, range(8)), video_clip(4, 2.0, range(4), seed=1)],
             "audio": [SHORT, ODD]}[modality]
    miss, _ = assert_a_hit_sends_the_miss(proc, modality, media)
    if modality == "audio":  # each clip its own frames, whatever it was sent with
        assert [i["input_audio_features"].data.shape[1] for i in miss["mm_kwargs"]["audio"]] == [100, 101]


def test_cosmos3_edge_video_placeholder_is_replaced_whole(root: Path) -> None:
    """vLLM's processor replaces the chat template's whole video placeholder (a bare ``<|video_pad|>``
    fails there); the transformers backend keeps HF's bare token."""
    if LEGACY:
        pytest.skip(NO_COSMOS)
    folder, _ = family_folder("Cosmos3EdgeProcessor", root)
    proc = create_processor(folder)
    tok = proc.info.get_tokenizer()
    assert proc.get_placeholder_str("video", 0) == COSMOS_VIDEO
    clip = video_clip(2, 2.0, range(2))
    out = proc.apply(tok.encode(f"Watch {COSMOS_VIDEO} now", add_special_tokens=False), {"video": [clip]})
    text = tok.decode(out["prompt_token_ids"])
    frame = "<|vision_start|>" + "<|video_pad|>" * 4 + "<|vision_end|>"
    assert text == f"Watch <0.0 seconds>{frame}<0.5 seconds>{frame} now"
    (video_range,) = out["mm_placeholders"]["video"]
    start, end = len(tok.encode("Watch ", add_special_tokens=False)), len(tok.encode(" now", add_special_tokens=False))
    assert (video_range.offset, video_range.length) == (start, len(out["prompt_token_ids"]) - start - end)
    assert video_range.is_embed is not None and int(video_range.is_embed.sum()) == 8  # the pads alone
    with pytest.raises(PromptUpdateError, match=r"Put one `<\|vision_start\|><\|video_pad\|><\|vision_end\|>`"):
        proc.apply(tok.encode("Watch <|video_pad|> now", add_special_tokens=False), {"video": [clip]})
    backend = create_processor(folder, MultiModalConfig(model_impl="transformers"))
    assert backend.info.native is None and backend.get_placeholder_str("video", 0) == "<|video_pad|>"


def test_qwen3_omni_audio_in_video_refused_for_the_native_class(root: Path) -> None:
    if LEGACY:
        pytest.skip(LEGACY_OMNI)
    folder, _ = family_folder("Qwen3OmniMoeProcessor", root)
    proc = create_processor(folder)
    ids = proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str("video", 0), 1), add_special_tokens=False)
    for key in ("use_audio_in_video", "load_audio_from_video"):
        with pytest.raises(ValidationError, match=rf"^mm_processor_kwargs\.{key}=True: .*audio track.*--model-impl transformers"):
            proc.apply(ids, {"video": [video_clip(4, 2.0, range(4))]}, hf_processor_mm_kwargs={key: True})


def test_cosmos3_edge_declared_whatever_the_transformers() -> None:
    """Its module registers where transformers lacks its class too (5.14.1, before its
    ``transformers_since``): no folder of it loads there."""
    assert model_specs()["cosmos3_edge"].native is COSMOS3_EDGE_NATIVE


def test_qwen3_omni_refused_before_5_15(root: Path) -> None:
    folder, _ = family_folder("Qwen3OmniMoeProcessor", root)
    if not LEGACY:
        assert create_processor(folder).info.native is not None
        return
    with pytest.raises(ProcessorError, match=r"Could not locate 2 image item\(s\) in Qwen3OmniMoeProcessor"):
        create_processor(folder)
