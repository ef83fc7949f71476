"""Idefics3, SmolVLM, Qwen2-Audio and Gemma 3n send what vLLM 0.33's native frontend sends (the ``num_patches``
and audio families; the harness is ``vllm_parity``, see ``test_vllm_parity.py``).

Idefics3 and SmolVLM (vLLM runs ``Idefics3MultiModalProcessor`` for both): the tiles ``[tiles, C, H,
W]`` and their masks flat along dim 0 by each image's ``num_patches`` (batched, on the CPU: vLLM's
model pops it without a default), ranges masked to the image tokens. Qwen2-Audio: a clip's
``input_features`` and ``feature_attention_mask`` batched, ranges without a mask. Gemma 3n: an
image's pixels and a clip's ``input_features_padded`` (its own frames) batched. Images of three
sizes and aspect ratios, two images, the same image twice; clips of two lengths, two clips, the same
clip twice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_parity import (
    AUDIO_SECONDS,
    Case,
    assert_a_hit_sends_the_miss,
    default_cases,
    family_folder,
    run_family,
)

from mmfront import MultiModalConfig
from mmfront.errors import ProcessorError, UnsupportedModelError
from mmfront.models.registry import create_processor
from mmfront.models.transformers import OFFSETS_MIN_VERSION, TRANSFORMERS_VERSION
from mmfront.testing.media import make_audio
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

LEGACY = TRANSFORMERS_VERSION < OFFSETS_MIN_VERSION
LEGACY_REFUSED = {
    "Idefics3Processor": "refused for the native class on the Legacy backend (test_idefics3_is_refused_on_the_legacy_backend)",
    "Gemma3nProcessor": "refused for the native class on the Legacy backend (test_gemma3n_is_refused_on_the_legacy_backend...)",
}
LEGACY_REFUSED["SmolVLMProcessor"] = LEGACY_REFUSED["Idefics3Processor"]
WRAPPED_AUDIO = "<|audio_bos|><|AUDIO|><|audio_eos|>"
"""Qwen2-Audio's chat template's spelling of a clip; HF < 5.15 wraps a bare ``<|AUDIO|>`` so itself."""

PEER = vllm_peer_python()
needs_peer = pytest.mark.skipif(PEER is None, reason=SKIP_REASON)

PROVEN = ("Idefics3Processor", "SmolVLMProcessor", "Qwen2AudioProcessor", "Gemma3nProcessor")
VLLM_PROCESSOR = {"Qwen2AudioProcessor": "Qwen2AudioMultiModalProcessor", "Gemma3nProcessor": "Gemma3nMultiModalProcessor"}

@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity-audio")


def cases(processor_class: str) -> list[Case] | None:
    """The default cases; Qwen2-Audio's add the same clip twice and clips its chat template wraps."""
    if processor_class != "Qwen2AudioProcessor":
        return None
    clips = [(make_audio(s, 16000, seed=i), 16000) for i, s in enumerate(AUDIO_SECONDS)]
    return [*default_cases(["audio"]), Case("audio_same_twice", "audio", [clips[1], clips[1]]),
            Case("audio_wrapped", "audio", clips[:1], placeholder=WRAPPED_AUDIO),
            Case("audio_two_wrapped", "audio", clips, placeholder=WRAPPED_AUDIO)]


@needs_peer
@pytest.mark.slow
@pytest.mark.parametrize("processor_class", PROVEN)
def test_engine_inputs_equal_vllm_native(processor_class: str, root: Path) -> None:
    if LEGACY and processor_class in LEGACY_REFUSED:
        pytest.skip(LEGACY_REFUSED[processor_class])
    result = run_family(processor_class, root, cases=cases(processor_class))
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    assert result["mmfront_impl"] == "native"
    resolved = result["vllm"]["resolved"]
    assert resolved["processor"] == VLLM_PROCESSOR.get(processor_class, "Idefics3MultiModalProcessor")
    assert resolved["dtype"] == "bfloat16" and resolved["mm_device_do_normalize"] is False
    for name, diff in result["diff"].items():
        assert diff == {"differs": [], "details": []}, f"{processor_class} {name}: {diff}"
    vllm = result["vllm"]["cases"]
    if processor_class == "Qwen2AudioProcessor":
        assert set(result["diff"]) == {"audio_one", "audio_two", "audio_same_twice", "audio_wrapped", "audio_two_wrapped"}
        (item,) = vllm["audio_one"]["mm_kwargs"]["audio"]
        assert sorted(item) == ["feature_attention_mask", "input_features"]
        assert item["input_features"]["field"] == ["batched", {"keep_on_cpu": False}]
        assert item["input_features"]["data"][1:3] == ["bfloat16", [80, 3000]]
        first, second = vllm["audio_same_twice"]["mm_hashes"]["audio"]
        assert first == second
        ranges = vllm["audio_two"]["mm_placeholders"]["audio"]
        assert [r[1] for r in ranges] == [25, 40] and all(r[2] is None for r in ranges)
        # a bare <|AUDIO|> becomes the clip's audio tokens alone; the template's wrappers stay outside the range
        audio = vllm["audio_one"]["prompt_token_ids"][2]
        bos, eos = (vllm["audio_wrapped"]["prompt_token_ids"][i] for i in (2, 28))
        assert vllm["audio_one"]["prompt_token_ids"][2:27] == [audio] * 25 and audio not in (bos, eos)
        assert vllm["audio_wrapped"]["mm_placeholders"]["audio"] == [[3, 25, None]]
        wrapped = vllm["audio_two_wrapped"]
        assert [(r[0], r[1], r[2]) for r in wrapped["mm_placeholders"]["audio"]] == [(3, 25, None), (32, 40, None)]
        assert [wrapped["prompt_token_ids"][i] for i in (2, 28, 31, 72)] == [bos, eos, bos, eos]
        return
    if processor_class == "Gemma3nProcessor":
        assert set(result["diff"]) == {"image_one", "image_tall", "image_two", "image_same_twice", "audio_one",
                                       "audio_two"}
        first, second = vllm["audio_two"]["mm_kwargs"]["audio"]
        assert sorted(first) == ["input_features_mask", "input_features_padded"]
        assert first["input_features_padded"]["field"] == ["batched", {"keep_on_cpu": False}]
        # each clip trimmed to its own frames (1.0 s and 1.6 s), whatever it was processed with
        assert (first["input_features_padded"]["data"][2], second["input_features_padded"]["data"][2]) == (
            [97, 128], [157, 128])
        (image,) = vllm["image_one"]["mm_kwargs"]["image"]
        assert image["pixel_values"]["field"][0] == "batched" and image["pixel_values"]["data"][2] == [3, 224, 224]
        return
    assert set(result["diff"]) == {"image_one", "image_tall", "image_two", "image_same_twice"}
    first, second = vllm["image_two"]["mm_kwargs"]["image"]
    assert sorted(first) == ["num_patches", "pixel_attention_mask", "pixel_values"]
    assert first["num_patches"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert first["pixel_values"]["field"][0] == "flat" and first["pixel_values"]["field"][1]["dim"] == 0
    assert (first["pixel_values"]["data"][2], second["pixel_values"]["data"][2]) == ([5, 3, 64, 64], [3, 3, 64, 64])
    ranges = vllm["image_two"]["mm_placeholders"]["image"]
    assert all(r[2] is not None and not all(r[2]) for r in ranges)  # the image tokens alone are embedded


@needs_peer
@pytest.mark.slow
def test_qwen2_audio_on_the_legacy_backend_equals_vllm_native(root: Path) -> None:
    """The Legacy backend (transformers < 5.15's, or forced) places a clip as vLLM's class does: a bare
    ``<|AUDIO|>`` becomes the audio tokens alone (HF 5.14 wraps it), a wrapped one keeps its wrappers
    outside the range, with no mask."""
    result = run_family("Qwen2AudioProcessor", root, cases=cases("Qwen2AudioProcessor"),
                        config_kwargs={"transformers_backend": "legacy"})
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    assert result["mmfront_impl"] == "native"
    assert result["diff"] and all(d == {"differs": [], "details": []} for d in result["diff"].values()), result["diff"]
    assert result["mmfront"]["audio_two_wrapped"]["mm_placeholders"]["audio"] == [[3, 25, None], [32, 40, None]]


@pytest.mark.parametrize("processor_class", ["Idefics3Processor", "Qwen2AudioProcessor"])
def test_cache_hit_sends_what_a_miss_sends(processor_class: str, root: Path) -> None:
    if LEGACY and processor_class in LEGACY_REFUSED:
        pytest.skip(LEGACY_REFUSED[processor_class])
    folder, _ = family_folder(processor_class, root)
    config = MultiModalConfig()
    proc = create_processor(folder, config)
    assert proc.info.native is not None
    modality = "audio" if processor_class == "Qwen2AudioProcessor" else "image"
    [case] = [c for c in default_cases([modality]) if c.name == f"{modality}_two"]
    assert_a_hit_sends_the_miss(proc, modality, case.media)


def test_gemma3n_is_refused_on_the_legacy_backend_for_the_native_class(root: Path) -> None:
    """Gemma 3n's ranges under HF < 5.15 cover the soft tokens alone, vLLM's the whole replacement."""
    folder, _ = family_folder("Gemma3nProcessor", root)
    with pytest.raises(UnsupportedModelError, match=r"Legacy transformers backend.*its ranges cover the soft tokens alone"):
        create_processor(folder, MultiModalConfig(transformers_backend="legacy"))
    backend = MultiModalConfig(transformers_backend="legacy", model_impl="transformers")
    assert create_processor(folder, backend).info.native is None


@pytest.mark.parametrize("processor_class", ["Idefics3Processor", "SmolVLMProcessor"])
def test_idefics3_is_refused_on_the_legacy_backend(processor_class: str, root: Path) -> None:
    """The Legacy backend locates a tiled image by HF < 5.15's token counts, not proven equal to vLLM's layout."""
    folder, _ = family_folder(processor_class, root)
    with pytest.raises(UnsupportedModelError, match=r"Legacy transformers backend.*<row_R_col_C> and <global-img>.*"
                                                     r"not proven equal to vLLM's.*--model-impl transformers"):
        create_processor(folder, MultiModalConfig(transformers_backend="legacy"))


@pytest.mark.skipif(not LEGACY, reason="transformers >= 5.15 runs the Offsets backend, which reads each expansion from HF")
@pytest.mark.parametrize(("processor_class", "why"), [
    ("Idefics3Processor", r"per-item counts \[858, 858\]: the counts do not add up to those tokens: before transformers "
                          r"5.15 Idefics3's processor counts each <row_R_col_C> and <global-img> marker as one token"),
    ("SmolVLMProcessor", r"in 5 run\(s\), per-item counts None: the processor reports no per-item token counts"),
])
def test_legacy_backend_says_why_it_cannot_locate_split_markers(processor_class: str, why: str, root: Path) -> None:
    """The parity folders' tokenizer splits ``<row_1_col_1>`` into characters, which HF 5.14 counts as one token."""
    folder, _ = family_folder(processor_class, root)
    with pytest.raises(ProcessorError, match=why + r".*Upgrade transformers to >= 5.15"):
        create_processor(folder, MultiModalConfig(model_impl="transformers"))
