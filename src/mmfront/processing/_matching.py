"""Matching prompt-update targets, planning which item goes where, and splicing the contents in.

Semantics are vLLM 0.33's (``apply_prompt_updates`` / ``find_mm_placeholders``), so the same
updates give the same token ids and placeholders. What differs is cost and failure:

* Matching fast-forwards with ``list.index`` (C speed) and checks a candidate's last token
  before comparing the whole slice; the output is built by slicing, never token by token.
* A queue's next match is remembered while it stays ahead of the scan, so N items sharing a
  target cost one pass over the prompt, not N.
* The text-level fallback (decode, ``str.find``, re-encode) only runs when the token path
  left items unplaced, and when the prompt simply has too few placeholders the caller gets a
  :class:`~mmfront.errors.PromptUpdateError` naming the modality and the expected and found
  counts (vLLM raises a bare ``AssertionError`` there).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from itertools import islice, pairwise
from typing import NamedTuple

from mmfront.errors import PromptUpdateError, ValidationError
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
    seq_to_token_ids,
)


class PromptTargetMatch(NamedTuple):
    """``[start_idx, end_idx)`` of a match; empty for index targets."""

    start_idx: int
    end_idx: int


# --- token and text matching ------------------------------------------------------------------


def _first_token_match(token_ids: list[int], match_ids: list[int], start_idx: int) -> int:
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
    i = _first_token_match(token_ids, match_ids, start_idx)
    while i >= 0:
        yield PromptTargetMatch(i, i + n)
        i = _first_token_match(token_ids, match_ids, i + n)


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


def _find_token_target(
    prompt_ids: list[int], target: PromptTarget, tokenizer: TokenizerLike | None, start_idx: int
) -> PromptTargetMatch | None:
    if isinstance(target, PromptIndex):
        return _index_match(target, tokenizer, prompt_ids, start_idx)
    ids = seq_to_token_ids(tokenizer, target)
    i = _first_token_match(prompt_ids, ids, start_idx)
    return None if i < 0 else PromptTargetMatch(i, i + len(ids))


def _find_text_target(
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
    match = _find_text_target(prompt, target, tokenizer, start_idx)
    while match is not None:
        yield match
        if match.start_idx == match.end_idx:  # an index target matches once
            return
        match = _find_text_target(prompt, target, tokenizer, match.end_idx)


# --- planning ---------------------------------------------------------------------------------

_FindFirst = Callable[[ResolvedPromptUpdate, int], "PromptTargetMatch | None"]


class _Planned(NamedTuple):
    match: PromptTargetMatch
    priority: int
    modality: str
    item_pos: int
    alt_idx: int
    update: ResolvedPromptUpdate


class _Queue:
    """Items whose alternatives have identical (mode, target) pairs, in priority order.

    Such items match at the same places, so the head's next match can be remembered across
    rounds and across pops while it stays at or after the scan position.
    """

    __slots__ = ("items", "memo", "positional")

    def __init__(self, positional: bool) -> None:
        self.items: deque[tuple[int, str, int, Sequence[ResolvedPromptUpdate]]] = deque()
        self.memo: tuple[PromptTargetMatch, int] | None = None
        self.positional = positional  # some alternative is a PromptIndex: never memoize

    @property
    def priority(self) -> int:
        return self.items[0][0]

    def head_match(
        self, find_first: _FindFirst, start_idx: int, mode: UpdateMode | None = None
    ) -> tuple[PromptTargetMatch, int] | None:
        memo = self.memo
        if mode is None and memo is not None and memo[0].start_idx >= start_idx:
            return memo
        for alt_idx, update in enumerate(self.items[0][3]):
            if mode is not None and update.mode != mode:
                continue
            match = find_first(update, start_idx)
            if match is not None:
                if mode is None and not self.positional:
                    self.memo = (match, alt_idx)
                return match, alt_idx
        return None


def _target_key(target: PromptTarget) -> object:
    if isinstance(target, PromptIndex):
        return ("index", id(target))
    if isinstance(target, str):
        return ("text", target)
    return ("ids", tuple(target))


def _build_queues(mm_prompt_updates: MultiModalPromptUpdates) -> list[_Queue]:
    # The modality is deliberately not part of the signature: image and video items with the
    # same target share one queue, so the k-th occurrence goes to the k-th item by priority.
    queues: dict[tuple, _Queue] = {}
    priority = 0
    for modality, items in mm_prompt_updates.items():
        for item_pos, alternatives in enumerate(items):
            signature = tuple((u.mode, _target_key(u.target)) for u in alternatives)
            queue = queues.get(signature)
            if queue is None:
                queue = queues[signature] = _Queue(any(isinstance(u.target, PromptIndex) for u in alternatives))
            queue.items.append((priority, modality, item_pos, alternatives))
            priority += 1
    return list(queues.values())


def _pop(queue: _Queue, match: PromptTargetMatch, alt_idx: int) -> _Planned:
    priority, modality, item_pos, alternatives = queue.items.popleft()
    return _Planned(match, priority, modality, item_pos, alt_idx, alternatives[alt_idx])


def _plan(
    mm_prompt_updates: MultiModalPromptUpdates, find_first: _FindFirst
) -> tuple[list[_Planned], dict[str, list[int | None]]]:
    """Decide, without touching the prompt, where each item's update applies.

    Each round: the head of every queue finds its first match at or after the scan position;
    the highest-priority matching head fixes the round's mode. INSERTs and empty REPLACEs
    (index targets) take their whole queue at that one match; otherwise the earliest non-empty
    REPLACE (by match, then priority) takes one item. The scan then moves past the last match.
    """
    queues = _build_queues(mm_prompt_updates)
    result: dict[str, list[int | None]] = {m: [None] * len(items) for m, items in mm_prompt_updates.items()}
    planned: list[_Planned] = []
    prev_end = 0
    while queues:
        firsts = []
        for queue in queues:
            hit = queue.head_match(find_first, prev_end)
            if hit is not None:
                firsts.append((queue, hit[0], hit[1]))
        if not firsts:
            break
        lead = firsts[0] if len(firsts) == 1 else min(firsts, key=lambda f: f[0].priority)
        mode = lead[0].items[0][3][lead[2]].mode

        round_planned: list[_Planned] = []
        best: tuple[_Queue, PromptTargetMatch, int] | None = None
        for queue, match, alt_idx in firsts:
            if queue.items[0][3][alt_idx].mode != mode:
                hit = queue.head_match(find_first, prev_end, mode)
                if hit is None:
                    continue
                match, alt_idx = hit
            if mode is UpdateMode.REPLACE and match.start_idx != match.end_idx:
                if best is None or (match, queue.priority) < (best[1], best[0].priority):
                    best = (queue, match, alt_idx)
            else:
                while queue.items:
                    round_planned.append(_pop(queue, match, alt_idx))
        if best is not None:
            round_planned.append(_pop(*best))
        if len(round_planned) > 1:
            round_planned.sort(key=lambda p: (p.match, p.priority))
        for p in round_planned:
            result[p.modality][p.item_pos] = p.alt_idx
        prev_end = max(prev_end, round_planned[-1].match.end_idx)  # never rescan consumed tokens
        planned += round_planned
        queues = [q for q in queues if q.items]
    return planned, result


def _token_finder(prompt_ids: list[int], tokenizer: TokenizerLike | None) -> _FindFirst:
    def find_first(update: ResolvedPromptUpdate, start_idx: int) -> PromptTargetMatch | None:
        return _find_token_target(prompt_ids, update.target, tokenizer, start_idx)

    return find_first


def _text_finder(prompt: str, tokenizer: TokenizerLike | None) -> _FindFirst:
    def find_first(update: ResolvedPromptUpdate, start_idx: int) -> PromptTargetMatch | None:
        return _find_text_target(prompt, update.target, tokenizer, start_idx)

    return find_first


# --- applying ---------------------------------------------------------------------------------


def _placeholder(
    modality: str, item_idx: int, start_idx: int, update: ResolvedPromptUpdate, ids: list[int]
) -> PlaceholderFeaturesInfo:
    return PlaceholderFeaturesInfo(
        modality=modality, item_idx=item_idx, start_idx=start_idx, tokens=ids, is_embed=update.content.embed_mask(ids)
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
    planned, result = _plan(mm_prompt_updates, _token_finder(prompt_ids, tokenizer))
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
            found.append(_placeholder(p.modality, p.item_pos, len(out), p.update, ids))
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
            found.append(_placeholder(modality, item_pos, len(out), update, ids))
            out += ids
        pos = end
    out += prompt_ids[pos:]
    return out, ({modality: found} if found else {}), {modality: [0] * len(items)}


def apply_text_matches(
    prompt: str, mm_prompt_updates: MultiModalPromptUpdates, tokenizer: TokenizerLike | None = None
) -> tuple[str, dict[str, list[int | None]]]:
    """The text path: plan on ``prompt`` with ``str.find`` and splice decoded contents in."""
    planned, result = _plan(mm_prompt_updates, _text_finder(prompt, tokenizer))
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


# --- finding placeholders ---------------------------------------------------------------------


class _Cursor:
    """The next unfound item of one modality and where its content next occurs."""

    __slots__ = ("alternatives", "hit", "item_pos", "items", "modality")

    def __init__(self, modality: str, items: Sequence[Sequence[ResolvedPromptUpdate]]) -> None:
        self.modality = modality
        self.items = items
        self.item_pos = -1
        self.alternatives: list[tuple[ResolvedPromptUpdate, list[int]]] = []
        self.hit: tuple[int, int] | None = None  # (position, alternative) of the next occurrence

    def advance(self, tokenizer: TokenizerLike | None) -> bool:
        """Move to the next item with a non-empty content; False when none is left."""
        self.hit = None
        while True:
            self.item_pos += 1
            if self.item_pos >= len(self.items):
                return False
            alternatives = [(u, u.content.token_ids(tokenizer)) for u in self.items[self.item_pos]]
            self.alternatives = [(u, ids) for u, ids in alternatives if ids]
            if self.alternatives:
                return True

    def next_hit(self, prompt_ids: list[int], start_idx: int) -> tuple[int, int] | None:
        """(position, alternative) of the first occurrence at or after ``start_idx``.

        A remembered hit stays valid while it is at or after ``start_idx`` (the scan only moves
        forward), and "no occurrence" stays valid for good.
        """
        hit = self.hit
        if hit is None or 0 <= hit[0] < start_idx:
            hit = (-1, -1)
            for alt_idx, (_, ids) in enumerate(self.alternatives):
                pos = _first_token_match(prompt_ids, ids, start_idx)
                if pos >= 0 and (hit[0] < 0 or pos < hit[0]):
                    hit = (pos, alt_idx)
            self.hit = hit
        return None if hit[0] < 0 else hit


def find_mm_placeholders(
    prompt_ids: list[int], mm_prompt_updates: MultiModalPromptUpdates, tokenizer: TokenizerLike | None = None
) -> dict[str, list[PlaceholderFeaturesInfo]]:
    """Locate each item's content in an already expanded prompt.

    Scans left to right; at each position the next unfound item of every modality is tried in
    modality order (then alternative order), the first whose whole content matches wins and
    the scan resumes after it. An item that never occurs stops its modality (later items of it
    are not looked for). Items with empty contents get no placeholder. Only modalities with at
    least one placeholder appear in the result.
    """
    if not isinstance(prompt_ids, list):
        prompt_ids = list(prompt_ids)
    cursors = []
    for modality, items in mm_prompt_updates.items():
        cursor = _Cursor(modality, items)
        if cursor.advance(tokenizer):
            cursors.append(cursor)
    placeholders: dict[str, list[PlaceholderFeaturesInfo]] = {}
    i = 0
    while cursors:
        winner: _Cursor | None = None
        win_pos = win_alt = -1
        for cursor in cursors:
            hit = cursor.next_hit(prompt_ids, i)
            if hit is not None and (winner is None or hit[0] < win_pos):
                winner, (win_pos, win_alt) = cursor, hit
        if winner is None:
            break
        update, ids = winner.alternatives[win_alt]
        placeholders.setdefault(winner.modality, []).append(
            _placeholder(winner.modality, winner.item_pos, win_pos, update, ids)
        )
        i = win_pos + len(ids)
        if not winner.advance(tokenizer):
            cursors.remove(winner)
    return placeholders
