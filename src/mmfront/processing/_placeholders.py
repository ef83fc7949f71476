"""Finding where each item's content lies in a prompt that is already expanded.

vLLM 0.33's ``find_mm_placeholders``: the placeholders of a prompt whose updates were applied
elsewhere (by the HF processor, or by the text fallback's re-tokenization), found by scanning for
each item's content. The scan remembers each modality's next occurrence while it stays ahead, so a
prompt with many items costs one pass per modality, not one per item.
"""

from __future__ import annotations

from collections.abc import Sequence

from mmfront.processing._matching import first_token_match
from mmfront.processing.updates import (
    MultiModalPromptUpdates,
    PlaceholderFeaturesInfo,
    ResolvedPromptUpdate,
    TokenizerLike,
)


def placeholder_info(
    modality: str, item_idx: int, start_idx: int, update: ResolvedPromptUpdate, ids: list[int]
) -> PlaceholderFeaturesInfo:
    """Where item ``item_idx``'s content ``ids`` starts, with the embedding mask its update gives."""
    return PlaceholderFeaturesInfo(
        modality=modality, item_idx=item_idx, start_idx=start_idx, tokens=ids, is_embed=update.content.embed_mask(ids)
    )


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
                pos = first_token_match(prompt_ids, ids, start_idx)
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
            placeholder_info(winner.modality, winner.item_pos, win_pos, update, ids)
        )
        i = win_pos + len(ids)
        if not winner.advance(tokenizer):
            cursors.remove(winner)
    return placeholders
