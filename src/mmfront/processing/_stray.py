"""Refusing multimodal tokens that no item owns.

Prompt updates place one item per placeholder and leave any further placeholder where it was
(vLLM's semantics), so a prompt with three ``<start_of_image>`` and two images reached the model
with a stray image token, and a typed ``<image_soft_token>`` became an embedding slot that no
image fills. After the updates, every reserved multimodal token that an item's expansion uses
must lie inside some item's placeholder range; :func:`refuse_stray_tokens` checks that with one
set intersection per stretch of prompt between ranges (C speed, no per-token Python loop).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mmfront.errors import PromptUpdateError
from mmfront.processing.updates import PlaceholderFeaturesInfo, placeholder_spans


def single_token_ids(tokenizer: Any, tokens: Iterable[str]) -> frozenset[int]:
    """Ids of those ``tokens`` that the tokenizer encodes as one token (a processor's reserved
    multimodal tokens; a multi-token string cannot be told apart from ordinary text)."""
    ids = set()
    for token in tokens:
        encoded = tokenizer.encode(token, add_special_tokens=False) if token else []
        if len(encoded) == 1:
            ids.add(int(encoded[0]))
    return frozenset(ids)


def refuse_stray_tokens(
    prompt_ids: list[int], placeholders: Mapping[str, Sequence[PlaceholderFeaturesInfo]], reserved: frozenset[int],
    tokenizer: Any,
) -> None:
    """Raise :class:`PromptUpdateError` if a ``reserved`` token that an item's expansion uses
    occurs outside every item's range (a placeholder or embedding token with no item).

    Only the gaps between ranges are scanned, once; a reserved token found there is looked up in
    the expansions (a model's wrapper tokens, such as Qwen2-Audio's ``<|audio_bos|>``, legitimately
    sit outside its ranges)."""
    gaps = _gaps(placeholder_spans(placeholders), len(prompt_ids))
    outside: set[int] = set().union(*(reserved.intersection(prompt_ids[a:b]) for a, b in gaps))
    for token in sorted(outside):
        modality = next((m for m, ps in placeholders.items() for p in ps if token in p.tokens), None)
        if modality is None:
            continue
        extra = sum(prompt_ids[a:b].count(token) for a, b in gaps)
        text = tokenizer.convert_ids_to_tokens(token)
        count = len(placeholders[modality])
        raise PromptUpdateError(
            f"The prompt holds {extra} {text!r} that no {modality} item fills ({count} {modality} item(s) were "
            f"given): remove the extra {text!r} from the prompt, or add its {modality}.",
            modality=modality, expected=count, found=count + extra,
        )


def _gaps(ranges: Sequence[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    """``[start, end)`` of the stretches of the prompt no range covers (``ranges`` sorted)."""
    out = []
    pos = 0
    for start, end in (*ranges, (length, length)):
        if start > pos:
            out.append((pos, start))
        pos = max(pos, end)
    return out
