"""The Legacy backend on the shared pipeline: items processed apart from their prompt and cached
in the P0 cache, and the frame HF writes around each expansion learned when it is built.

Expected frames, read off each processor's ``__call__`` in transformers 5.14.1: Gemma3 puts
``"\\n\\n"`` on both sides of every expansion; Emu3 puts BOS before the prompt once per image (once
per prompt from 5.15); Qwen2-Audio wraps a bare ``<|AUDIO|>`` in ``<|audio_bos|>``/``<|audio_eos|>``
(not from 5.15).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from backend_cases import build, token_id

from mmfront import MultiModalConfig
from mmfront.cache.factory import processor_only_cache_from_config
from mmfront.errors import UnsupportedModelError
from mmfront.models.transformers import LegacyMultiModalProcessor
from mmfront.models.transformers.legacy import PromptFrame
from mmfront.testing.media import make_audio, make_image
from mmfront.testing.processors import TF_VERSION

pytestmark = pytest.mark.backend

OLD = TF_VERSION.release < (5, 15)

CASES = {
    "gemma3": ("Look:\n<start_of_image>\nand <start_of_image> now", "image",
               lambda: [make_image(32, 32, 0), make_image(40, 30, 1)]),
    "idefics3": ("User:<image> and <image>", "image", lambda: [make_image(64, 32, 0), make_image(20, 20, 1)]),
    "emu3": ("USER: <image> hi <image>", "image", lambda: [make_image(32, 32, 0), make_image(48, 24, 1)]),
    "qwen2_audio": ("A <|audio_bos|><|AUDIO|><|audio_eos|> B <|AUDIO|>", "audio",
                    lambda: [make_audio(1.0, seed=0), make_audio(0.5, seed=1)]),
}


def hf_ids(hf: Any, prompt: str, modality: str, items: list[Any]) -> list[int]:
    kwargs: dict[str, Any] = {"images": items} if modality == "image" else {"audio": items, "sampling_rate": 16000}
    return [int(t) for t in hf(text=prompt, return_tensors="pt", **kwargs)["input_ids"][0].tolist()]


def count_hf_calls(proc: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    run_hf = proc.run_hf
    monkeypatch.setattr(proc, "run_hf", lambda *a, **k: calls.append(1) or run_hf(*a, **k))
    return calls


@pytest.mark.parametrize("kind", list(CASES))
def test_legacy_items_hit_the_p0_cache_and_give_the_same_result(kind: str, request: pytest.FixtureRequest,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    hf = request.getfixturevalue(f"{kind}_processor")
    prompt, modality, make_items = CASES[kind]
    proc = build(LegacyMultiModalProcessor, hf)
    cache = processor_only_cache_from_config(MultiModalConfig())
    assert cache is not None
    calls = count_hf_calls(proc, monkeypatch)
    first = proc.apply(prompt, {modality: make_items()}, cache=cache)
    after_first = len(calls)
    second = proc.apply(prompt, {modality: make_items()}, cache=cache)
    assert after_first >= 1 and len(calls) == after_first  # the hits never reached HF
    stats = cache.make_stats()
    assert (stats.hits, stats.total) == (2, 4)
    assert second["prompt_token_ids"] == first["prompt_token_ids"] == hf_ids(hf, prompt, modality, make_items())
    assert second["mm_hashes"] == first["mm_hashes"]
    assert second["mm_placeholders"] == first["mm_placeholders"]
    for a, b in zip(first["mm_kwargs"][modality], second["mm_kwargs"][modality]):
        assert a is not None and b is not None and a.keys() == b.keys()
        assert f"{modality}_replacement_ids" not in b  # taken out: the cached updates carry the expansion
        for key in a:
            assert torch.equal(torch.as_tensor(a[key].data), torch.as_tensor(b[key].data))


def test_cached_gemma3_image_in_another_prompt_equals_hf(gemma3_processor: Any) -> None:
    """A hit is spliced into a new prompt with HF's own newline merges around it."""
    proc = build(LegacyMultiModalProcessor, gemma3_processor)
    cache = processor_only_cache_from_config(MultiModalConfig())
    image = make_image(40, 30, 5)
    proc.apply("Describe <start_of_image> now", {"image": [image]}, cache=cache)
    prompt = "Line one\n\n<start_of_image>\n\n\nDone"
    out = proc.apply(prompt, {"image": [image]}, cache=cache)
    assert cache is not None and cache.make_stats().hits == 1
    assert out["prompt_token_ids"] == hf_ids(gemma3_processor, prompt, "image", [image])
    (placeholder,) = out["mm_placeholders"]["image"]
    tokens = out["prompt_token_ids"][placeholder.offset:placeholder.offset + placeholder.length]
    boi, eoi = token_id(gemma3_processor, "<start_of_image>"), token_id(gemma3_processor, "<end_of_image>")
    assert (tokens[0], tokens[-1], len(tokens), placeholder.get_num_embeds()) == (boi, eoi, 18, 16)


def test_process_subset_gives_each_item_its_expansion(idefics3_processor: Any) -> None:
    proc = build(LegacyMultiModalProcessor, idefics3_processor)
    items = proc.info.parse_mm_data({"image": [make_image(64, 32, 0), make_image(20, 20, 1)]})
    kw_items, resolved = proc.process_subset(items, {})
    assert kw_items.get_count("image") == 2
    image = token_id(idefics3_processor, "<image>")
    fake = token_id(idefics3_processor, "<fake_token_around_image>")
    for (update,), length, embeds in zip(resolved["image"], [20, 33], [12, 20]):
        ids = update.content.token_ids(None)
        assert update.target == [image]
        assert (len(ids), ids[0], ids[-1], ids.count(image)) == (length, fake, fake, embeds)


def test_frames_learned_from_hf(gemma3_processor: Any, emu3_processor: Any, qwen2_audio_processor: Any,
                                idefics3_processor: Any) -> None:
    frames = {kind: build(LegacyMultiModalProcessor, hf).frames for kind, hf in [
        ("gemma3", gemma3_processor), ("emu3", emu3_processor), ("qwen2", qwen2_audio_processor),
        ("idefics3", idefics3_processor)]}
    assert frames["gemma3"] == {"image": PromptFrame(lead="\n\n", trail="\n\n")}
    emu3_start, emu3_end = (token_id(emu3_processor, t) for t in ("<|image start|>", "<|image end|>"))
    assert frames["emu3"] == {"image": PromptFrame(start=emu3_processor.tokenizer.bos_token, start_per_item=OLD,
                                                   wrappers=(emu3_start, emu3_end))}
    fake = token_id(idefics3_processor, "<fake_token_around_image>")
    assert frames["idefics3"] == {"image": PromptFrame(wrappers=(fake, fake))}
    bos, eos = (token_id(qwen2_audio_processor, t) for t in ("<|audio_bos|>", "<|audio_eos|>"))
    assert frames["qwen2"] == {"audio": PromptFrame(wrappers=(bos, eos) if OLD else None)}


@pytest.mark.parametrize("prompt", ["A <|AUDIO|> B", "A <|audio_bos|><|AUDIO|><|audio_eos|> B"], ids=["bare", "wrapped"])
def test_qwen2_audio_bare_and_wrapped_placeholders_equal_hf(prompt: str, qwen2_audio_processor: Any) -> None:
    audio = make_audio(1.0, seed=3)
    out = build(LegacyMultiModalProcessor, qwen2_audio_processor).apply(prompt, {"audio": [audio]})
    assert out["prompt_token_ids"] == hf_ids(qwen2_audio_processor, prompt, "audio", [audio])
    (placeholder,) = out["mm_placeholders"]["audio"]
    # The range takes in the wrappers, HF's or the prompt's; from 5.15 HF adds none to a bare one.
    wrapped = OLD or "audio_bos" in prompt
    assert (placeholder.length, placeholder.get_num_embeds()) == (27 if wrapped else 25, 25)


def test_unexpressible_rewrite_is_refused_when_built(gemma3_processor: Any) -> None:
    """Text HF appends after the whole prompt, once per image, is neither a frame around each
    expansion nor a prompt prefix: refused up front rather than placed wrongly."""
    base = type(gemma3_processor)

    class Gemma3AppendsPerImage(base):  # type: ignore[misc, valid-type]
        """Named Gemma3 so its placeholder is <start_of_image>, as for Gemma3Processor."""

        def __call__(self, images: Any = None, text: Any = None, **kwargs: Any) -> Any:
            if images is not None:
                text = [t + " !" * len(images) for t in ([text] if isinstance(text, str) else text)]
            return super().__call__(images=images, text=text, **kwargs)

    hf = Gemma3AppendsPerImage(image_processor=gemma3_processor.image_processor, tokenizer=gemma3_processor.tokenizer,
                         image_seq_length=gemma3_processor.image_seq_length)
    with pytest.raises(UnsupportedModelError, match="cannot reproduce how Gemma3AppendsPerImage rewrites the text around"):
        build(LegacyMultiModalProcessor, hf)
