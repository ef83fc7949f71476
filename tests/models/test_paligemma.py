"""PaliGemma's prompt layout: the text the transformers backend tokenizes is the text HF's
processor tokenizes (the coverage suite proves the ids equal HF's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mmfront.models.catalog import prompt_layout
from mmfront.models.paligemma import paligemma_prompt_layout

HF = SimpleNamespace(image_token="<image>", tokenizer=SimpleNamespace(bos_token="<bos>"))


@pytest.mark.parametrize(("text", "laid_out"), [
    ("<image>caption en", "<image><bos>caption en\n"),
    ("<image><image>answer en What is it?", "<image><image><bos>answer en What is it?\n"),
    ("Describe <image> and <image> then.", "Describe <image> and <image><bos> then.\n"),
    ("no image here", "no image here"),
])
def test_bos_goes_after_the_last_image_and_a_newline_at_the_end(text: str, laid_out: str) -> None:
    assert paligemma_prompt_layout(text, HF) == laid_out


def test_the_layout_is_found_by_the_hf_processor_class_and_its_subclasses() -> None:
    transformers = pytest.importorskip("transformers")
    processor_class = transformers.PaliGemmaProcessor
    assert prompt_layout(processor_class) is paligemma_prompt_layout
    assert prompt_layout(type("MyPaliGemmaProcessor", (processor_class,), {})) is paligemma_prompt_layout
    assert prompt_layout(transformers.LlavaProcessor) is None
