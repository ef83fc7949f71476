"""The item executor interface: where a processor's cache misses are HF-processed.

A processor hands its executor a plain job (the items to process and the HF kwargs, nothing
model-specific) and gets their kwargs items back. Hashing, the P0 cache reads, the splice and the
cache commit stay with the processor, in request order, so the P0/P1 mirror stays exact whatever
runs the job: in place (:class:`~mmfront.processing.executors.InPlaceExecutor`), local processes
or Ray actors (the lanes). Whichever runs it, the items are byte-identical.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from mmfront.config import MultiModalConfig
from mmfront.inputs import MultiModalKwargsItems
from mmfront.parse import MultiModalDataItems


@dataclass(frozen=True)
class ItemJob:
    """Items to HF-process in one call, with the HF kwargs resolved for that call."""

    items: MultiModalDataItems
    hf_kwargs: Mapping[str, Any]

    def per_item(self) -> list[ItemJob]:
        """One job per item, in modality order then item order."""
        return [ItemJob(self.items.subset({modality: [index]}), self.hf_kwargs)
                for modality, items in self.items.items() for index in range(items.get_count())]


class ProcessorOrigin(Protocol):
    """Where a processor's HF processor came from: what a lane needs to build the same one."""

    @property
    def model_dir(self) -> str | Path | None: ...

    @property
    def model_id(self) -> str: ...

    @property
    def config(self) -> MultiModalConfig: ...

    @property
    def built_by(self) -> str | None:
        """The function that built the processor from ``model_dir``, as ``module:name``
        (``None``: the lane builds it from its classes)."""


class ItemProcessor(Protocol):
    """What an executor needs of a processor (``BaseMultiModalProcessor`` is one)."""

    @property
    def items_are_independent(self) -> bool:
        """Whether an item's outputs do not depend on the other items of its call: the items may
        then be processed one call each, in parallel, and merged."""

    @property
    def reads_pixels(self) -> bool:
        """Whether the processor reads a decoded JPEG's pixels rather than its PIL image, so its
        lazily loaded images are decoded straight into arrays."""

    @property
    def info(self) -> ProcessorOrigin: ...

    def process_hf_items(self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any]) -> MultiModalKwargsItems:
        """The HF call over ``mm_items`` and its split into per-item kwargs."""

    def warm_up(self, counts: Mapping[str, int]) -> None:
        """HF-process ``counts`` of the largest dummy items, dropping the outputs."""


class ItemExecutor(ABC):
    """Runs item jobs; thread-safe, since many requests are prepared at once.

    Subclass it to process misses elsewhere (another pool, a remote service); an executor is
    handed to :meth:`BaseMultiModalProcessor.prepare <mmfront.processing.BaseMultiModalProcessor.prepare>`
    by its owner (``InputPreprocessor`` builds one from ``MultiModalConfig.mm_processing_lanes``).
    """

    @abstractmethod
    def run(self, job: ItemJob, processor: ItemProcessor) -> MultiModalKwargsItems:
        """``job``'s kwargs items, one per item in modality order, exactly as
        ``processor.process_hf_items`` gives them in place; raises what processing them raises."""

    def warm_up(self, counts: Mapping[str, int], processor: ItemProcessor) -> None:
        """Warm the processor that runs this executor's jobs with ``counts`` of the largest dummy
        items (``processor.warm_up`` where the jobs run): at start-up, so the first request does not
        pay for it. In place by default; an executor whose jobs run elsewhere warms them there."""
        processor.warm_up(counts)

    @abstractmethod
    def close(self) -> None:
        """Release what the executor holds (idempotent); jobs run after it may fail or run in place."""

    def __enter__(self) -> ItemExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["ItemExecutor", "ItemJob", "ItemProcessor", "ProcessorOrigin"]
