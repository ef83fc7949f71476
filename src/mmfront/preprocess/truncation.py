"""``truncate_prompt_tokens``: a prompt cut to its last (or first) N tokens, as vLLM 0.33's
renderer cuts it (``vllm/renderers/params.py``, ``TokenizeParams``).

vLLM cuts a prompt in up to three places, and this module gives the same tokens:

* a text prompt, with no ``truncation_side`` given, is cut by the tokenizer itself
  (``truncation=True, max_length=N``), which keeps the special tokens it adds (Gemma's BOS) and
  cuts the text between them to the rest;
* a text prompt with a ``truncation_side``, and token ids, are sliced: the last N tokens
  (``"left"``, the side vLLM loads every tokenizer with) or the first N (``"right"``);
* a multimodal prompt is cut again once its placeholders are expanded, never through an item: a
  cut that would split or drop one is refused.

mmfront expands placeholders as it tokenizes, so it cuts the expanded prompt once, with the same
result: the items expand in place, so the last N tokens of the expanded prompt are those of the
prompt cut first and expanded after.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from mmfront.errors import ValidationError
from mmfront.inputs import MultiModalInputs

TruncationSide = Literal["left", "right"]

DEFAULT_TRUNCATION_SIDE: TruncationSide = "left"
"""The side vLLM loads its tokenizers with (``vllm/tokenizers/registry.py``): keep the last tokens."""


@dataclass(frozen=True)
class PromptTruncation:
    """How many prompt tokens to keep, and from which side the rest go."""

    tokens: int
    side: TruncationSide | None = None
    """``None``: the tokenizer's own truncation (:data:`DEFAULT_TRUNCATION_SIDE`, the special tokens
    it adds kept); a side: a plain slice of the tokens."""


def resolve_truncation(
    truncate_prompt_tokens: int | None, side: TruncationSide | None, *, max_model_len: int | None,
    max_output_tokens: int | None,
) -> PromptTruncation | None:
    """A request's ``truncate_prompt_tokens`` as tokens to keep (vLLM's ``TokenizeParams``): ``-1``
    keeps what the context holds less one token for the answer (all of it when the request asks
    for no output: ``max_output_tokens`` 0); more than ``max_model_len`` is refused with vLLM's
    400."""
    if truncate_prompt_tokens is None:
        return None
    if max_model_len is not None and truncate_prompt_tokens > max_model_len:
        raise ValidationError(f"truncate_prompt_tokens={truncate_prompt_tokens} cannot be greater than max_model_len "
                              f"= {max_model_len}. Please request a smaller truncation size.",
                              parameter="truncate_prompt_tokens", value=truncate_prompt_tokens)
    tokens = truncate_prompt_tokens
    if tokens < 0:
        if max_model_len is None:
            return None
        tokens = max_model_len if max_output_tokens == 0 else max(0, max_model_len - 1)
    return PromptTruncation(tokens, side)


def truncate_prompt(inputs: MultiModalInputs, truncation: PromptTruncation, *,
                    added_specials: tuple[int, int] = (0, 0)) -> MultiModalInputs:
    """``inputs`` with their prompt cut to ``truncation.tokens``; ``added_specials``: how many
    tokens the tokenizer added before and after a text prompt, which its own truncation keeps
    (only for a text prompt cut by the tokenizer: side ``None``). A cut through a multimodal
    item raises :class:`~mmfront.errors.ValidationError` with vLLM's message."""
    ids = inputs["prompt_token_ids"]
    length, keep = len(ids), truncation.tokens
    if keep >= length:
        return inputs
    left = (truncation.side or DEFAULT_TRUNCATION_SIDE) == "left"
    before, after = added_specials if truncation.side is None else (0, 0)
    room = max(keep - before - after, 0)
    body_start, body_stop = before, length - after
    if room == 0:
        start = stop = body_start
    elif left:
        start, stop = max(body_start, body_stop - room), body_stop
    else:
        start, stop = body_start, min(body_stop, body_start + room)
    cut = [*ids[:before], *ids[start:stop], *ids[body_stop:]]
    placeholders = inputs["mm_placeholders"]
    for modality, ranges in placeholders.items():
        for item in ranges:
            end = item.offset + item.length
            if item.offset < start or end > stop:
                raise ValidationError(
                    f"truncate_prompt_tokens={truncation.tokens} would split or drop a(n) {modality} item, which "
                    f"spans tokens {item.offset} to {end} of the {length}-token prompt. Multimodal placeholders "
                    "expand after truncation is applied, so the limit must leave every multimodal item intact. "
                    "Please raise truncate_prompt_tokens or shorten the multimodal input.",
                    parameter="truncate_prompt_tokens", value=truncation.tokens)
    out = dict(inputs)
    out["prompt_token_ids"] = cut
    if placeholders and start:
        out["mm_placeholders"] = {m: [replace(r, offset=r.offset - start) for r in ranges]
                                  for m, ranges in placeholders.items()}
    return out  # type: ignore[return-value]  # the same TypedDict (prepared inputs keep their commit)


def added_special_tokens(full: list[int], plain: list[int]) -> tuple[int, int]:
    """How many tokens a tokenizer added before and after a text (``full``: its ids with special
    tokens, ``plain``: without)."""
    extra = len(full) - len(plain)
    for before in range(max(extra, 0) + 1):
        if full[before:before + len(plain)] == plain:
            return before, extra - before
    return 0, 0


__all__ = [
    "DEFAULT_TRUNCATION_SIDE",
    "PromptTruncation",
    "TruncationSide",
    "added_special_tokens",
    "resolve_truncation",
    "truncate_prompt",
]
