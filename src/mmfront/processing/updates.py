"""Prompt updates: how a model's placeholder expands for each multimodal item.

A model describes its expansion as :class:`PromptReplacement` / :class:`PromptInsertion` objects
(vLLM 0.33's names and semantics). Before matching, every update is *resolved* once per item
(:meth:`PromptUpdate.resolve`), so per-item callables run exactly once and the result, a frozen
:class:`ResolvedPromptUpdate`, can be cached next to the item's processed data and reused on a
cache hit without touching tensors (:meth:`ResolvedPromptUpdate.with_item_idx`).

Text targets and contents are encoded through a per-tokenizer memo (:func:`cached_encode`), so
the constant strings models use (``"<image>"``, Gemma3's image sequence) are tokenized once per
process, not once per request.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Generic, Protocol, TypeAlias, TypeVar

import numpy as np
import torch

from mmfront.errors import ConfigError, InputTypeError
from mmfront.inputs import PlaceholderRange


class TokenizerLike(Protocol):
    """The two tokenizer methods prompt updates need (a HF tokenizer has both)."""

    def encode(self, text: str, /, *, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: list[int], /) -> str: ...


# --- tokenizer memo ---------------------------------------------------------------------------

_MEMO_MAXSIZE = 2048
"""Entries kept per tokenizer and direction (vLLM's ``cached_encode`` keeps 2048 too)."""

_ENCODE_MEMO: weakref.WeakKeyDictionary[object, dict[str | tuple[str, bool], list[int]]] = weakref.WeakKeyDictionary()
_DECODE_MEMO: weakref.WeakKeyDictionary[object, dict[tuple[int, ...], str]] = weakref.WeakKeyDictionary()


def _memo_for(memos: weakref.WeakKeyDictionary, tokenizer: object) -> dict | None:
    """The tokenizer's memo; None for a tokenizer that cannot be weakly referenced.

    Keyed weakly on the tokenizer object itself: an ``id()`` key could be reused by a new
    tokenizer after the old one is collected and would then return the wrong ids.
    """
    try:
        memo = memos.get(tokenizer)
        if memo is None:
            memo = memos[tokenizer] = {}
        return memo
    except TypeError:
        return None


def _remember(memo: dict, key: object, value: object) -> None:
    if len(memo) >= _MEMO_MAXSIZE:
        # Starting over is O(1) amortized and atomic under the GIL; the hot constant strings
        # come straight back, and a full memo means most texts were one-offs anyway.
        memo.clear()
    memo[key] = value


def _require_tokenizer(tokenizer: TokenizerLike | None, what: str) -> TokenizerLike:
    if tokenizer is None:
        raise ConfigError(
            f"A tokenizer is needed to {what}, but none was given (skip_tokenizer_init?). "
            "Load the model's tokenizer, or give prompt update targets and contents as token ids."
        )
    return tokenizer


def cached_encode(tokenizer: TokenizerLike | None, text: str, *, add_special_tokens: bool = False) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=...)``, memoized per tokenizer: the one memo
    for constant strings (prompt update targets and contents, dummy text).

    The returned list is shared between callers: read it, never mutate it.
    """
    tok = _require_tokenizer(tokenizer, f"encode the prompt update text {text!r}")
    memo = _memo_for(_ENCODE_MEMO, tok)
    key: str | tuple[str, bool] = (text, True) if add_special_tokens else text
    if memo is not None:
        ids = memo.get(key)
        if ids is not None:
            return ids
    ids = list(tok.encode(text, add_special_tokens=add_special_tokens))
    if memo is not None:
        _remember(memo, key, ids)
    return ids


def cached_decode(tokenizer: TokenizerLike | None, token_ids: Sequence[int]) -> str:
    """``tokenizer.decode(token_ids)``, memoized per tokenizer (for constant targets/contents)."""
    tok = _require_tokenizer(tokenizer, "decode prompt update token ids for the text-level fallback")
    key = tuple(token_ids)
    memo = _memo_for(_DECODE_MEMO, tok)
    if memo is not None:
        text = memo.get(key)
        if text is not None:
            return text
    text = tok.decode(list(key))
    if memo is not None:
        _remember(memo, key, text)
    return text


# --- sequences and contents -------------------------------------------------------------------

PromptSeq: TypeAlias = str | list[int]
"""A token sequence (list of token ids) or text."""

S = TypeVar("S", str, list[int])


def seq_to_token_ids(tokenizer: TokenizerLike | None, seq: PromptSeq) -> list[int]:
    return cached_encode(tokenizer, seq) if isinstance(seq, str) else seq


def seq_to_text(tokenizer: TokenizerLike | None, seq: PromptSeq) -> str:
    return seq if isinstance(seq, str) else cached_decode(tokenizer, seq)


class UpdateMode(str, Enum):
    INSERT = "insert"
    REPLACE = "replace"


@dataclass(frozen=True)
class _SelectTokenIds:
    """``is_embed`` for :meth:`PromptUpdateDetails.select_token_id(s)`.

    A small frozen class rather than a lambda, so two details built the same way compare equal
    and show their rule in ``repr``.
    """

    embed_token_ids: tuple[int, ...]

    def __call__(self, token_ids: list[int]) -> torch.Tensor:
        # numpy builds and compares a small int array faster than torch.tensor(list) does
        ids = np.asarray(token_ids, dtype=np.int64)
        if len(self.embed_token_ids) == 1:
            return torch.from_numpy(ids == self.embed_token_ids[0])
        return torch.from_numpy(np.isin(ids, self.embed_token_ids))


@dataclass
class PromptUpdateDetails(Generic[S]):
    """An update's content plus which of its positions receive encoder embeddings.

    ``is_embed`` receives the token ids of ``full`` and returns a bool mask over them; it must be
    a pure function of those ids, because its result is memoized on this object: a cached
    update reused for later requests builds its mask once, not once per request.
    """

    full: S
    is_embed: Callable[[list[int]], torch.Tensor] | None = None
    _mask_memo: tuple[list[int], torch.Tensor] | None = field(default=None, init=False, repr=False, compare=False)

    @staticmethod
    def from_seq(seq: S) -> PromptUpdateDetails[S]:
        return PromptUpdateDetails(full=seq)

    @staticmethod
    def select_token_id(seq: S, embed_token_id: int) -> PromptUpdateDetails[S]:
        return PromptUpdateDetails(full=seq, is_embed=_SelectTokenIds((int(embed_token_id),)))

    @staticmethod
    def select_token_ids(seq: S, embed_token_ids: Sequence[int]) -> PromptUpdateDetails[S]:
        return PromptUpdateDetails(full=seq, is_embed=_SelectTokenIds(tuple(int(i) for i in embed_token_ids)))

    def token_ids(self, tokenizer: TokenizerLike | None) -> list[int]:
        return seq_to_token_ids(tokenizer, self.full)

    def embed_mask(self, token_ids: list[int]) -> torch.Tensor | None:
        """``is_embed(token_ids)``, or None when every position is an embedding.

        The mask tensor is shared by every placeholder built from this content; treat it as
        read-only (PlaceholderRange never modifies it).
        """
        if self.is_embed is None:
            return None
        memo = self._mask_memo
        if memo is not None and (memo[0] is token_ids or memo[0] == token_ids):
            return memo[1]
        mask = self.is_embed(token_ids)
        if not isinstance(mask, torch.Tensor) or mask.shape != (len(token_ids),):
            raise InputTypeError(
                f"is_embed must return a 1-D tensor with one entry per content token ({len(token_ids)}), "
                f"got {type(mask).__name__} {getattr(mask, 'shape', '')}. Fix the model's prompt update."
            )
        mask = mask.to(torch.bool)
        self._mask_memo = (token_ids, mask)
        return mask


# --- targets ----------------------------------------------------------------------------------


class GetMatchIndex(Protocol):
    def __call__(self, tokenizer: TokenizerLike | None, prompt: PromptSeq, start_idx: int = 0) -> int | None: ...


@dataclass(eq=False)
class PromptIndex:
    """A target that resolves to a position rather than a token sequence (its match is empty).

    ``get_match_index`` receives the prompt as token ids on the token path and as text on the
    text-level fallback, and must answer in the same space. Compared by identity: the planner
    groups items whose targets are the same index object.
    """

    get_match_index: GetMatchIndex


def _start_index(tokenizer: TokenizerLike | None, prompt: PromptSeq, start_idx: int = 0) -> int | None:
    return 0


def _end_index(tokenizer: TokenizerLike | None, prompt: PromptSeq, start_idx: int = 0) -> int | None:
    return len(prompt)


@dataclass(frozen=True)
class _PrefixIndex:
    prefix: PromptSeq

    def __call__(self, tokenizer: TokenizerLike | None, prompt: PromptSeq, start_idx: int = 0) -> int | None:
        if start_idx != 0:
            return None
        if isinstance(prompt, str):
            text = seq_to_text(tokenizer, self.prefix)
            return len(text) if prompt.startswith(text) else None
        ids = seq_to_token_ids(tokenizer, self.prefix)
        return len(ids) if prompt[: len(ids)] == ids else None


class PromptIndexTargets:
    """Ready-made :class:`PromptIndex` targets."""

    @staticmethod
    def start() -> PromptIndex:
        """Before the first token; matches even an empty prompt."""
        return PromptIndex(_start_index)

    @staticmethod
    def prefix(seq: PromptSeq) -> PromptIndex:
        """Right after ``seq``, only when the prompt starts with it."""
        return PromptIndex(_PrefixIndex(list(seq) if isinstance(seq, tuple) else seq))

    @staticmethod
    def end() -> PromptIndex:
        """After the last token."""
        return PromptIndex(_end_index)


PromptTarget: TypeAlias = PromptSeq | PromptIndex
"""What an update matches: a token/text sequence or a position."""

PromptUpdateTarget: TypeAlias = PromptTarget | Callable[[int], PromptTarget]
"""A target, or a function of the item index returning one."""

PromptUpdateInfo: TypeAlias = PromptSeq | PromptUpdateDetails
"""Content: a sequence, or :class:`PromptUpdateDetails` to mark which tokens are embeddings."""

PromptUpdateContent: TypeAlias = PromptUpdateInfo | Callable[[int], PromptUpdateInfo]
"""Content, or a function of the item index returning it."""


def _as_target(value: object, modality: str) -> PromptTarget:
    if isinstance(value, (str, list, PromptIndex)):
        return value
    if isinstance(value, tuple) and all(isinstance(t, int) for t in value):
        return list(value)
    raise InputTypeError(
        f"A {modality} prompt update target must be token ids (list[int]), text, or a PromptIndex; "
        f"got {type(value).__name__}. Fix the model's _get_prompt_updates."
    )


def _as_details(value: object, modality: str) -> PromptUpdateDetails:
    if isinstance(value, PromptUpdateDetails):
        return value
    if isinstance(value, (str, list)):
        return PromptUpdateDetails.from_seq(value)
    if isinstance(value, tuple) and all(isinstance(t, int) for t in value):
        return PromptUpdateDetails.from_seq(list(value))
    raise InputTypeError(
        f"A {modality} prompt update content must be token ids (list[int]), text, or PromptUpdateDetails; "
        f"got {type(value).__name__}. Fix the model's _get_prompt_updates."
    )


# --- updates ----------------------------------------------------------------------------------


@dataclass
class PromptUpdate(ABC):
    """How the placeholder of one modality expands, for every item of that modality."""

    modality: str
    target: PromptUpdateTarget

    @property
    @abstractmethod
    def content(self) -> PromptUpdateContent:
        """What goes into the prompt for each item."""

    @property
    @abstractmethod
    def mode(self) -> UpdateMode:
        """Whether the content replaces the target or goes right after it."""

    def resolve(self, item_idx: int) -> ResolvedPromptUpdate:
        """Evaluate per-item callables for item ``item_idx`` (once; the result is cacheable)."""
        target = self.target
        if callable(target):
            target = target(item_idx)
        content = self.content
        if callable(content):
            content = content(item_idx)
        return ResolvedPromptUpdate(
            modality=self.modality,
            item_idx=item_idx,
            mode=self.mode,
            target=_as_target(target, self.modality),
            content=_as_details(content, self.modality),
        )


@dataclass
class PromptInsertion(PromptUpdate):
    """Insert the content right after each match of the target.

    All items of a queue land at the *first* match (e.g. N image sequences after ``<bos>``).
    """

    insertion: PromptUpdateContent = field(repr=False)

    @property
    def content(self) -> PromptUpdateContent:
        return self.insertion

    @property
    def mode(self) -> UpdateMode:
        return UpdateMode.INSERT


@dataclass
class PromptReplacement(PromptUpdate):
    """Replace matches of the target with the content; item k takes the k-th occurrence."""

    replacement: PromptUpdateContent = field(repr=False)

    @property
    def content(self) -> PromptUpdateContent:
        return self.replacement

    @property
    def mode(self) -> UpdateMode:
        return UpdateMode.REPLACE


@dataclass(frozen=True)
class ResolvedPromptUpdate:
    """One item's update with every callable evaluated."""

    modality: str
    item_idx: int
    mode: UpdateMode
    target: PromptTarget
    content: PromptUpdateDetails

    def with_item_idx(self, item_idx: int) -> ResolvedPromptUpdate:
        """The same update for another item position (a cached update reused in a new request)."""
        if item_idx == self.item_idx:
            return self
        return replace(self, item_idx=item_idx)


MultiModalPromptUpdates: TypeAlias = Mapping[str, Sequence[Sequence[ResolvedPromptUpdate]]]
"""modality -> per item -> that item's alternative updates (usually one)."""

MultiModalPromptUpdatesApplyResult: TypeAlias = Mapping[str, Sequence[int | None]]
"""modality -> per item -> index of the alternative that matched, or None if the item was not placed."""


def bind_and_group_updates(
    prompt_updates: Sequence[PromptUpdate], mm_item_counts: Mapping[str, int]
) -> dict[str, list[list[ResolvedPromptUpdate]]]:
    """Resolve every update for every item: ``{modality: [[u.resolve(i) for u in updates] ...]}``.

    Modalities follow ``mm_item_counts`` order, which is the planning priority.
    """
    by_modality: dict[str, list[PromptUpdate]] = {}
    for update in prompt_updates:
        by_modality.setdefault(update.modality, []).append(update)
    return {
        modality: [[u.resolve(i) for u in by_modality.get(modality, ())] for i in range(count)]
        for modality, count in mm_item_counts.items()
    }


# --- placeholders -----------------------------------------------------------------------------


@dataclass
class PlaceholderFeaturesInfo:
    """Where one item's content sits in the updated prompt."""

    modality: str
    item_idx: int
    start_idx: int
    tokens: list[int]
    is_embed: torch.Tensor | None

    @property
    def length(self) -> int:
        return len(self.tokens)

    def to_range(self) -> PlaceholderRange:
        return PlaceholderRange(offset=self.start_idx, length=len(self.tokens), is_embed=self.is_embed)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlaceholderFeaturesInfo):
            return NotImplemented
        if (self.modality, self.item_idx, self.start_idx, self.tokens) != (
            other.modality, other.item_idx, other.start_idx, other.tokens
        ):
            return False
        if self.is_embed is None or other.is_embed is None:
            return self.is_embed is None and other.is_embed is None
        return self.is_embed.dtype == other.is_embed.dtype and bool(torch.equal(self.is_embed, other.is_embed))

    __hash__ = None  # type: ignore[assignment]


MultiModalPromptPlaceholders: TypeAlias = Mapping[str, Sequence[PlaceholderFeaturesInfo]]
"""modality -> placeholders, in item order."""


def placeholder_spans(placeholders: Mapping[str, Sequence[PlaceholderFeaturesInfo]]) -> list[tuple[int, int]]:
    """Every placeholder's ``[start, end)`` in the updated prompt, in prompt order."""
    return sorted((p.start_idx, p.start_idx + p.length) for ps in placeholders.values() for p in ps)
