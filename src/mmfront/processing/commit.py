"""The commit step: a prepared request's items enter the P0 cache, in placeholder-offset order.

Preparing a request (hashing, cache lookups, HF processing of the misses, the prompt splice) only
*reads* the cache, so any number of requests can be prepared at once, and a request that is
prepared but never sent leaves no trace. Committing is what moves the cache: it is the step that
decides which items travel with data and which as references to what P1 already holds, so for
the mirrored caches it runs in one ordered lane, immediately before the request is handed to the
transport (see ``mmfront.engine.client``). P1 walks the same order, so both LRUs evolve alike.

:meth:`~mmfront.processing.processor.BaseMultiModalProcessor.prepare` returns
:class:`PreparedInputs`; :func:`commit` is the one way from them to committed inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from mmfront.cache.base import BaseMultiModalProcessorCache, PromptUpdates
from mmfront.errors import ValidationError
from mmfront.inputs import MultiModalInputs, MultiModalKwargsItem, MultiModalKwargsItems

Reprocess = Callable[[str, int], MultiModalKwargsItem]
"""Processes item ``index`` of a modality again from its media (a hit that was evicted since)."""


@dataclass
class FirstCommit:
    """Whether a prepared request was committed yet. One prepared prompt is committed once per
    engine request that carries it (each of its ``n`` choices, each beam-search step, a resend);
    vLLM processes a prompt once and counts its cache lookups then, so only the first commit's
    lookups are the prompt's. Commits of one prepared request run in the client's one lane."""

    done: bool = False

    def take(self) -> bool:
        """True for the first call only."""
        first, self.done = not self.done, True
        return first


@dataclass(frozen=True)
class PendingCommit:
    """What committing a prepared request needs.

    ``new_items`` holds the items processed while preparing (the lookups' misses); the others
    were cache hits then and are processed again from their media only if the cache has dropped
    them by the time of the commit."""

    order: Sequence[tuple[int, str, int]]
    """``(placeholder offset, modality, item index)``, sorted: the order P1 walks."""
    hashes: Mapping[str, Sequence[str]]
    new_items: Mapping[str, MultiModalKwargsItem]
    updates_by_hash: Mapping[str, PromptUpdates]
    reprocess: Reprocess
    first_commit: FirstCommit = field(default_factory=FirstCommit)
    """Shared by every copy of the prepared inputs (they hold this one object)."""


def _no_item(modality: str, index: int) -> MultiModalKwargsItem:
    raise ValidationError(f"The request has no {modality} item {index}.", parameter=modality)


NOTHING_TO_COMMIT = PendingCommit((), {}, {}, {}, _no_item)
"""The commit of a request without items: it leaves every cache as it is."""


class PreparedInputs(MultiModalInputs):
    """A request prepared against the P0 cache and not yet committed: its inputs, where the items
    that were cache hits have ``None`` kwargs until the commit decides whether they travel with
    data, and the commit they wait for."""

    mm_pending: PendingCommit


def pending_commit(inputs: MultiModalInputs) -> PendingCommit | None:
    """The commit ``inputs`` wait for; ``None`` once committed."""
    return cast(PreparedInputs, inputs)["mm_pending"] if "mm_pending" in inputs else None


def commit(inputs: MultiModalInputs, cache: BaseMultiModalProcessorCache | None) -> MultiModalInputs:
    """The committed copy of prepared ``inputs``: each item's kwargs is its data, or ``None`` where
    the cache (and so P1) already holds it. Inputs already committed are returned as they are, so
    committing twice is a no-op.

    Items that were hits while preparing but are gone now are processed again *before* the cache
    is touched, so a failure there leaves the cache as it was."""
    pending = pending_commit(inputs)
    if pending is None:
        return inputs
    new_items = dict(pending.new_items)
    for _, modality, index in pending.order:
        mm_hash = pending.hashes[modality][index]
        if mm_hash not in new_items and (cache is None or not cache.is_cached_item(mm_hash)):
            new_items[mm_hash] = pending.reprocess(modality, index)
    kwargs: dict[str, list[MultiModalKwargsItem | None]] = {m: [None] * len(h) for m, h in pending.hashes.items()}
    if cache is None or not pending.order:
        for _, modality, index in pending.order:
            kwargs[modality][index] = new_items[pending.hashes[modality][index]]
    else:
        _update_cache(cache, pending, new_items, kwargs)
    out = MultiModalInputs(**{k: v for k, v in inputs.items() if k != "mm_pending"})  # type: ignore[typeddict-item]
    out["mm_kwargs"] = MultiModalKwargsItems(kwargs)
    return out


def _update_cache(
    cache: BaseMultiModalProcessorCache, pending: PendingCommit, new_items: dict[str, MultiModalKwargsItem],
    kwargs: dict[str, list[MultiModalKwargsItem | None]],
) -> None:
    hashes = pending.hashes
    try:
        for _, modality, index in pending.order:
            cache.touch_sender_cache_item(hashes[modality][index])
        for _, modality, index in pending.order:
            mm_hash = hashes[modality][index]
            item = new_items.get(mm_hash)
            cached = cache.is_cached_item(mm_hash)
            if item is None and not cached:
                # Evicted by this very request's inserts (its items together outweigh the cache):
                # its data must travel with the request.
                item = new_items[mm_hash] = pending.reprocess(modality, index)
            send = (item, pending.updates_by_hash[mm_hash]) if item is not None and not cached else None
            kwargs[modality][index] = cache.get_and_update_item(send, mm_hash)[0]
    finally:
        cache.release_sender_touches()


__all__ = ["NOTHING_TO_COMMIT", "FirstCommit", "PendingCommit", "PreparedInputs", "Reprocess", "commit", "pending_commit"]
