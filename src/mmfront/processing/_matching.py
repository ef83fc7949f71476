"""Finding a prompt-update target in a prompt: token ids with ``list.index``, text with
``str.find``, an index target at the position it names.

Semantics are vLLM 0.33's (``iter_token_matches``, ``replace_token_matches`` and the target
matching of ``apply_prompt_updates``), so the same target matches at the same places. What differs
is cost: matching fast-forwards with ``list.index`` (C speed) and checks a candidate's last token
before comparing the whole slice, instead of comparing at every position.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from mmfront.errors import ValidationError
from mmfront.processing.updates import PromptIndex, PromptTarget, TokenizerLike, seq_to_text, seq_to_token_ids


class PromptTargetMatch(NamedTuple):
    """``[start_idx, end_idx)`` of a match; empty for index targets."""

    start_idx: int
    end_idx: int



def first_token_match(token_ids: list[int], match_ids: list[int], start_idx: int) -> int:
    """Start of the first occurrence of ``match_ids`` at or after ``start_idx``; -1 if none."""
    n = len(match_ids)
    last = len(token_ids) - n
    if n == 0 or start_idx > last:
        return -1
    first = match_ids[0]
    index = token_ids.index
    if n == 1:
        try:
            return index(first, start_idx, last + 1)
        except ValueError:
            return -1
    tail = match_ids[-1]
    i = start_idx
    while i <= last:
        try:
            i = index(first, i, last + 1)
        except ValueError:
            return -1
        if token_ids[i + n - 1] == tail and token_ids[i : i + n] == match_ids:
            return i
        i += 1
    return -1


def _check_start(start_idx: int) -> None:
    if start_idx < 0:
        raise ValidationError("start_idx must be non-negative", parameter="start_idx", value=start_idx)


def iter_token_matches(
    token_ids: list[int], match_ids: list[int], *, start_idx: int = 0
) -> Iterator[PromptTargetMatch]:
    """Non-overlapping occurrences of ``match_ids``, left to right, from ``start_idx``.

    An empty ``match_ids`` has no matches.
    """
    _check_start(start_idx)
    if not isinstance(token_ids, list):
        token_ids = list(token_ids)
    if not isinstance(match_ids, list):
        match_ids = list(match_ids)
    n = len(match_ids)
    i = first_token_match(token_ids, match_ids, start_idx)
    while i >= 0:
        yield PromptTargetMatch(i, i + n)
        i = first_token_match(token_ids, match_ids, i + n)


def replace_token_matches(token_ids: list[int], match_ids: list[int], new_ids: list[int]) -> list[int]:
    """Replace every non-overlapping occurrence of ``match_ids`` with ``new_ids``."""
    out: list[int] = []
    prev = 0
    for start, end in iter_token_matches(token_ids, match_ids):
        out += token_ids[prev:start]
        out += new_ids
        prev = end
    out += token_ids[prev:]
    return out


def _index_match(
    target: PromptIndex, tokenizer: TokenizerLike | None, prompt: list[int] | str, start_idx: int
) -> PromptTargetMatch | None:
    # As in vLLM, a position before ``start_idx`` still matches (``start()`` always answers 0);
    # the splice then puts the content at the current output position. One outside the prompt
    # is not a match.
    idx = target.get_match_index(tokenizer, prompt, start_idx)
    if idx is None or not 0 <= idx <= len(prompt):
        return None
    return PromptTargetMatch(idx, idx)


def find_token_target(
    prompt_ids: list[int], target: PromptTarget, tokenizer: TokenizerLike | None, start_idx: int
) -> PromptTargetMatch | None:
    if isinstance(target, PromptIndex):
        return _index_match(target, tokenizer, prompt_ids, start_idx)
    ids = seq_to_token_ids(tokenizer, target)
    i = first_token_match(prompt_ids, ids, start_idx)
    return None if i < 0 else PromptTargetMatch(i, i + len(ids))


def find_text_target(
    prompt: str, target: PromptTarget, tokenizer: TokenizerLike | None, start_idx: int
) -> PromptTargetMatch | None:
    if isinstance(target, PromptIndex):
        return _index_match(target, tokenizer, prompt, start_idx)
    text = seq_to_text(tokenizer, target)
    i = prompt.find(text, start_idx) if text else -1
    return None if i < 0 else PromptTargetMatch(i, i + len(text))


def iter_target_token_matches(
    prompt_ids: list[int], target: PromptTarget, tokenizer: TokenizerLike | None = None, *, start_idx: int = 0
) -> Iterator[PromptTargetMatch]:
    """Matches of a resolved target in token space (an index target matches at most once)."""
    _check_start(start_idx)
    if isinstance(target, PromptIndex):
        match = _index_match(target, tokenizer, prompt_ids, start_idx)
        if match is not None:
            yield match
        return
    yield from iter_token_matches(prompt_ids, seq_to_token_ids(tokenizer, target), start_idx=start_idx)


def iter_target_text_matches(
    prompt: str, target: PromptTarget, tokenizer: TokenizerLike | None = None, *, start_idx: int = 0
) -> Iterator[PromptTargetMatch]:
    """Matches of a resolved target in text space: ``str.find`` on the decoded target."""
    _check_start(start_idx)
    match = find_text_target(prompt, target, tokenizer, start_idx)
    while match is not None:
        yield match
        if match.start_idx == match.end_idx:  # an index target matches once
            return
        match = find_text_target(prompt, target, tokenizer, match.end_idx)
