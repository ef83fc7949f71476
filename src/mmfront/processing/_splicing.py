"""Applying prompt updates: every item's content spliced into the prompt, and where it landed.

Semantics are vLLM 0.33's ``apply_prompt_updates``, so the same updates give the same token ids
and placeholders. What differs is cost and failure:

* The output is built by slicing the prompt between the planned matches (:mod:`._planning`),
  never token by token; the most common request (one modality, one placeholder token) skips the
  planner altogether.
* The text-level fallback (decode, ``str.find``, re-encode) only runs when the token path
  left items unplaced, and when the prompt simply has too few placeholders the caller gets a
  :class:`~mmfront.errors.PromptUpdateError` naming the modality and the expected and found
  counts (vLLM raises a bare ``AssertionError`` there).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice, pairwise
from typing import NamedTuple

from mmfront.errors import PromptUpdateError
from mmfront.processing._matching import iter_token_matches
from mmfront.processing._placeholders import find_mm_placeholders, placeholder_info
from mmfront.processing._planning import plan_updates, text_finder, token_finder
from mmfront.processing.updates import (
    MultiModalPromptUpdates,
    MultiModalPromptUpdatesApplyResult,
    PlaceholderFeaturesInfo,
    PromptIndex,
    PromptTarget,
    ResolvedPromptUpdate,
    TokenizerLike,
    UpdateMode,
    cached_decode,
    seq_to_text,
)


def _in_item_order(placeholders: dict[str, list[PlaceholderFeaturesInfo]]) -> dict[str, list[PlaceholderFeaturesInfo]]:
    # Items of one modality with different targets can be placed out of order; consumers zip
    # placeholders with kwargs items by position, so restore item order.
    for found in placeholders.values():
        if any(a.item_idx > b.item_idx for a, b in pairwise(found)):
            found.sort(key=lambda p: p.item_idx)
    return placeholders


def apply_token_matches(
    prompt_ids: list[int], mm_prompt_updates: MultiModalPromptUpdates, tokenizer: TokenizerLike | None = None
) -> tuple[list[int], dict[str, list[PlaceholderFeaturesInfo]], dict[str, list[int | None]]]:
    """The token path: plan on ``prompt_ids`` and splice every placed item's content in.

    Returns the new ids, the placeholders (only modalities with a non-empty content placed;
    item order) and, per modality and item, the index of the alternative applied or None.
    Unplaced items are not an error here; :func:`apply_prompt_updates` decides what to do.
    """
    if not isinstance(prompt_ids, list):
        prompt_ids = list(prompt_ids)
    fast = _apply_same_target_replacements(prompt_ids, mm_prompt_updates, tokenizer)
    if fast is not None:
        return fast
    planned, result = plan_updates(mm_prompt_updates, token_finder(prompt_ids, tokenizer))
    out: list[int] = []
    placeholders: dict[str, list[PlaceholderFeaturesInfo]] = {}
    pos = 0
    for p in planned:
        cut = p.match.end_idx if p.update.mode is UpdateMode.INSERT else p.match.start_idx
        if cut > pos:
            out += prompt_ids[pos:cut]
        ids = p.update.content.token_ids(tokenizer)
        if ids:
            found = placeholders.get(p.modality)
            if found is None:
                found = placeholders[p.modality] = []
            found.append(placeholder_info(p.modality, p.item_pos, len(out), p.update, ids))
            out += ids
        pos = max(pos, p.match.end_idx)
    out += prompt_ids[pos:]
    return out, _in_item_order(placeholders), result


def _apply_same_target_replacements(
    prompt_ids: list[int], mm_prompt_updates: MultiModalPromptUpdates, tokenizer: TokenizerLike | None
) -> tuple[list[int], dict[str, list[PlaceholderFeaturesInfo]], dict[str, list[int | None]]] | None:
    """The common request in one pass: one modality whose items each have a single REPLACE of
    the same token target (every image model with a placeholder token). The planner gives item
    ``k`` the ``k``-th non-overlapping occurrence, so the queues and rounds can be skipped; any
    other shape, or too few occurrences, returns None and takes the general path."""
    if len(mm_prompt_updates) != 1:
        return None
    ((modality, items),) = mm_prompt_updates.items()
    target: list[int] | None = None
    for alternatives in items:
        if len(alternatives) != 1:
            return None
        update = alternatives[0]
        if update.mode is not UpdateMode.REPLACE or type(update.target) is not list or not update.target:
            return None
        if target is None:
            target = update.target
        elif update.target != target:
            return None
    if target is None:
        return None
    matches = list(islice(iter_token_matches(prompt_ids, target), len(items)))
    if len(matches) < len(items):
        return None
    out: list[int] = []
    found: list[PlaceholderFeaturesInfo] = []
    pos = 0
    for item_pos, ((start, end), (update,)) in enumerate(zip(matches, items)):
        out += prompt_ids[pos:start]
        ids = update.content.token_ids(tokenizer)
        if ids:
            found.append(placeholder_info(modality, item_pos, len(out), update, ids))
            out += ids
        pos = end
    out += prompt_ids[pos:]
    return out, ({modality: found} if found else {}), {modality: [0] * len(items)}


def apply_text_matches(
    prompt: str, mm_prompt_updates: MultiModalPromptUpdates, tokenizer: TokenizerLike | None = None
) -> tuple[str, dict[str, list[int | None]]]:
    """The text path: plan on ``prompt`` with ``str.find`` and splice decoded contents in."""
    planned, result = plan_updates(mm_prompt_updates, text_finder(prompt, tokenizer))
    pieces: list[str] = []
    pos = 0
    for p in planned:
        cut = p.match.end_idx if p.update.mode is UpdateMode.INSERT else p.match.start_idx
        if cut > pos:
            pieces.append(prompt[pos:cut])
        pieces.append(seq_to_text(tokenizer, p.update.content.full))
        pos = max(pos, p.match.end_idx)
    pieces.append(prompt[pos:])
    return "".join(pieces), result


class _Unplaced(NamedTuple):
    modality: str
    expected: int
    found: int
    alternatives: Sequence[ResolvedPromptUpdate]


def _first_unplaced(
    mm_prompt_updates: MultiModalPromptUpdates, results: Sequence[MultiModalPromptUpdatesApplyResult]
) -> _Unplaced | None:
    """The first modality (in priority order) with an item no result placed; None if all placed.

    ``found`` counts the items of the result that placed the most of that modality.
    """
    for modality, items in mm_prompt_updates.items():
        counts = [sum(alt is not None for alt in r[modality]) for r in results]
        found = max(counts)
        if found < len(items):
            best = results[counts.index(found)][modality]
            item_pos = next(i for i, alt in enumerate(best) if alt is None)
            return _Unplaced(modality, len(items), found, items[item_pos])
    return None


def _describe(target: PromptTarget, tokenizer: TokenizerLike | None) -> str:
    if isinstance(target, str):
        return target
    if isinstance(target, PromptIndex) or tokenizer is None:
        return str(target)
    try:
        return cached_decode(tokenizer, target)
    except Exception:  # the message must not fail because a tokenizer cannot decode the ids
        return str(target)


def _unplaced_error(missing: _Unplaced, tokenizer: TokenizerLike | None) -> PromptUpdateError:
    modality = missing.modality
    head = f"Expected {missing.expected} placeholder(s) for {modality} items but found {missing.found} in the prompt."
    if not missing.alternatives:
        hint = (f"The model defined no prompt update for a {modality} item; this is a bug in the model's "
                "processor, not in the request.")
    else:
        update = missing.alternatives[0]
        text = _describe(update.target, tokenizer)
        if isinstance(update.target, PromptIndex):
            hint = (f"The prompt lacks the position the model's {modality} update is anchored to "
                    "(e.g. a required prefix).")
        elif update.mode is UpdateMode.INSERT:
            hint = f"The model inserts its {modality} tokens after `{text}`; make sure the prompt contains `{text}`."
        else:
            hint = f"Put one `{text}` (the model's {modality} placeholder) in the prompt for each {modality}."
    return PromptUpdateError(f"{head} {hint}", modality=modality, expected=missing.expected, found=missing.found)


def apply_prompt_updates(
    prompt_ids: list[int], mm_prompt_updates: MultiModalPromptUpdates, tokenizer: TokenizerLike | None
) -> tuple[list[int], dict[str, list[PlaceholderFeaturesInfo]]]:
    """Expand every item's placeholder in ``prompt_ids`` and report where each item landed.

    The token path handles everything whose target appears as tokens. Only if it leaves an
    item unplaced does the text-level fallback run, as in vLLM: decode the prompt, plan *all*
    items with ``str.find`` (re-planning every item keeps the priority rules consistent and
    cannot match inside content already spliced in), rebuild the text, re-encode it, and find
    the placeholders in the new ids. Items that still cannot be placed raise
    :class:`PromptUpdateError`; extra placeholders without an item stay in the prompt.
    """
    new_ids, placeholders, result = apply_token_matches(prompt_ids, mm_prompt_updates, tokenizer)
    missing = _first_unplaced(mm_prompt_updates, [result])
    if missing is None:
        return new_ids, placeholders
    if tokenizer is None:
        raise _unplaced_error(missing, tokenizer)

    text = tokenizer.decode(list(prompt_ids))
    new_text, text_result = apply_text_matches(text, mm_prompt_updates, tokenizer)
    missing = _first_unplaced(mm_prompt_updates, [result, text_result])
    if missing is not None:
        raise _unplaced_error(missing, tokenizer)
    new_ids = list(tokenizer.encode(new_text, add_special_tokens=False))
    chosen = {
        modality: [[items[i][alt]] for i, alt in enumerate(text_result[modality]) if alt is not None]
        for modality, items in mm_prompt_updates.items()
    }
    placeholders = find_mm_placeholders(new_ids, chosen, tokenizer)
    for modality, items in chosen.items():
        expected = sum(1 for alts in items if alts[0].content.token_ids(tokenizer))
        found = len(placeholders.get(modality, ()))
        if found != expected:
            raise PromptUpdateError(
                f"Expected {expected} placeholder(s) for {modality} items but found {found} after re-tokenizing "
                f"the prompt: the text around a {modality} placeholder merged with the model's {modality} tokens. "
                f"Put whitespace or a special token around each {modality} placeholder, or send token ids.",
                modality=modality, expected=expected, found=found,
            )
    return new_ids, placeholders
