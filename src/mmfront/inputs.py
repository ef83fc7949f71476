"""The data every stage passes along: placeholders, field layouts, per-item kwargs, features.

Names and semantics follow vLLM 0.33 (``vllm.multimodal.inputs``) so code written against vLLM
reads the same. Two deliberate differences, both about memory:

* A :class:`MultiModalKwargsItem` knows its size in bytes from the moment it is built (the sum of
  its tensors' ``nbytes``), so caches never walk an item to size it.
* When one HF call produced several items, each flat/batched element is copied out of the batch
  tensor (see :meth:`MultiModalKwargsItems.from_hf_inputs`), so a cached item owns exactly the
  memory it is charged for instead of pinning the whole batch.
"""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from collections import UserDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import accumulate, pairwise
from typing import Any, Literal, TypedDict, TypeGuard, Union

import torch

from mmfront.errors import FieldConfigError, ModalityNotFoundError

NestedTensors = Union[  # noqa: UP007 (a string forward reference cannot take part in `|`)
    list["NestedTensors"], list[torch.Tensor], torch.Tensor, tuple[torch.Tensor, ...], int, float]
"""A tensor, or a (possibly nested) list/tuple of tensors; scalars occur in practice."""

BatchedTensorInputs = dict[str, NestedTensors]
"""Keyword arguments for a model's multimodal forward, batched over items."""


# --- placeholders -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PlaceholderRange:
    """Where one multimodal item sits in the expanded prompt.

    ``is_embed`` is a bool mask over ``[offset, offset + length)``; ``None`` means every position
    receives an encoder embedding. Structure tokens (``<start_of_image>``, newlines, tile markers)
    stay inside the range with ``False`` so prefix caching keys the whole span.
    """

    offset: int
    length: int
    is_embed: torch.Tensor | None = None

    @cached_property
    def embeds_cumsum(self) -> list[int]:
        if self.is_embed is None:
            return list(range(1, self.length + 1))
        return self.is_embed.cumsum(dim=0).tolist()

    def get_num_embeds(self) -> int:
        if self.is_embed is None:
            return self.length
        cumsum = self.embeds_cumsum
        return int(cumsum[-1]) if cumsum else 0

    def get_embeds_indices_in_range(self, start_idx: int, end_idx: int) -> tuple[int, int]:
        """Map placeholder-relative positions ``[start_idx, end_idx)`` to encoder-output rows."""
        if self.is_embed is None:
            return start_idx, end_idx
        cumsum = self.embeds_cumsum
        start = int(cumsum[start_idx - 1]) if start_idx > 0 else 0
        end = int(cumsum[end_idx - 1]) if end_idx > 0 else 0
        return start, end

    def extract_embeds_range(self) -> list[tuple[int, int]]:
        """Inclusive ``(start, end)`` prompt indices of each contiguous run of embeddings."""
        if self.is_embed is None:
            return [(self.offset, self.offset + self.length - 1)]
        mask = self.is_embed.to(torch.int8)
        zero = mask.new_zeros(1)
        starts = torch.nonzero(torch.diff(mask, prepend=zero) == 1).flatten()
        ends = torch.nonzero(torch.diff(mask, append=zero) == -1).flatten()
        ranges = torch.stack((starts, ends), dim=1) + self.offset
        return [(int(a), int(b)) for a, b in ranges.tolist()]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PlaceholderRange):
            return NotImplemented
        if (self.offset, self.length) != (other.offset, other.length):
            return False
        if self.is_embed is None or other.is_embed is None:
            return self.is_embed is None and other.is_embed is None
        return self.is_embed.dtype == other.is_embed.dtype and bool(torch.equal(self.is_embed, other.is_embed))

    __hash__ = None  # type: ignore[assignment]


# --- fields -----------------------------------------------------------------------------------


def nested_tensors_equal(a: NestedTensors, b: NestedTensors) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(b, torch.Tensor):
        return False
    if isinstance(a, (list, tuple)):
        return (
            isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(nested_tensors_equal(x, y) for x, y in zip(a, b))
        )
    return bool(a == b)


def nested_tensors_nbytes(data: NestedTensors) -> int:
    """Bytes an item's data occupies: tensor ``nbytes``; other leaves ``sys.getsizeof`` (as vLLM)."""
    if isinstance(data, torch.Tensor):
        return data.nbytes
    if isinstance(data, (list, tuple)):
        return sum(nested_tensors_nbytes(x) for x in data)
    return sys.getsizeof(data)


@dataclass
class MultiModalFieldElem:
    """One key's data for one item, plus how to batch it with other items' data."""

    data: NestedTensors
    field: BaseMultiModalField

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiModalFieldElem):
            return NotImplemented
        return type(self.field) is type(other.field) and nested_tensors_equal(self.data, other.data)

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, kw_only=True)
class BaseMultiModalField(ABC):
    """How one HF output key splits into items and batches back together."""

    keep_on_cpu: bool = False

    @abstractmethod
    def build_elems(self, modality: str, key: str, data: NestedTensors) -> Sequence[MultiModalFieldElem]:
        """Split the HF output ``data`` of ``key`` into one element per item."""

    @abstractmethod
    def _reduce_data(self, batch: list[NestedTensors], *, pin_memory: bool) -> NestedTensors:
        """Batch the per-item data back into what the model expects."""

    def reduce_data(
        self, elems: Sequence[MultiModalFieldElem], *, device: torch.device | str | None = None,
        pin_memory: bool = False,
    ) -> NestedTensors:
        field_types = {type(e.field) for e in elems}
        if len(field_types) > 1:
            raise FieldConfigError(f"Cannot batch elements of different field types: {sorted(t.__name__ for t in field_types)}")
        if self.keep_on_cpu:
            device, pin_memory = "cpu", False
        batch = [e.data for e in elems]
        out = self._reduce_data(batch, pin_memory=pin_memory)
        if device is not None:
            out = _nested_to(out, device)
        return out


def _nested_to(data: NestedTensors, device: torch.device | str) -> NestedTensors:
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=True)
    if isinstance(data, list):
        return [_nested_to(x, device) for x in data]
    if isinstance(data, tuple):
        return tuple(_nested_to(x, device) for x in data)  # type: ignore[misc]
    return data


def _all_tensors(batch: Sequence[object]) -> bool:
    return len(batch) > 0 and all(isinstance(x, torch.Tensor) for x in batch)


@dataclass(frozen=True, kw_only=True)
class MultiModalBatchedField(BaseMultiModalField):
    """Item ``i`` is ``data[i]``: one row along dim 0, or one list element."""

    def build_elems(self, modality: str, key: str, data: NestedTensors) -> Sequence[MultiModalFieldElem]:
        if not isinstance(data, (torch.Tensor, list, tuple)):
            raise FieldConfigError(f"Batched field {key!r} of {modality!r} needs a tensor or a list, got {type(data).__name__}")
        return [MultiModalFieldElem(item, self) for item in data]

    def _reduce_data(self, batch: list[NestedTensors], *, pin_memory: bool) -> NestedTensors:
        if _all_tensors(batch):
            tensors: list[torch.Tensor] = batch  # type: ignore[assignment]
            if len(tensors) == 1:
                return tensors[0].unsqueeze(0).contiguous()
            first = tensors[0].shape
            if all(t.shape == first for t in tensors):
                out = torch.empty((len(tensors), *first), dtype=tensors[0].dtype, device=tensors[0].device,
                                  pin_memory=pin_memory)
                return torch.stack(tensors, out=out)
        return batch


@dataclass(frozen=True, kw_only=True)
class MultiModalFlatField(BaseMultiModalField):
    """Item ``i`` is ``data[slices[i]]``; batching concatenates along ``dim``.

    ``slices`` holds plain slices (dim 0) or tuples of slices (any dim, tensors only)."""

    slices: Sequence[slice] | Sequence[tuple[slice, ...]]
    dim: int = 0

    def build_elems(self, modality: str, key: str, data: NestedTensors) -> Sequence[MultiModalFieldElem]:
        if not all(isinstance(s, slice) for s in self.slices) and not isinstance(data, torch.Tensor):
            raise FieldConfigError(f"Flat field {key!r} of {modality!r} with multi-dimensional slices needs a tensor")
        elems = []
        for s in self.slices:
            own = MultiModalFlatField(slices=[s], dim=self.dim, keep_on_cpu=self.keep_on_cpu)  # type: ignore[arg-type]
            elems.append(MultiModalFieldElem(data[s], own))  # type: ignore[index]
        return elems

    def _reduce_data(self, batch: list[NestedTensors], *, pin_memory: bool) -> NestedTensors:
        if _all_tensors(batch):
            tensors: list[torch.Tensor] = batch  # type: ignore[assignment]
            if len(tensors) == 1:
                return tensors[0].contiguous()
            ndim = tensors[0].ndim
            dim = self.dim if self.dim >= 0 else self.dim + ndim
            first = tensors[0].shape
            dtype, device = tensors[0].dtype, tensors[0].device
            if all(t.shape[:dim] == first[:dim] and t.shape[dim + 1:] == first[dim + 1:] for t in tensors):
                shape = (*first[:dim], sum(t.shape[dim] for t in tensors), *first[dim + 1:])
                out = torch.empty(shape, dtype=dtype, device=device, pin_memory=pin_memory)
                return torch.cat(tensors, dim=dim, out=out)
            # The other dims differ (e.g. differently sized images): pad each piece with zeros to
            # the per-dimension maximum, then place them one after another along `dim`.
            maxima = [max(t.shape[d] for t in tensors) for d in range(ndim)]
            maxima[dim] = sum(t.shape[dim] for t in tensors)
            out = torch.zeros(maxima, dtype=dtype, device=device, pin_memory=pin_memory)
            start = 0
            for t in tensors:
                index = tuple(
                    slice(start, start + t.shape[d]) if d == dim else slice(0, t.shape[d]) for d in range(ndim)
                )
                out[index] = t
                start += t.shape[dim]
            return out
        if self.dim != 0:
            raise FieldConfigError("A flat field over nested lists can only be concatenated along dim 0")
        return [x for elem in batch for x in elem]  # type: ignore[union-attr]


@dataclass(frozen=True, kw_only=True)
class MultiModalSharedField(BaseMultiModalField):
    """Every item sees the same data (e.g. a per-request grid)."""

    batch_size: int

    def build_elems(self, modality: str, key: str, data: NestedTensors) -> Sequence[MultiModalFieldElem]:
        return [MultiModalFieldElem(data, self)] * self.batch_size

    def _reduce_data(self, batch: list[NestedTensors], *, pin_memory: bool) -> NestedTensors:
        return batch[0]


class MultiModalFieldConfig:
    """A field layout bound to the modality whose items it splits."""

    @staticmethod
    def batched(modality: str, *, keep_on_cpu: bool = False) -> MultiModalFieldConfig:
        return MultiModalFieldConfig(MultiModalBatchedField(keep_on_cpu=keep_on_cpu), modality)

    @staticmethod
    def flat(
        modality: str, slices: Sequence[slice] | Sequence[tuple[slice, ...]], dim: int = 0, *,
        keep_on_cpu: bool = False,
    ) -> MultiModalFieldConfig:
        return MultiModalFieldConfig(MultiModalFlatField(slices=slices, dim=dim, keep_on_cpu=keep_on_cpu), modality)

    @staticmethod
    def flat_from_sizes(
        modality: str, size_per_item: torch.Tensor, dim: int = 0, *, keep_on_cpu: bool = False,
    ) -> MultiModalFieldConfig:
        if size_per_item.ndim != 1:
            raise FieldConfigError(f"size_per_item must be a 1-D tensor, got shape {tuple(size_per_item.shape)}")
        if dim < 0:
            raise FieldConfigError(f"flat_from_sizes needs dim >= 0, got {dim}")
        bounds = [0, *accumulate(int(x) for x in size_per_item.tolist())]
        slices: list[Any]
        if dim == 0:
            slices = [slice(a, b) for a, b in pairwise(bounds)]
        else:
            slices = [(slice(None),) * dim + (slice(a, b),) for a, b in pairwise(bounds)]
        return MultiModalFieldConfig.flat(modality, slices, dim=dim, keep_on_cpu=keep_on_cpu)

    @staticmethod
    def shared(modality: str, batch_size: int, *, keep_on_cpu: bool = False) -> MultiModalFieldConfig:
        return MultiModalFieldConfig(MultiModalSharedField(batch_size=batch_size, keep_on_cpu=keep_on_cpu), modality)

    def __init__(self, field: BaseMultiModalField, modality: str) -> None:
        self.field = field
        self.modality = modality

    def build_elems(self, key: str, batch: NestedTensors) -> Sequence[MultiModalFieldElem]:
        return self.field.build_elems(self.modality, key, batch)

    def __repr__(self) -> str:
        return f"MultiModalFieldConfig(field={self.field!r}, modality={self.modality!r})"


# --- items ------------------------------------------------------------------------------------


class MultiModalKwargsItem(UserDict[str, MultiModalFieldElem]):
    """The processed kwargs of exactly one multimodal item, keyed by HF output name.

    ``nbytes`` is maintained as keys are set and removed, so it is never recomputed by a walk.
    """

    def __init__(self, data: Mapping[str, MultiModalFieldElem] | None = None) -> None:
        self.nbytes = 0
        super().__init__(data or {})

    def __setitem__(self, key: str, elem: MultiModalFieldElem) -> None:
        if key in self.data:
            self.nbytes -= nested_tensors_nbytes(self.data[key].data)
        self.nbytes += nested_tensors_nbytes(elem.data)
        self.data[key] = elem

    def __delitem__(self, key: str) -> None:
        self.nbytes -= nested_tensors_nbytes(self.data[key].data)
        del self.data[key]

    @staticmethod
    def dummy(nbytes: int = 1) -> MultiModalKwargsItem:
        """An item of exactly ``nbytes`` bytes, for tests and cache sizing."""
        elem = MultiModalFieldElem(torch.empty(nbytes, dtype=torch.uint8), MultiModalSharedField(batch_size=1))
        return MultiModalKwargsItem({"dummy": elem})

    def get_data(self) -> dict[str, NestedTensors]:
        return {key: elem.data for key, elem in self.items()}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MultiModalKwargsItem):
            return NotImplemented
        return self.keys() == other.keys() and all(self[k] == other[k] for k in self)

    __hash__ = None  # type: ignore[assignment]


def _own(data: NestedTensors) -> NestedTensors:
    """A copy of ``data`` that owns its storage (slices of a batch tensor are views)."""
    if isinstance(data, torch.Tensor):
        return data.clone()
    if isinstance(data, list):
        return [_own(x) for x in data]
    if isinstance(data, tuple):
        return tuple(_own(x) for x in data)  # type: ignore[misc]
    return data


class MultiModalKwargsItems(UserDict[str, Sequence[MultiModalKwargsItem | None]]):
    """Per-modality lists of items; an entry is ``None`` (cached in P1) or a handle in SHM mode."""

    @staticmethod
    def from_hf_inputs(
        hf_inputs: Mapping[str, NestedTensors], config_by_key: Mapping[str, MultiModalFieldConfig],
    ) -> MultiModalKwargsItems:
        """Split HF processor outputs into one :class:`MultiModalKwargsItem` per item.

        Keys without a config and configured keys missing from the outputs are dropped. Every
        key of one modality must yield the same number of items. With more than one item per
        modality each element is copied out of the batch, so that caching one item does not keep
        its neighbours' data alive.
        """
        elems_by_key: dict[str, Sequence[MultiModalFieldElem]] = {}
        keys_by_modality: dict[str, list[str]] = {}
        for key, config in config_by_key.items():
            if key not in hf_inputs:
                continue
            elems_by_key[key] = config.build_elems(key, hf_inputs[key])
            keys_by_modality.setdefault(config.modality, []).append(key)

        items_by_modality: dict[str, Sequence[MultiModalKwargsItem | None]] = {}
        for modality, keys in keys_by_modality.items():
            sizes = {key: len(elems_by_key[key]) for key in keys}
            if len(set(sizes.values())) > 1:
                raise FieldConfigError(
                    f"Cannot merge different batch sizes for modality={modality!r}. Found: batch_sizes={sizes}. "
                    "The processor's field layout does not match its outputs."
                )
            count = next(iter(sizes.values()))
            copy_out = count > 1
            items: list[MultiModalKwargsItem | None] = []
            for i in range(count):
                item = MultiModalKwargsItem()
                for key in keys:
                    elem = elems_by_key[key][i]
                    if copy_out and not isinstance(elem.field, MultiModalSharedField):
                        elem = MultiModalFieldElem(_own(elem.data), elem.field)
                    item[key] = elem
                items.append(item)
            items_by_modality[modality] = items
        return MultiModalKwargsItems(items_by_modality)

    @classmethod
    def merge(cls, parts: Sequence[MultiModalKwargsItems]) -> MultiModalKwargsItems:
        """The items of several HF calls, as one call over all of their items would have split
        them: each flat field's slice moves past the rows of the items before it (item 1 of a call
        holds ``slice(1, 2)``, not ``slice(0, 1)``), so items processed one call each are
        byte-identical to items processed together."""
        merged: dict[str, list[MultiModalKwargsItem | None]] = {}
        offsets: dict[tuple[str, str], int] = {}
        for part in parts:
            for modality, items in part.items():
                out = merged.setdefault(modality, [])
                for item in items:
                    out.append(None if item is None else _placed(item, modality, offsets))
        return cls(merged)

    def __getitem__(self, modality: str) -> Sequence[MultiModalKwargsItem | None]:
        if modality not in self.data:
            raise ModalityNotFoundError(f"Modality {modality!r} not found. Available modalities: {set(self.data)}")
        return self.data[modality]

    def get_count(self, modality: str) -> int:
        return len(self.data.get(modality, ()))

    def require_data(self) -> dict[str, list[MultiModalKwargsItem]]:
        out: dict[str, list[MultiModalKwargsItem]] = {}
        for modality, items in self.items():
            for i, item in enumerate(items):
                if item is None:
                    raise FieldConfigError(f"Found empty mm_items[{modality!r}][{i}]: the data is still cached in P1")
            out[modality] = list(items)  # type: ignore[arg-type]
        return out

    def get_data(self, *, device: torch.device | str | None = None, pin_memory: bool = False) -> BatchedTensorInputs:
        """Batch every modality's items into model kwargs (each modality must form one group)."""
        out: BatchedTensorInputs = {}
        for modality, items in self.require_data().items():
            groups = group_and_batch_mm_items(items, device=device, pin_memory=pin_memory)
            if len(groups) > 1:
                raise FieldConfigError(
                    f"Items of modality {modality!r} cannot be batched together (different keys or shared data)"
                )
            for _, batched in groups:
                out.update(batched)
        return out


def _placed(item: MultiModalKwargsItem, modality: str, offsets: dict[tuple[str, str], int]) -> MultiModalKwargsItem:
    out = MultiModalKwargsItem()
    for key, elem in item.items():
        field = elem.field
        if isinstance(field, MultiModalFlatField) and len(field.slices) == 1:
            rows = len(elem.data) if field.dim == 0 and isinstance(elem.data, list) else \
                int(elem.data.shape[field.dim]) if isinstance(elem.data, torch.Tensor) else None
            if rows is not None:
                offset = offsets.get((modality, key), 0)
                offsets[(modality, key)] = offset + rows
                field = replace(field, slices=[_shifted(field.slices[0], field.dim, offset)])  # type: ignore[arg-type]
        out[key] = MultiModalFieldElem(elem.data, field)
    return out


def _shifted(where: slice | tuple[slice, ...], dim: int, offset: int) -> slice | tuple[slice, ...]:
    if isinstance(where, slice):
        return slice((where.start or 0) + offset, (where.stop or 0) + offset, where.step)
    axis = where[dim]
    return (*where[:dim], slice((axis.start or 0) + offset, (axis.stop or 0) + offset, axis.step), *where[dim + 1:])


def _same_group(a: MultiModalKwargsItem, b: MultiModalKwargsItem) -> bool:
    if a.keys() != b.keys():
        return False
    for key in a:
        ea, eb = a[key], b[key]
        if type(ea.field) is not type(eb.field):
            return False
        if isinstance(ea.field, MultiModalSharedField) and not nested_tensors_equal(ea.data, eb.data):
            return False
    return True


def group_and_batch_mm_items(
    items: Sequence[MultiModalKwargsItem], *, device: torch.device | str | None = None, pin_memory: bool = False,
) -> list[tuple[int, BatchedTensorInputs]]:
    """Batch consecutive items that can share one forward call; returns ``(count, kwargs)`` per group."""
    groups: list[list[MultiModalKwargsItem]] = []
    for item in items:
        if groups and _same_group(groups[-1][-1], item):
            groups[-1].append(item)
        else:
            groups.append([item])
    out = []
    for group in groups:
        batched = {
            key: group[0][key].field.reduce_data([it[key] for it in group], device=device, pin_memory=pin_memory)
            for key in group[0]
        }
        out.append((len(group), batched))
    return out


# --- features and processor outputs -----------------------------------------------------------


def placeholders_in_prompt_order(
    mm_placeholders: Mapping[str, Sequence[PlaceholderRange]],
) -> list[tuple[int, str, int]]:
    """Every placeholder as ``(offset, modality, item index)``, in prompt order: the order a
    request's features are sent in, so the order P0 commits and P1 walks them (stable: ties keep
    modality, then item order)."""
    flat = [(r.offset, m, i) for m, ranges in mm_placeholders.items() for i, r in enumerate(ranges)]
    flat.sort(key=lambda x: x[0])
    return flat


@dataclass
class MultiModalFeatureSpec:
    """One multimodal item as it travels to the engine.

    ``data`` is ``None`` when P1 already holds the item; ``identifier`` keys the encoder and prefix
    caches (with a LoRA prefix when tower/connector LoRA is on); ``mm_hash`` keys the processor
    cache and never carries the LoRA prefix.
    """

    data: MultiModalKwargsItem | None
    modality: str
    identifier: str
    mm_position: PlaceholderRange
    mm_hash: str | None = None

    @property
    def cache_key(self) -> str:
        """The key of this item in the processor caches, P0's and P1's alike: its ``mm_hash``,
        or the identifier of an item sent without one."""
        return self.mm_hash or self.identifier

    @staticmethod
    def gather_kwargs(features: Sequence[MultiModalFeatureSpec], keys: set[str]) -> dict[str, list[NestedTensors]]:
        out: dict[str, list[NestedTensors]] = {key: [] for key in keys}
        for feature in features:
            if feature.data is None:
                continue
            for key in keys:
                if key in feature.data:
                    out[key].append(feature.data[key].data)
        return out


def group_mm_kwargs_by_modality(
    features: Sequence[MultiModalFeatureSpec], *, device: torch.device | str | None = None, pin_memory: bool = False,
) -> list[tuple[str, list[MultiModalFeatureSpec], BatchedTensorInputs]]:
    """A batch's features as encoder calls (vLLM's ``group_mm_kwargs_by_modality`` role): runs of
    consecutive features of one modality whose items batch together, each with its model kwargs.

    Every feature must carry its data (the receiver fills cached ones in before the engine sees
    them); the order of ``features`` is kept, so the encoder outputs line up with them."""
    out: list[tuple[str, list[MultiModalFeatureSpec], BatchedTensorInputs]] = []
    run: list[MultiModalFeatureSpec] = []
    for feature in [*features, None]:
        if run and (feature is None or feature.modality != run[0].modality):
            items = [f.data for f in run]
            if any(item is None for item in items):
                missing = [f.identifier for f in run if f.data is None]
                raise FieldConfigError(f"Features {missing} carry no data: fill them from the receiver cache first.")
            start = 0
            for count, batched in group_and_batch_mm_items(items, device=device, pin_memory=pin_memory):  # type: ignore[arg-type]
                out.append((run[0].modality, run[start:start + count], batched))
                start += count
            run = []
        if feature is not None:
            run.append(feature)
    return out


class _MultiModalInputsBase(TypedDict):
    type: Literal["multimodal"]
    prompt_token_ids: list[int]
    mm_kwargs: MultiModalKwargsItems
    mm_hashes: dict[str, list[str]]
    mm_placeholders: dict[str, list[PlaceholderRange]]


class MultiModalInputs(_MultiModalInputsBase, total=False):
    """What :meth:`BaseMultiModalProcessor.apply` returns (vLLM's ``MultiModalInput``)."""

    prompt: str
    cache_salt: str


def mm_inputs(
    prompt_token_ids: list[int], mm_kwargs: MultiModalKwargsItems, mm_hashes: dict[str, list[str]],
    mm_placeholders: dict[str, list[PlaceholderRange]], *, prompt: str | None = None, cache_salt: str | None = None,
) -> MultiModalInputs:
    out = MultiModalInputs(
        type="multimodal", prompt_token_ids=prompt_token_ids, mm_kwargs=mm_kwargs, mm_hashes=mm_hashes,
        mm_placeholders=mm_placeholders,
    )
    if prompt is not None:
        out["prompt"] = prompt
    if cache_salt is not None:
        out["cache_salt"] = cache_salt
    return out


def is_processed(prompt: object) -> TypeGuard[MultiModalInputs]:
    """``prompt`` is already processed (``MultiModalInputs``, as ``preprocess`` returns them):
    preparing it only checks it, no processor runs."""
    return isinstance(prompt, Mapping) and prompt.get("type") == "multimodal"


__all__ = [
    "BaseMultiModalField",
    "BatchedTensorInputs",
    "MultiModalBatchedField",
    "MultiModalFeatureSpec",
    "MultiModalFieldConfig",
    "MultiModalFieldElem",
    "MultiModalFlatField",
    "MultiModalInputs",
    "MultiModalKwargsItem",
    "MultiModalKwargsItems",
    "MultiModalSharedField",
    "NestedTensors",
    "PlaceholderRange",
    "group_and_batch_mm_items",
    "is_processed",
    "mm_inputs",
    "nested_tensors_equal",
    "nested_tensors_nbytes",
]
