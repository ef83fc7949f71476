"""Audio families vLLM 0.33 serves one clip per prompt: AudioFlamingo3 and GLM-ASR send what its
native frontend sends; MOSS-Transcribe-Diarize stays refused (the harness is ``vllm_parity``, see
``test_vllm_parity.py``).

AudioFlamingo3 and GLM-ASR: HF cuts a clip into Whisper windows; vLLM sends each clip's
``chunk_counts`` (batched, on the CPU) and the windows' ``input_features`` and
``feature_attention_mask`` flat along dim 0 by them, each range masked to the audio tokens. Proven
for clips of two lengths, a clip of two windows, and the same clip in two requests (equal hashes).
vLLM takes one clip per prompt for AudioFlamingo3 (``get_supported_mm_limits``) and fails on a
second one for GLM-ASR (HF's ``GlmAsrProcessor`` gets one text for two clips): a second clip is
refused with that reason, and the peer's own failure is checked beside it. MOSS-Transcribe-Diarize:
vLLM's processor reads ``audio_feature_lengths``, which transformers' processor does not return, so
vLLM itself fails on the folder; it is refused with that reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from vllm_parity import Case, family_folder, prompt_for, run_family, wire_frames

from mmfront import MultiModalConfig
from mmfront.cache.factory import processor_only_cache_from_config
from mmfront.errors import UnsupportedModelError, ValidationError
from mmfront.models.registry import create_processor
from mmfront.testing.media import make_audio
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()
needs_peer = pytest.mark.skipif(PEER is None, reason=SKIP_REASON)

ONE_CLIP = ("AudioFlamingo3Processor", "GlmAsrProcessor")
VLLM_PROCESSOR = {"AudioFlamingo3Processor": "AudioFlamingo3MultiModalProcessor",
                  "GlmAsrProcessor": "GlmAsrMultiModalProcessor"}
RANGES = {"AudioFlamingo3Processor": {"audio_one": 25, "audio_long": 40, "audio_windows": 775, "audio_again": 25},
          "GlmAsrProcessor": {"audio_one": 12, "audio_long": 20, "audio_windows": 387, "audio_again": 12}}
"""Each case's range length (vLLM's, proven equal): 1.0 s, 1.6 s, 31 s (two 30 s windows), 1.0 s again."""
VLLM_TWO_CLIPS = {"AudioFlamingo3Processor": "VLLMValidationError: At most 1 audio(s) may be provided in one prompt.",
                  "GlmAsrProcessor": "ValueError: Failed to apply GlmAsrProcessor on data={'text': '<|pad|><|pad|>'"}
"""How vLLM 0.33 answers two clips in one prompt."""
REASON = {"AudioFlamingo3Processor": "vLLM 0.33's native AudioFlamingo3 class takes one audio clip per prompt",
          "GlmAsrProcessor": "vLLM 0.33's native GLM-ASR processor calls HF's GlmAsrProcessor with one text for all"}

MOSS = "MossTranscribeDiarizeProcessor"
MOSS_ABSENT = f"transformers {transformers.__version__} has no MossTranscribeDiarizeProcessor"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity-audio-one-clip")


def clip(seconds: float, seed: int) -> tuple[Any, int]:
    return make_audio(seconds, 16000, seed=seed), 16000


def cases() -> list[Case]:
    first = clip(1.0, 0)
    return [Case("audio_one", "audio", [first]), Case("audio_long", "audio", [clip(1.6, 1)]),
            Case("audio_windows", "audio", [clip(31.0, 2)]), Case("audio_again", "audio", [first]),
            Case("audio_two", "audio", [first, clip(1.6, 1)])]


@needs_peer
@pytest.mark.slow
@pytest.mark.parametrize("processor_class", ONE_CLIP)
def test_engine_inputs_equal_vllm_native(processor_class: str, root: Path) -> None:
    result = run_family(processor_class, root, cases=cases())
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    assert result["mmfront_impl"] == "native"
    resolved = result["vllm"]["resolved"]
    assert resolved["processor"] == VLLM_PROCESSOR[processor_class]
    assert resolved["dtype"] == "bfloat16" and resolved["mm_device_do_normalize"] is False
    for name, diff in result["diff"].items():
        if name != "audio_two":
            assert diff == {"differs": [], "details": []}, f"{processor_class} {name}: {diff}"
    vllm = result["vllm"]["cases"]
    for name, length in RANGES[processor_class].items():
        ((offset, size, is_embed),) = vllm[name]["mm_placeholders"]["audio"]
        assert (offset, size) == (2, length) and is_embed == [True] * length  # vLLM's select_token_id mask
        (item,) = vllm[name]["mm_kwargs"]["audio"]
        assert sorted(item) == ["chunk_counts", "feature_attention_mask", "input_features"]
        windows = 2 if name == "audio_windows" else 1
        assert item["chunk_counts"]["field"] == ["batched", {"keep_on_cpu": True}]
        assert item["chunk_counts"]["data"][1:3] == ["int64", []]
        for key, dtype, shape in (("input_features", "bfloat16", [windows, 80, 3000]),
                                  ("feature_attention_mask", "int32", [windows, 3000])):
            kind, values = item[key]["field"]
            assert (kind, values["dim"], values["keep_on_cpu"]) == ("flat", 0, False)
            assert item[key]["data"][1:3] == [dtype, shape]
    # the same clip in two requests: one hash, vLLM's (the diff above) and mmfront's
    assert vllm["audio_one"]["mm_hashes"] == vllm["audio_again"]["mm_hashes"]
    assert vllm["audio_one"]["mm_hashes"] != vllm["audio_long"]["mm_hashes"]
    # two clips: vLLM fails, mmfront refuses with the reason
    two = result["diff"]["audio_two"]
    assert two["differs"] == ["error"] and two["vllm_error"].startswith(VLLM_TWO_CLIPS[processor_class])
    assert two["mmfront_error"].startswith(
        f"ValidationError: At most 1 audio(s) may be provided in one prompt. {REASON[processor_class]}")


@needs_peer
@pytest.mark.slow
def test_moss_transcribe_diarize_fails_in_vllm_itself(root: Path) -> None:
    """vLLM's own frontend fails on transformers' processor: the refusal's reason is vLLM's KeyError."""
    if not hasattr(transformers, MOSS):
        pytest.skip(MOSS_ABSENT)
    result = run_family(MOSS, root, cases=cases()[:1])
    assert result["refused"].startswith("MossTranscribeDiarizeForConditionalGeneration runs vLLM 0.33's native class")
    assert "audio_feature_lengths" in result["refused"]
    assert result["vllm"]["resolved"]["processor"] == "MossTranscribeDiarizeMultiModalProcessor"
    assert result["vllm"]["cases"]["audio_one"]["error"] == "KeyError: 'audio_feature_lengths'"


@pytest.mark.parametrize("processor_class", ONE_CLIP)
def test_a_second_clip_is_refused_with_vllms_limit(processor_class: str, root: Path) -> None:
    folder, _ = family_folder(processor_class, root)
    proc = create_processor(folder, MultiModalConfig(limit_mm_per_prompt={"audio": 5}))
    assert proc.info.native is not None
    assert proc.info.get_supported_mm_limits() == {"audio": 1} and proc.info.allowed_mm_limits == {"audio": 1}
    ids = proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str("audio", 0), 2), add_special_tokens=False)
    with pytest.raises(ValidationError, match=r"^At most 1 audio\(s\) may be provided in one prompt\. vLLM 0\.33's "
                                              r"native .*--model-impl transformers\.$") as refused:
        proc.apply(ids, {"audio": [clip(1.0, 0), clip(1.6, 1)]})
    assert REASON[processor_class] in str(refused.value) and "--limit-mm-per-prompt" not in str(refused.value)
    # vLLM's transformers backend takes both clips
    backend = create_processor(folder, MultiModalConfig(model_impl="transformers"))
    assert backend.info.native is None and backend.info.get_supported_mm_limits() == {"audio": None}
    out = backend.apply(ids, {"audio": [clip(1.0, 0), clip(1.6, 1)]})
    assert len(out["mm_kwargs"]["audio"]) == 2


@pytest.mark.parametrize("processor_class", ONE_CLIP)
def test_cache_hit_sends_what_a_miss_sends(processor_class: str, root: Path) -> None:
    """One clip per prompt: the same clip in a second request (another prompt) is a hit and sends the miss's bytes."""
    folder, _ = family_folder(processor_class, root)
    proc = create_processor(folder, MultiModalConfig())
    cache = processor_only_cache_from_config(proc.info.config)
    assert cache is not None
    placeholder = proc.get_placeholder_str("audio", 0)
    tokenizer = proc.info.get_tokenizer()
    first = tokenizer.encode(prompt_for(placeholder, 1), add_special_tokens=False)
    second = tokenizer.encode(f"Transcribe {placeholder} now.", add_special_tokens=False)
    miss = proc.apply(first, {"audio": [clip(31.0, 2)]}, cache=cache)
    hit = proc.apply(second, {"audio": [clip(31.0, 2)]}, cache=cache)
    assert cache.make_stats().hits == 1
    assert hit["mm_hashes"] == miss["mm_hashes"]
    assert [r.length for r in hit["mm_placeholders"]["audio"]] == [r.length for r in miss["mm_placeholders"]["audio"]]
    assert wire_frames(hit) == wire_frames(miss)
    (item,) = miss["mm_kwargs"]["audio"]
    assert item is not None and sorted(item) == ["chunk_counts", "feature_attention_mask", "input_features"]
    chunk_counts, features = item["chunk_counts"].data, item["input_features"].data
    assert isinstance(chunk_counts, torch.Tensor) and isinstance(features, torch.Tensor)
    assert chunk_counts.tolist() == 2 and tuple(features.shape) == (2, 80, 3000)


def test_moss_transcribe_diarize_is_refused_with_the_reason(root: Path) -> None:
    if not hasattr(transformers, MOSS):
        pytest.skip(MOSS_ABSENT)
    folder, _ = family_folder(MOSS, root)
    for impl in ("auto", "vllm"):
        with pytest.raises(UnsupportedModelError, match=r"reads `audio_feature_lengths`.*KeyError: 'audio_feature_lengths'"
                                                        r".*Serve it with --model-impl transformers"):
            create_processor(folder, MultiModalConfig(model_impl=impl))
    assert create_processor(folder, MultiModalConfig(model_impl="transformers")).info.native is None
