"""In-place processing: a job runs in the calling thread, its items spread over the decode pool."""

from __future__ import annotations

from mmfront.inputs import MultiModalKwargsItems
from mmfront.parse import MediaWithBytes
from mmfront.processing.executors.base import ItemExecutor, ItemJob, ItemProcessor
from mmfront.processing.threads import decode_all, map_items


class InPlaceExecutor(ItemExecutor):
    """Processes a job in the calling process (the default, ``mm_processing_lanes=0``).

    Lazily loaded images are decoded first, in parallel on the decode pool. A processor whose
    items are independent (:attr:`~mmfront.processing.BaseMultiModalProcessor.items_are_independent`)
    gets one call per item, in parallel on that pool, merged as one call would have split them:
    each item's tensors then own their storage, where slices of one batch would each be copied
    out of it.
    """

    def run(self, job: ItemJob, processor: ItemProcessor) -> MultiModalKwargsItems:
        lazy = [raw for items in job.items.values() for raw in items.get_all_items_for_hash()
                if isinstance(raw, MediaWithBytes) and not raw.is_decoded]
        if lazy:
            decode_all(lazy, pixels=processor.reads_pixels)
        parts = job.per_item() if processor.items_are_independent else [job]
        if len(parts) == 1:
            return processor.process_hf_items(job.items, job.hf_kwargs)
        return MultiModalKwargsItems.merge(map_items(lambda part: processor.process_hf_items(part.items, part.hf_kwargs),
                                                     parts))

    def close(self) -> None:
        """Nothing to release: the decode pool is the process's."""


__all__ = ["InPlaceExecutor"]
