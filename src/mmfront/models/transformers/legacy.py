"""``LegacyMultiModalProcessor``: the transformers backend for transformers < 5.15.

Before 5.15 most HF processors cannot say what a placeholder expanded to, so the only source of
truth is HF's own expansion of the whole prompt: one HF call on the full text and the items, then
each item is located in the expanded ids. vLLM 0.33 dropped this path; mmfront keeps it so models
work on older transformers.

Locating: the tokens of a modality are those ``mm_token_type_ids`` marks (Gemma3 calls it
``token_type_ids``), else the modality's embedding token. Images are split by the processor's
per-image token counts (``_get_num_multimodal_tokens``), which are counted the same way the marks
are (Idefics3 marks and counts whole expansions, so adjacent images that merge into one run still
split); audio is one run per item. Each range then widens to the begin/end tokens wrapped around
it (``<start_of_image>``/``<end_of_image>``), so structure tokens sit inside the range with
``is_embed`` false, as on the Offsets path.

Because an item's expansion is only known inside its prompt, items cannot be processed apart from
it: there is no processor cache on this path (``cache`` is ignored; hashes are still returned).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from mmfront.cache.base import BaseMultiModalProcessorCache
from mmfront.errors import FieldConfigError, ProcessorError, PromptUpdateError, UnsupportedModelError
from mmfront.hashing import get_mm_hashes
from mmfront.inputs import MultiModalInputs, MultiModalKwargsItems, PlaceholderRange, mm_inputs
from mmfront.models.transformers.base import (
    LAYOUT_KEY,
    MM_TOKEN_TYPE,
    ModalityLayout,
    _MultiModalProcessorBase,
    attribute_keys,
    refuse_embeddings,
    split_text_outputs,
    unpad_images,
)
from mmfront.parse import AudioProcessorItems, ImageProcessorItems, MultiModalDataItems
from mmfront.processing.hf import cast_floating, resolve_hf_kwargs
from mmfront.processing.processor import MultiModalUUIDs, normalize_mm_uuids
from mmfront.processing.updates import PromptUpdate

MAX_WRAPPER_DISTANCE = 16
"""How far from an item's marked tokens its begin/end token may sit (Emu3 writes the grid size,
``"{h}*{w}<|image token|>"``, between ``<|image start|>`` and the first ``<image>``)."""


def token_runs(positions: np.ndarray) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of consecutive positions."""
    if positions.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    return [(int(run[0]), int(run[-1]) + 1) for run in np.split(positions, breaks)]


def split_positions(positions: np.ndarray, count: int, sizes: Sequence[int] | None) -> list[tuple[int, int]] | None:
    """One ``[start, end)`` per item: consecutive chunks of ``sizes`` tokens when the sizes cover
    the positions exactly and each chunk is contiguous, else one run per item; None when neither
    fits."""
    if sizes is not None and len(sizes) == count and all(s > 0 for s in sizes) and sum(sizes) == positions.size:
        chunks = np.split(positions, np.cumsum(sizes)[:-1])
        spans = [(int(c[0]), int(c[-1]) + 1) for c in chunks]
        if all(end - start == c.size for (start, end), c in zip(spans, chunks)):
            return spans
    runs = token_runs(positions)
    return runs if len(runs) == count else None


def widen_to_wrappers(
    ids: Sequence[int], spans: list[tuple[int, int]], begin: Sequence[frozenset[int]], end: Sequence[frozenset[int]],
) -> list[tuple[int, int]]:
    """Grow each span (sorted by start) to the nearest begin token before it and end token after
    it, without crossing a neighbouring span or another item's wrapper."""
    out: list[tuple[int, int]] = []
    for i, (start, stop) in enumerate(spans):
        low = out[-1][1] if out else 0
        high = spans[i + 1][0] if i + 1 < len(spans) else len(ids)
        for j in range(start - 1, max(low, start - MAX_WRAPPER_DISTANCE) - 1, -1):
            if ids[j] in begin[i]:
                start = j
                break
            if ids[j] in end[i]:
                break
        for k in range(stop, min(high, stop + MAX_WRAPPER_DISTANCE)):
            if ids[k] in end[i]:
                stop = k + 1
                break
            if ids[k] in begin[i]:
                break
        out.append((start, stop))
    return out


class LegacyMultiModalProcessor(_MultiModalProcessorBase):
    """Places items by locating them in HF's expansion of the whole prompt (transformers < 5.15)."""

    def apply(
        self,
        prompt: str | list[int],
        mm_data: Mapping[str, Any] | MultiModalDataItems | None,
        *,
        mm_uuids: MultiModalUUIDs | None = None,
        hf_processor_mm_kwargs: Mapping[str, Any] | None = None,
        media_io_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        cache: BaseMultiModalProcessorCache | None = None,
        add_special_tokens: bool = True,
    ) -> MultiModalInputs:
        """Process one prompt and its items with one HF call on the whole prompt.

        A token-id prompt is decoded first (and processed without adding special tokens again),
        so it gives the same ids as the string it came from. ``cache`` is ignored: this path has
        no processor cache.
        """
        tok = self.info.tokenizer
        if isinstance(prompt, str):
            text, special = prompt, add_special_tokens
        else:
            text, special = tok.decode(list(prompt), skip_special_tokens=False,
                                       clean_up_tokenization_spaces=False), False
        keep_prompt = prompt if isinstance(prompt, str) else None
        mm_items = mm_data if isinstance(mm_data, MultiModalDataItems) else self.info.parse_mm_data(mm_data or {})
        counts = {m: items.get_count() for m, items in mm_items.items() if items.get_count() > 0}
        request_kwargs = dict(hf_processor_mm_kwargs or {})
        hf_kwargs = resolve_hf_kwargs(self.info.hf_processor, self.info.config.mm_processor_kwargs, request_kwargs)
        if not counts:
            return mm_inputs(self._text_only_ids(text, special, hf_kwargs), MultiModalKwargsItems(), {}, {},
                             prompt=keep_prompt)
        mm_items = mm_items.select(counts)
        refuse_embeddings(mm_items)
        hashes = get_mm_hashes(
            {m: mm_items[m].get_all_items_for_hash() for m in counts}, self.info.model_id,
            self.info.config.mm_hasher_algorithm, mm_uuids=normalize_mm_uuids(mm_uuids, counts),
            hf_processor_mm_kwargs=request_kwargs, media_io_kwargs=media_io_kwargs,
        )
        self._check_placeholder_counts(text, counts)
        hf_out = self.run_hf([text], {m: mm_items[m].get_all() for m in counts}, hf_kwargs,
                             return_mm_token_type_ids=True, text_kwargs={"add_special_tokens": special})
        ids = [int(t) for t in hf_out["input_ids"][0].tolist()]
        placeholders = self._locate(ids, hf_out, mm_items, hf_kwargs)
        kw_items = self._split_items(hf_out, mm_items, placeholders, hf_kwargs)
        return mm_inputs(ids, kw_items, {m: list(hashes[m]) for m in counts}, placeholders, prompt=keep_prompt)

    def _check_placeholder_counts(self, text: str, counts: Mapping[str, int]) -> None:
        """One placeholder per item: too few is the user's error, and so is too many (a stray one
        would reach the model); say so before HF says it less clearly, or not at all."""
        for modality, count in counts.items():
            placeholder = self.info.placeholder(modality)
            found = text.count(placeholder)
            if found != count:
                raise PromptUpdateError(
                    f"Expected {count} placeholder(s) for {modality} items but found {found} in the prompt. Put one "
                    f"`{placeholder}` (the model's {modality} placeholder) in the prompt for each {modality}.",
                    modality=modality, expected=count, found=found,
                )

    def _split_items(
        self, hf_out: Mapping[str, Any], mm_items: MultiModalDataItems,
        placeholders: Mapping[str, list[PlaceholderRange]], hf_kwargs: Mapping[str, Any],
    ) -> MultiModalKwargsItems:
        """The full-prompt call's data, one kwargs item per multimodal item."""
        data = split_text_outputs(hf_out)[1]
        owned = attribute_keys(self.info, list(mm_items), list(data))
        out: dict[str, Any] = {}
        layout: dict[str, ModalityLayout] = {}
        for modality in mm_items:
            own, lay = self._lay_out_full_call(modality, mm_items, {k: data[k] for k in owned[modality]},
                                               hf_kwargs, hf_out)
            self._add_item_sizes(modality, [hf_out], own, lay)
            if modality == "audio":
                own["num_audio_tokens"] = torch.tensor([p.get_num_embeds() for p in placeholders["audio"]])
                lay.size_keys.append("num_audio_tokens")
            out.update(own)
            layout[modality] = lay
        out = {k: cast_floating(v, self.info.model_dtype) for k, v in out.items()}
        out[LAYOUT_KEY] = layout
        kw_items = MultiModalKwargsItems.from_hf_inputs(out, self._get_mm_fields_config(out, hf_kwargs))
        for modality, items in mm_items.items():
            if kw_items.get_count(modality) != items.get_count():
                raise FieldConfigError(
                    f"Expected {items.get_count()} {modality} item(s) from the processor outputs but found "
                    f"{kw_items.get_count(modality)}; the transformers backend cannot split them per item."
                )
        return kw_items

    def _text_only_ids(self, text: str, special: bool, hf_kwargs: Mapping[str, Any]) -> list[int]:
        """HF's own tokenization of a prompt without items; processors that refuse a placeholder
        with no data (Idefics3; every processor from 5.15) fall back to the tokenizer."""
        try:
            out = self.run_hf([text], {}, hf_kwargs, text_kwargs={"add_special_tokens": special})
        except ProcessorError as exc:
            if not isinstance(exc.__cause__, ValueError):
                raise
            return list(self.info.tokenizer.encode(text, add_special_tokens=special))
        return [int(t) for t in out["input_ids"][0].tolist()]

    def _lay_out_full_call(
        self, modality: str, mm_items: MultiModalDataItems, data: dict[str, Any], hf_kwargs: Mapping[str, Any],
        hf_out: Mapping[str, Any],
    ) -> tuple[dict[str, Any], ModalityLayout]:
        """The layout of ``modality``'s part of the full-prompt call. Audio of unequal lengths is
        processed again one item at a time, so no item carries padding that depends on another."""
        items = mm_items[modality]
        if modality == "audio":
            audios = mm_items.get_items("audio", AudioProcessorItems)
            if len({audios.get_audio_length(i) for i in range(audios.get_count())}) > 1:
                outputs = [self._call_on_dummy_text("audio", [a], hf_kwargs) for a in audios.get_all()]
                return self._lay_out("audio", audios, outputs, hf_kwargs)
        if modality == "image":
            unpad_images(data)
        rows = self.item_rows(modality, items, data, hf_kwargs, hf_out)
        return data, ModalityLayout(count=items.get_count(), keys=list(data), rows=rows)

    def _locate(self, ids: list[int], hf_out: Mapping[str, Any], mm_items: MultiModalDataItems,
                hf_kwargs: Mapping[str, Any]) -> dict[str, list[PlaceholderRange]]:
        """Each item's range in the expanded ids, with ``is_embed`` marking its embedding tokens."""
        array = np.asarray(ids, dtype=np.int64)
        marks = hf_out.get("mm_token_type_ids", hf_out.get("token_type_ids"))
        mark_array = np.asarray(marks[0]) if isinstance(marks, (torch.Tensor, list)) else None
        spans: list[tuple[int, int, str, int]] = []
        for modality in mm_items:
            items = mm_items[modality]
            count = items.get_count()
            embed = self.info.embed_token_ids(modality)
            positions = np.flatnonzero(mark_array == MM_TOKEN_TYPE[modality]) if mark_array is not None else None
            if positions is None or positions.size == 0:
                positions = np.flatnonzero(np.isin(array, embed))
            sizes = (self._image_token_counts(mm_items.get_items("image", ImageProcessorItems), hf_kwargs)
                     if modality == "image" else None)
            found = split_positions(positions, count, sizes)
            if found is None:
                raise ProcessorError(
                    f"Could not locate {count} {modality} item(s) in {type(self.info.hf_processor).__name__}'s "
                    f"expansion of the prompt: {positions.size} {modality} token(s) in {len(token_runs(positions))} "
                    f"run(s), per-item counts {sizes}. Known case: Gemma3 with do_pan_and_scan, whose crop count the "
                    "processor does not report before transformers 5.15; upgrade transformers to >= 5.15 (Offsets "
                    "backend) or turn do_pan_and_scan off."
                )
            spans.extend((start, stop, modality, i) for i, (start, stop) in enumerate(found))
        spans.sort()
        wrappers = {m: self.info.wrapper_ids(m) for m in mm_items}
        widened = widen_to_wrappers(ids, [(s[0], s[1]) for s in spans], [wrappers[s[2]][0] for s in spans],
                                    [wrappers[s[2]][1] for s in spans])
        out: dict[str, list[PlaceholderRange | None]] = {m: [None] * mm_items[m].get_count() for m in mm_items}
        for (start, stop), (_, _, modality, index) in zip(widened, spans):
            mask = torch.from_numpy(np.isin(array[start:stop], self.info.embed_token_ids(modality)))
            out[modality][index] = PlaceholderRange(offset=start, length=stop - start, is_embed=mask)
        return {m: [r for r in ranges if r is not None] for m, ranges in out.items()}

    def _image_token_counts(self, images: ImageProcessorItems, hf_kwargs: Mapping[str, Any]) -> list[int] | None:
        sizes = [images.get_image_size(i) for i in range(images.get_count())]
        query = self.query_mm_tokens(hf_kwargs, image_sizes=[(s.height, s.width) for s in sizes])
        tokens = getattr(query, "num_image_tokens", None)
        return [int(t) for t in tokens] if isinstance(tokens, (list, tuple)) else None

    def _get_prompt_updates(
        self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any], out_mm_kwargs: MultiModalKwargsItems,
    ) -> Sequence[PromptUpdate]:
        """There are none: an item's expansion is only known inside HF's expansion of its prompt."""
        raise UnsupportedModelError(
            "The Legacy transformers backend places items from the HF processor's expansion of the whole prompt, so "
            "it cannot process items apart from their prompt (no per-item prompt updates, no processor cache). Call "
            "apply(), or use transformers >= 5.15 (Offsets backend)."
        )
