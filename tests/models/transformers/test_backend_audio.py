"""Audio through both transformers-backend classes.

Qwen2-Audio reports offsets only from transformers 5.16, so it runs through Legacy everywhere and
through Offsets from 5.16; GLM-ASR reports them since 5.14.1 (one audio per text sample), so it runs
through Offsets everywhere. Tiny sizes: 16 mel bins, 2 s windows of 200 frames; Qwen2-Audio gives
25 ``<|AUDIO|>`` for 1.0 s and 12 for 0.5 s; GLM-ASR 12 ``<|pad|>`` for 1.0 s and 37 for 3.0 s, whose
features are two windows.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from backend_cases import build, encode, token_id

from mmfront.models.transformers import LegacyMultiModalProcessor, OffsetsMultiModalProcessor
from mmfront.testing.media import make_audio

pytestmark = pytest.mark.backend

QWEN2_PROMPT = "A <|audio_bos|><|AUDIO|><|audio_eos|> B <|audio_bos|><|AUDIO|><|audio_eos|>"
GLM_PROMPT = "<|user|><|begin_of_audio|><|pad|><|end_of_audio|> and <|begin_of_audio|><|pad|><|end_of_audio|>"

QWEN2_BACKENDS = [
    pytest.param(LegacyMultiModalProcessor, id="legacy"),
    pytest.param(OffsetsMultiModalProcessor, id="offsets", marks=pytest.mark.hf_version(
        ">=5.16", reason="Qwen2AudioProcessor gained replace_audio_token in transformers 5.16.0")),
]


def features(out: Any, index: int, key: str) -> torch.Tensor:
    data = out["mm_kwargs"]["audio"][index][key].data
    assert isinstance(data, torch.Tensor)
    return data


def count_hf_calls(proc: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    run_hf = proc.run_hf
    monkeypatch.setattr(proc, "run_hf", lambda *a, **k: calls.append(1) or run_hf(*a, **k))
    return calls


@pytest.mark.parametrize("cls", QWEN2_BACKENDS)
def test_qwen2_audio_one_placeholder_per_audio_unpadded(cls: type, qwen2_audio_processor: Any,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    audios = [make_audio(1.0, seed=0), make_audio(0.5, seed=1)]
    proc = build(cls, qwen2_audio_processor)
    calls = count_hf_calls(proc, monkeypatch)
    out = proc.apply(QWEN2_PROMPT, {"audio": audios})
    audio_id = token_id(qwen2_audio_processor, "<|AUDIO|>")
    placeholders = out["mm_placeholders"]["audio"]
    assert len(placeholders) == 2 and len(out["mm_kwargs"]["audio"]) == 2
    # Legacy's range takes in the <|audio_bos|>/<|audio_eos|> around the run; Offsets' is the run.
    wrap = 1 if cls is LegacyMultiModalProcessor else 0
    assert [p.length for p in placeholders] == [25 + 2 * wrap, 12 + 2 * wrap]
    assert [p.get_num_embeds() for p in placeholders] == [25, 12]
    for p in placeholders:
        tokens = out["prompt_token_ids"][p.offset:p.offset + p.length]
        assert tokens[wrap:len(tokens) - wrap] == [audio_id] * p.get_num_embeds()
    assert out["mm_kwargs"]["audio"][0]["num_audio_tokens"].data.tolist() == 25
    # Lengths differ, so each audio is processed alone.
    assert len(calls) == 2
    for i, (audio, frames) in enumerate(zip(audios, [100, 50])):
        alone = qwen2_audio_processor(text="<|AUDIO|>", audio=[audio], sampling_rate=16000, return_tensors="pt")
        assert features(out, i, "input_features").shape == (1, 16, 200)
        assert torch.equal(features(out, i, "input_features"), alone["input_features"])
        assert torch.equal(features(out, i, "feature_attention_mask"), alone["feature_attention_mask"])
        assert int(features(out, i, "feature_attention_mask").sum()) == frames


@pytest.mark.parametrize("cls", QWEN2_BACKENDS)
def test_qwen2_audio_equal_lengths_take_one_call(cls: type, qwen2_audio_processor: Any,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    proc = build(cls, qwen2_audio_processor)
    calls = count_hf_calls(proc, monkeypatch)
    out = proc.apply(QWEN2_PROMPT, {"audio": [make_audio(1.0, seed=0), make_audio(1.0, seed=1)]})
    assert len(calls) == 1
    assert [p.get_num_embeds() for p in out["mm_placeholders"]["audio"]] == [25, 25]
    assert not torch.equal(features(out, 0, "input_features"), features(out, 1, "input_features"))


def test_glmasr_offsets_windows_stay_with_their_audio(glmasr_processor: Any) -> None:
    audios = [make_audio(1.0, seed=0), make_audio(3.0, seed=1)]
    out = build(OffsetsMultiModalProcessor, glmasr_processor).apply(GLM_PROMPT, {"audio": audios})
    pad = token_id(glmasr_processor, "<|pad|>")
    placeholders = out["mm_placeholders"]["audio"]
    between = len(encode(glmasr_processor, "<|end_of_audio|> and <|begin_of_audio|>"))
    assert [(p.offset, p.length) for p in placeholders] == [(2, 12), (2 + 12 + between, 37)]
    for p in placeholders:
        assert out["prompt_token_ids"][p.offset:p.offset + p.length] == [pad] * p.length
    for i, (audio, windows) in enumerate(zip(audios, [1, 2])):
        alone = glmasr_processor(text=["<|pad|>"], audio=[audio], sampling_rate=16000, return_tensors="pt")
        assert features(out, i, "input_features").shape == (windows, 16, 200)
        assert torch.equal(features(out, i, "input_features"), alone["input_features"])
        assert torch.equal(features(out, i, "input_features_mask"), alone["input_features_mask"])
    assert [int(out["mm_kwargs"]["audio"][i]["num_audio_tokens"].data) for i in range(2)] == [12, 37]


def test_glmasr_offsets_equal_lengths_split_windows_evenly(glmasr_processor: Any) -> None:
    audios = [make_audio(3.0, seed=0), make_audio(3.0, seed=1)]
    out = build(OffsetsMultiModalProcessor, glmasr_processor).apply(GLM_PROMPT, {"audio": audios})
    for i, audio in enumerate(audios):
        alone = glmasr_processor(text=["<|pad|>"], audio=[audio], sampling_rate=16000, return_tensors="pt")
        assert torch.equal(features(out, i, "input_features"), alone["input_features"])
    batch = out["mm_kwargs"].get_data()
    assert batch["input_features"].shape == (4, 16, 200)  # HF's own layout: one row per window


def test_glmasr_legacy_one_audio(glmasr_processor: Any) -> None:
    prompt = "<|user|><|begin_of_audio|><|pad|><|end_of_audio|>"
    out = build(LegacyMultiModalProcessor, glmasr_processor).apply(prompt, {"audio": [make_audio(3.0)]})
    (placeholder,) = out["mm_placeholders"]["audio"]
    assert (placeholder.offset, placeholder.length, placeholder.get_num_embeds()) == (2, 37, 37)
    assert features(out, 0, "input_features").shape == (2, 16, 200)


def test_glmasr_legacy_places_two_audios_as_offsets_does(glmasr_processor: Any) -> None:
    """HF takes one audio per text sample; Legacy processes items on their own samples, so a prompt
    may hold two audios, spliced exactly as Offsets splices them."""
    audios = [make_audio(1.0, seed=0), make_audio(3.0, seed=1)]
    legacy = build(LegacyMultiModalProcessor, glmasr_processor).apply(GLM_PROMPT, {"audio": audios})
    offsets = build(OffsetsMultiModalProcessor, glmasr_processor).apply(GLM_PROMPT, {"audio": audios})
    assert legacy["prompt_token_ids"] == offsets["prompt_token_ids"]
    assert legacy["mm_placeholders"] == offsets["mm_placeholders"]
    first = legacy["mm_placeholders"]["audio"][0]
    assert (first.offset, first.length) == (2, 12)
    for i in range(2):
        assert torch.equal(features(legacy, i, "input_features"), features(offsets, i, "input_features"))
        assert int(features(legacy, i, "num_audio_tokens")) == [12, 37][i]
