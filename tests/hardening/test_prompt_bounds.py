"""Issue 13.8 (part): a prompt that cannot fit ``max_model_len`` is refused before it is tokenized.

The bound is ``max_model_len`` times the longest token string of the vocabulary: no longer
string can fit, so nothing that fits is refused. ``max_prompt_chars`` sets it explicitly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront.errors import ConfigError, ValidationError
from mmfront.preprocess import InputPreprocessor, InputProcessor

MAX_MODEL_LEN = 64


def longest_token(pre: InputPreprocessor) -> int:
    return max(len(token) for token in pre.tokenizer.get_vocab())


@pytest.fixture
def pre(gemma3_dir: Path) -> InputPreprocessor:
    return InputPreprocessor(gemma3_dir, MultiModalConfig(max_model_len=MAX_MODEL_LEN))


def no_tokenizing(pre: InputPreprocessor, mp: pytest.MonkeyPatch) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the prompt was tokenized")

    mp.setattr(pre.tokenizer, "encode", fail)


def test_fifty_megabytes_of_text_are_never_tokenized(pre: InputPreprocessor, monkeypatch: pytest.MonkeyPatch) -> None:
    no_tokenizing(pre, monkeypatch)
    limit = MAX_MODEL_LEN * longest_token(pre)
    with pytest.raises(ValidationError) as e:
        InputProcessor(pre).prepare("r", "word " * 10_000_000)
    assert e.value.parameter == "prompt"
    assert str(e.value) == (f"The prompt has 50000000 characters; the limit is {limit} (with max_model_len=64 no "
                            "longer prompt fits, whatever it holds). Shorten the prompt; it was not tokenized.")


def test_a_huge_chat_text_part_is_refused_before_tokenizing(
    pre: InputPreprocessor, monkeypatch: pytest.MonkeyPatch,
) -> None:
    no_tokenizing(pre, monkeypatch)
    messages = [{"role": "user", "content": [{"type": "text", "text": "x" * 5_000_000}]}]
    with pytest.raises(ValidationError, match=r"^The prompt has 50000[0-9]{2} characters") as e:
        pre.preprocess(messages)
    assert e.value.parameter == "prompt"


def test_a_prompt_at_the_bound_is_tokenized_and_judged_by_its_tokens(pre: InputPreprocessor) -> None:
    limit = MAX_MODEL_LEN * longest_token(pre)
    assert pre.processor.info.max_prompt_chars == limit
    with pytest.raises(ValidationError, match=r"^This model's maximum context length is 64 tokens. However, your prompt contains [0-9]+ input "):
        InputProcessor(pre).prepare("r", "a" * limit)
    with pytest.raises(ValidationError, match=f"^The prompt has {limit + 1} characters"):
        InputProcessor(pre).prepare("r", "a" * (limit + 1))


def test_every_prompt_that_fits_passes(pre: InputPreprocessor) -> None:
    """The longest token repeated: the most characters per token there can be, and it fits."""
    token = max(pre.tokenizer.get_vocab(), key=len)
    text = pre.tokenizer.convert_tokens_to_string([token]) * (MAX_MODEL_LEN // 2)
    prepared = InputProcessor(pre).prepare("r", text)
    assert len(prepared.inputs["prompt_token_ids"]) < MAX_MODEL_LEN


def test_an_explicit_bound(gemma3_dir: Path) -> None:
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(max_prompt_chars=10))
    assert pre.preprocess("ten chars!")["prompt_token_ids"]
    with pytest.raises(ValidationError, match=r"^The prompt has 11 characters; the limit is 10 "
                                              r"\(MultiModalConfig.max_prompt_chars\)"):
        pre.preprocess("eleven char")


def test_a_safe_bound_without_max_model_len(gemma3_dir: Path) -> None:
    """Issue 22 class 1: there used to be no bound at all here (tests/hardening/test_safe_defaults.py)."""
    pre = InputPreprocessor(gemma3_dir)
    assert pre.processor.info.max_prompt_chars == 524_288
    assert len(pre.preprocess("word " * 2_000)["prompt_token_ids"]) > 2_000


@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_max_prompt_chars_is_checked(value: object) -> None:
    with pytest.raises(ConfigError, match=f"max_prompt_chars must be an integer >= 1, got {value!r}"):
        MultiModalConfig(max_prompt_chars=value)  # type: ignore[arg-type]
