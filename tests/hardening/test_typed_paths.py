"""Issue 13.12: paths that are typed but went wrong.

Gemma 3's ``image_embeds`` (with ``enable_mm_embeds``) are passed through to the model, never to
the image processor; an audio clip too short for the model says how long it must be.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from mmfront import MultiModalConfig
from mmfront.errors import ProcessorError, ValidationError
from mmfront.models.gemma3 import Gemma3MultiModalProcessor
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.models import build_model_folder

PROMPT = "Look: <start_of_image> and <start_of_image>"
HIDDEN = 8


@pytest.fixture
def embeds_pre(gemma3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> InputPreprocessor:
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(enable_mm_embeds=True))
    hf = pre.processor.info.hf_processor
    monkeypatch.setattr(type(hf.image_processor), "__call__", lambda *a, **k: pytest.fail("image processor called"))
    monkeypatch.setattr(Gemma3MultiModalProcessor, "_native", staticmethod(lambda *a: pytest.fail("pixels computed")))
    return pre


def test_gemma3_image_embeds_reach_the_request(embeds_pre: InputPreprocessor) -> None:
    embeds = [torch.randn(16, HIDDEN), torch.randn(16, HIDDEN)]
    request = InputProcessor(embeds_pre).process_inputs("r", PROMPT, mm_data={"image": embeds})
    assert request.mm_features is not None and len(request.mm_features) == 2
    for feature, given in zip(request.mm_features, embeds, strict=True):
        assert feature.mm_position.get_num_embeds() == 16
        data = feature.data
        assert data is not None and torch.equal(data["image_embeds"].data, given.to(torch.bfloat16))
        assert int(data["num_patches"].data) == 1
    soft = embeds_pre.tokenizer.convert_tokens_to_ids("<image_soft_token>")
    assert request.prompt_token_ids.count(soft) == 32


def test_gemma3_image_embeds_with_crops(embeds_pre: InputPreprocessor) -> None:
    """``(k + 1) * 16`` rows: the original and ``k`` crops, expanded as pan-and-scan expands them."""
    out = embeds_pre.preprocess("<start_of_image>", {"image": torch.randn(1, 3 * 16, HIDDEN)})
    (placeholder,) = out["mm_placeholders"]["image"]
    assert placeholder.get_num_embeds() == 48
    text = embeds_pre.tokenizer.decode(out["prompt_token_ids"])
    assert "Here is the original image" in text and text.count("<start_of_image>") == 3


@pytest.mark.parametrize("rows", [0, 17, 40])
def test_gemma3_image_embeds_of_the_wrong_length(embeds_pre: InputPreprocessor, rows: int) -> None:
    with pytest.raises(ValidationError) as e:
        embeds_pre.preprocess("<start_of_image>", {"image": [torch.randn(rows, HIDDEN)]})
    assert e.value.parameter == "image"
    assert str(e.value) == (f"image_embeds item 0 has {rows} rows; Gemma 3 takes 16 per image (one per soft token), or "
                            "a multiple of 16 for an image with pan-and-scan crops.")


@pytest.mark.hf_version(">=5.16", reason="Qwen2-Audio and GLM-ASR report replacement offsets (the Offsets backend) "
                                         "from transformers 5.16")
@pytest.mark.parametrize(("kind", "placeholder", "shortest", "ms"),
                         [("qwen2_audio", "<|AUDIO|>", 321, 20), ("glmasr", "<|pad|>", 961, 60)])
def test_too_short_audio_says_the_minimum_length(
    tmp_path: Path, kind: str, placeholder: str, shortest: int, ms: int,
) -> None:
    # GLM-ASR's native inputs are not proven equal to vLLM's (refused for --model-impl auto): its transformers layout
    impl = "transformers" if kind == "glmasr" else "auto"
    pre = InputPreprocessor(build_model_folder(kind, tmp_path), MultiModalConfig(model_impl=impl))
    prompt = f"Listen: {placeholder}"
    with pytest.raises(ProcessorError) as e:
        pre.preprocess(prompt, {"audio": [(np.zeros(shortest - 1, dtype=np.float32), 16000)]})
    assert e.value.parameter == "audio"
    assert str(e.value).endswith(f"expands audio item 0 to no tokens, so the model could not see it. The clip is too "
                                 f"short: send at least {shortest} samples at 16000 Hz ({ms} ms), or pad it with "
                                 "silence.")
    out = pre.preprocess(prompt, {"audio": [(np.zeros(shortest, dtype=np.float32), 16000)]})
    assert out["mm_placeholders"]["audio"][0].get_num_embeds() == 1
