"""Planning where each multimodal item's prompt update applies, without touching the prompt.

vLLM 0.33 plans before it splices (``_plan_prompt_updates``), and the plan here places every
item where vLLM's does (the rules are in :func:`plan_updates`). What differs is cost:

* Items whose alternatives have identical (mode, target) pairs share a queue: they match at the
  same places, so the queue's next match is remembered while it stays ahead of the scan, and N
  items sharing a target cost one pass over the prompt, not N.
* The plan is a list of (match, item, alternative), so the splice (:mod:`._splicing`) builds the
  output by slicing, never token by token, and the same planner serves the token path and the
  text fallback: only the function that finds a target's first match differs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import NamedTuple

from mmfront.processing._matching import PromptTargetMatch, find_text_target, find_token_target
from mmfront.processing.updates import (
    MultiModalPromptUpdates,
    PromptIndex,
    PromptTarget,
    ResolvedPromptUpdate,
    TokenizerLike,
    UpdateMode,
)

FindFirst = Callable[[ResolvedPromptUpdate, int], "PromptTargetMatch | None"]
"""The first match of an update's target at or after a position, in the prompt being planned."""


class Planned(NamedTuple):
    """One item placed: where its chosen alternative ``update`` applies."""

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
        self, find_first: FindFirst, start_idx: int, mode: UpdateMode | None = None
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


def _pop(queue: _Queue, match: PromptTargetMatch, alt_idx: int) -> Planned:
    priority, modality, item_pos, alternatives = queue.items.popleft()
    return Planned(match, priority, modality, item_pos, alt_idx, alternatives[alt_idx])


def plan_updates(
    mm_prompt_updates: MultiModalPromptUpdates, find_first: FindFirst
) -> tuple[list[Planned], dict[str, list[int | None]]]:
    """Decide, without touching the prompt, where each item's update applies.

    Each round: the head of every queue finds its first match at or after the scan position;
    the highest-priority matching head fixes the round's mode. INSERTs and empty REPLACEs
    (index targets) take their whole queue at that one match; otherwise the earliest non-empty
    REPLACE (by match, then priority) takes one item. The scan then moves past the last match.
    """
    queues = _build_queues(mm_prompt_updates)
    result: dict[str, list[int | None]] = {m: [None] * len(items) for m, items in mm_prompt_updates.items()}
    planned: list[Planned] = []
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

        round_planned: list[Planned] = []
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



def token_finder(prompt_ids: list[int], tokenizer: TokenizerLike | None) -> FindFirst:
    def find_first(update: ResolvedPromptUpdate, start_idx: int) -> PromptTargetMatch | None:
        return find_token_target(prompt_ids, update.target, tokenizer, start_idx)

    return find_first


def text_finder(prompt: str, tokenizer: TokenizerLike | None) -> FindFirst:
    def find_first(update: ResolvedPromptUpdate, start_idx: int) -> PromptTargetMatch | None:
        return find_text_target(prompt, update.target, tokenizer, start_idx)

    return find_first
