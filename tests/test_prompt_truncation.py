"""``truncate_prompt_tokens`` as vLLM 0.33's ``TokenizeParams`` applies it (the side-by-side cases
against ``vllm serve`` are in tests/serve/test_vllm_serve_fields.py)."""

from __future__ import annotations

import pytest

from mmfront.errors import ValidationError
from mmfront.inputs import MultiModalKwargsItems, PlaceholderRange, mm_inputs
from mmfront.preprocess.truncation import PromptTruncation, added_special_tokens, resolve_truncation, truncate_prompt


def _ids(inputs: object) -> list[int]:
    return list(inputs["prompt_token_ids"])  # type: ignore[index]


def test_minus_one_keeps_the_context_less_one_token_unless_no_output_is_asked() -> None:
    assert resolve_truncation(-1, None, max_model_len=100, max_output_tokens=None) == PromptTruncation(99)
    assert resolve_truncation(-1, "right", max_model_len=100, max_output_tokens=16) == PromptTruncation(99, "right")
    assert resolve_truncation(-1, None, max_model_len=100, max_output_tokens=0) == PromptTruncation(100)
    assert resolve_truncation(None, "left", max_model_len=100, max_output_tokens=None) is None
    assert resolve_truncation(100, None, max_model_len=100, max_output_tokens=None) == PromptTruncation(100)


def test_more_than_the_context_is_refused_in_vllms_words() -> None:
    with pytest.raises(ValidationError) as e:
        resolve_truncation(101, None, max_model_len=100, max_output_tokens=None)
    assert e.value.parameter == "truncate_prompt_tokens"
    assert str(e.value).startswith("truncate_prompt_tokens=101 cannot be greater than max_model_len = 100. Please "
                                   "request a smaller truncation size.")


def test_a_side_slices_and_the_tokenizer_keeps_its_special_tokens() -> None:
    text = mm_inputs([2, 10, 11, 12, 13, 14, 1], MultiModalKwargsItems(), {}, {}, prompt="t")
    assert _ids(truncate_prompt(text, PromptTruncation(3, "left"))) == [13, 14, 1]
    assert _ids(truncate_prompt(text, PromptTruncation(3, "right"))) == [2, 10, 11]
    assert _ids(truncate_prompt(text, PromptTruncation(3), added_specials=(1, 0))) == [2, 14, 1]
    assert _ids(truncate_prompt(text, PromptTruncation(4), added_specials=(1, 1))) == [2, 13, 14, 1]
    assert _ids(truncate_prompt(text, PromptTruncation(0, "left"))) == []
    assert truncate_prompt(text, PromptTruncation(7)) is text
    assert added_special_tokens([2, 10, 11, 1], [10, 11]) == (1, 1)
    assert added_special_tokens([10, 11], [10, 11]) == (0, 0)


def test_an_item_moves_with_the_cut_and_is_never_cut_through() -> None:
    image = PlaceholderRange(offset=4, length=3)
    inputs = mm_inputs([2, 5, 6, 7, 9, 9, 9, 8, 3], MultiModalKwargsItems(), {"image": ["h"]}, {"image": [image]})
    kept = truncate_prompt(inputs, PromptTruncation(6))
    assert _ids(kept) == [7, 9, 9, 9, 8, 3]
    assert kept["mm_placeholders"] == {"image": [PlaceholderRange(offset=1, length=3)]}
    assert inputs["mm_placeholders"] == {"image": [image]}
    assert _ids(truncate_prompt(inputs, PromptTruncation(7, "right"))) == [2, 5, 6, 7, 9, 9, 9]
    with pytest.raises(ValidationError) as e:
        truncate_prompt(inputs, PromptTruncation(4))
    assert e.value.parameter == "truncate_prompt_tokens"
    assert str(e.value).startswith("truncate_prompt_tokens=4 would split or drop a(n) image item, which spans tokens "
                                   "4 to 7 of the 9-token prompt.")
