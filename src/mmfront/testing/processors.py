"""Reading what the offline HF processors return, and which transformers is installed.

The processors themselves are real HF classes at small sizes, each built by its model's module
(``mmfront.models.<model>.make_<model>_processor``, declared as the model's fixture kinds), so
tests exercise the exact code paths users hit without any model hub.

Offsets (``text_replacement_offsets``): Gemma3/Emu3 report them from transformers 5.15.0,
Qwen2-Audio from 5.16.0, Idefics3 and GlmAsr already in 5.14.1 (there only via ``text_kwargs``,
see :func:`offsets_kwargs`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import transformers
from packaging.version import Version
from transformers import PreTrainedTokenizerFast

__all__ = [
    "HAS_OFFSETS_API",
    "TF_VERSION",
    "expand_text",
    "offsets_kwargs",
    "spans_in_tokens",
    "token_runs",
]

TF_VERSION = Version(transformers.__version__)
#: transformers >= 5.15: Gemma3/Emu3 (and Qwen2-Audio from 5.16) go through the replacement hooks,
#: and ``return_text_replacement_offsets`` is a declared kwarg (flat kwarg works)
HAS_OFFSETS_API = Version("5.15.0") <= TF_VERSION

# --------------------------------------------------------------------------------------
# Reading processor outputs
# --------------------------------------------------------------------------------------


def offsets_kwargs() -> dict[str, Any]:
    """How to ask for ``text_replacement_offsets`` on this transformers version.

    5.15+ (5.23 checked): a top-level processor kwarg (``ProcessingKwargs.return_text_replacement_offsets``;
    the old ``text_kwargs`` spelling still works until 5.29). 5.14.1: it is *not* a declared
    TextKwargs key, so the flat kwarg is dropped with a warning; only
    ``text_kwargs={"return_text_replacement_offsets": True}`` reaches ``__call__`` -- and only
    processors that use ProcessorMixin.__call__ (or Idefics3) honour it.
    """
    if HAS_OFFSETS_API:
        return {"return_text_replacement_offsets": True}
    return {"text_kwargs": {"return_text_replacement_offsets": True}}


def expand_text(text: str, offsets_for_sample: list[dict[str, Any]]) -> str:
    """Rebuild the expanded prompt from the unexpanded one and its reported offsets
    (``span`` indexes ``text``; replacements are applied left to right)."""
    parts: list[str] = []
    last = 0
    for entry in offsets_for_sample:
        start, end = entry["span"]
        parts += [text[last:start], entry["replacement"]]
        last = end
    parts.append(text[last:])
    return "".join(parts)


def token_runs(mask: Any) -> list[tuple[int, int]]:
    """``[start, end)`` runs of non-zero entries (for mm_token_type_ids / token_type_ids /
    ``input_ids == token_id``) -- the transformers<5.15 way of locating placeholders."""
    m = np.asarray(mask).astype(bool).astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], m, [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def spans_in_tokens(
    tokenizer: PreTrainedTokenizerFast, expanded_text: str, offsets_for_sample: list[dict[str, Any]], **tok_kwargs: Any
) -> list[tuple[str, int, int]]:
    """Map each reported ``new_span`` (char offsets in the expanded text) to a token range
    ``[start, end)`` with the fast tokenizer's ``char_to_token`` (what Idefics3 does internally).
    The returned BatchFeature has no ``char_to_token``, so the expanded text is re-tokenized."""
    enc = tokenizer(expanded_text, **tok_kwargs)
    out: list[tuple[str, int, int]] = []
    for entry in offsets_for_sample:
        start, end = entry["new_span"]
        out.append((entry["type"], enc.char_to_token(start), enc.char_to_token(end - 1) + 1))
    return out
