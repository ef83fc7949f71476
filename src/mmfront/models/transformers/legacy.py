"""``LegacyMultiModalProcessor``: the transformers backend for transformers < 5.15.

Before 5.15 most HF processors cannot say what a placeholder expanded to, so the expansion is
read from HF's own token ids. The items run through the shared pipeline like any other
processor's: the missing ones are processed on a dummy text (one placeholder per item, as on the
Offsets path), each item's expansion is located in the ids HF returns, and the expansion becomes
that item's :class:`PromptReplacement` of the modality's placeholder. Items are therefore
processed apart from their prompt and cached. A placeholder HF leaves as it is
(``ModelSpec.unexpanded_placeholders``: one ``<|image|>`` per Mllama image) is its own expansion:
nothing is located or learned for it.

Locating: the tokens of a modality are those ``mm_token_type_ids`` marks (Gemma3 calls it
``token_type_ids``), else the modality's embedding token. Images are split by the processor's
per-image token counts (``_get_num_multimodal_tokens``), which are counted the same way the marks
are (Idefics3 marks and counts whole expansions, so adjacent images that merge into one run still
split); audio is one item per text sample. Each range then widens to the begin/end tokens wrapped
around it (``<start_of_image>``/``<end_of_image>``), so structure tokens sit inside the range with
``is_embed`` false.

What HF writes around an expansion, rather than in it, is text that tokenizes together with the
prompt's own text (Gemma3's ``"\\n\\n"`` on both sides, merging with a neighbouring newline; Emu3's
BOS at the start of the prompt). That :class:`PromptFrame` is learned once, when the processor is
built, from HF's ids for one and two dummy items, checked to reproduce those ids exactly, and
applied to the prompt's text before it is tokenized (:meth:`_tokenize_prompt`), so the splice gives
HF's own ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from mmfront.errors import ProcessorError, UnsupportedModelError
from mmfront.inputs import MultiModalKwargsItems
from mmfront.models.catalog import unexpanded_placeholders
from mmfront.models.transformers.base import (
    MM_TOKEN_TYPE,
    PROBE_IMAGE_SIZE,
    _MultiModalProcessorBase,
)
from mmfront.models.transformers.layout import (
    ModalityLayout,
    most_frequent_token,
)
from mmfront.parse import ImageProcessorItems, MultiModalDataItems
from mmfront.processing import iter_token_matches
from mmfront.processing.hf import resolve_hf_kwargs
from mmfront.processing.processor import BaseProcessingInfo
from mmfront.processing.updates import (
    PlaceholderFeaturesInfo,
    PromptUpdate,
    PromptUpdateDetails,
    ResolvedPromptUpdate,
    placeholder_spans,
)

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


def unwrap(ids: list[int], placeholder: list[int], wrappers: tuple[int, int]) -> list[int]:
    """``ids`` without the begin/end pair around each ``placeholder`` that has both."""
    begin, end = wrappers
    drop: set[int] = set()
    for start, stop in iter_token_matches(ids, placeholder):
        if start > 0 and stop < len(ids) and ids[start - 1] == begin and ids[stop] == end:
            drop.update((start - 1, stop))
    return [t for i, t in enumerate(ids) if i not in drop] if drop else ids


@dataclass(frozen=True)
class PromptFrame:
    """What HF < 5.15 writes around one modality's expansions besides the expansions themselves.

    ``lead``/``trail``: text on either side of every expansion (Gemma3: ``"\\n\\n"``). ``start``:
    text put before the whole prompt, once per item or once per prompt (Emu3's BOS, per image in
    5.14 and per prompt from 5.15). ``wrappers``: the begin/end tokens an expansion of a bare
    placeholder brings itself (Qwen2-Audio 5.14 adds ``<|audio_bos|>``/``<|audio_eos|>``); a
    placeholder the prompt already wraps in them is unwrapped first, so they are not doubled.
    """

    lead: str = ""
    trail: str = ""
    start: str = ""
    start_per_item: bool = False
    wrappers: tuple[int, int] | None = None

    def rewrite(self, text: str, placeholder: str, count: int) -> str:
        """``text`` as HF tokenizes it, with ``placeholder`` standing for each expansion."""
        if self.lead or self.trail:
            text = text.replace(placeholder, f"{self.lead}{placeholder}{self.trail}")
        return self.start * (count if self.start_per_item else 1) + text


class LegacyMultiModalProcessor(_MultiModalProcessorBase):
    """Places each item with the expansion located in HF's ids for it (transformers < 5.15)."""

    def __init__(self, info: BaseProcessingInfo) -> None:
        super().__init__(info)
        self.unexpanded = unexpanded_placeholders(type(self.info.hf_processor))
        self.frames = {modality: self._learn_frame(modality) for modality in self.modalities
                       if modality not in self.unexpanded}
        native = self.info.native
        self.bare = frozenset(m for m, frame in self.frames.items()
                              if frame.wrappers is not None and native is not None and native.whole_range_embeds)
        """Modalities whose item replaces its placeholder with the embedding tokens alone: vLLM's native
        class replaces a placeholder so (``NativeInputs.whole_range_embeds``) where HF < 5.15 wraps a
        bare one in begin/end tokens of its own (Qwen2-Audio's ``<|audio_bos|>``/``<|audio_eos|>``).
        The prompt's own begin/end tokens then stay in the prompt, as in vLLM."""

    def _dummy_call_kwargs(self) -> dict[str, Any]:
        return {"return_mm_token_type_ids": True, "text_kwargs": {"add_special_tokens": False}}

    # --- the prompt ----------------------------------------------------------------------------

    def _tokenize_prompt(
        self, prompt: str | list[int], mm_counts: Mapping[str, int], *, add_special_tokens: bool,
    ) -> list[int]:
        """HF's tokenization of the prompt, laid out as HF lays it out, with each placeholder
        standing for its expansion. A token-id prompt is decoded first (and tokenized without
        adding special tokens again), so it gives the same ids as the string it came from."""
        if not mm_counts:
            return super()._tokenize_prompt(prompt, mm_counts, add_special_tokens=add_special_tokens)
        prompt = self.laid_out(prompt, mm_counts)
        if isinstance(prompt, str):
            text, special = prompt, add_special_tokens
        else:
            text, special = self._decode(list(prompt)), False
        for modality, count in mm_counts.items():
            if modality in self.frames:
                text = self.frames[modality].rewrite(text, self.info.placeholder(modality), count)
        ids = list(self.info.tokenizer.encode(text, add_special_tokens=special))
        for modality in mm_counts:
            wrappers = self.frames[modality].wrappers if modality in self.frames else None
            if wrappers is not None and modality not in self.bare:
                ids = unwrap(ids, self.info.placeholder_ids(modality), wrappers)
        return ids

    def _apply_prompt_updates(
        self, prompt_ids: list[int], mm_prompt_updates: Mapping[str, Sequence[Sequence[ResolvedPromptUpdate]]],
    ) -> tuple[list[int], Mapping[str, Sequence[PlaceholderFeaturesInfo]]]:
        """The splice, with each range taking in a begin/end token the prompt itself puts right
        around it (``<|audio_bos|><|AUDIO|><|audio_eos|>``), as the structure tokens an expansion
        brings are in its range. Not while vLLM's native class runs: its range is what replaced the
        placeholder, never the prompt's own tokens around it."""
        ids, placeholders = super()._apply_prompt_updates(prompt_ids, mm_prompt_updates)
        if self.info.native is not None:
            return ids, placeholders
        bounds = placeholder_spans(placeholders)
        prev_end = {start: bounds[i - 1][1] if i else 0 for i, (start, _) in enumerate(bounds)}
        next_start = {stop: bounds[i + 1][0] if i + 1 < len(bounds) else len(ids)
                      for i, (_, stop) in enumerate(bounds)}
        out: dict[str, list[PlaceholderFeaturesInfo]] = {}
        for modality, ps in placeholders.items():
            begin, end = self.info.wrapper_ids(modality)
            found = out[modality] = []
            for p in ps:
                start, stop = p.start_idx, p.start_idx + p.length
                before = int(start > prev_end[start] and ids[start - 1] in begin)
                after = int(stop < next_start[stop] and ids[stop] in end)
                if not (before or after):
                    found.append(p)
                    continue
                mask = p.is_embed if p.is_embed is not None else torch.ones(p.length, dtype=torch.bool)
                mask = torch.cat([torch.zeros(before, dtype=torch.bool), mask, torch.zeros(after, dtype=torch.bool)])
                found.append(PlaceholderFeaturesInfo(modality, p.item_idx, start - before,
                                                     ids[start - before:stop + after], mask))
        return ids, out

    def _decode(self, ids: list[int]) -> str:
        return str(self.info.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    # --- the items -----------------------------------------------------------------------------

    def _add_expansions(self, modality: str, items: Any, outputs: Sequence[Mapping[str, Any]], *,
                        data: dict[str, Any], layout: ModalityLayout, hf_kwargs: Mapping[str, Any]) -> None:
        """Each item's expansion as located in HF's ids, or as the model's module computes it from
        the data (``ModelSpec.image_expansions``), or the placeholder itself where the model's module
        says HF leaves it unexpanded (``ModelSpec.unexpanded_placeholders``)."""
        if modality in self.unexpanded:
            expansions = [self.info.placeholder_ids(modality)] * items.get_count()
        elif layout.expansions is not None:
            expansions = layout.expansions
        else:
            expansions = [ids[start:stop] for out in outputs
                          for ids, start, stop in self._expansions(modality, items, out, hf_kwargs)]
        if modality in self.bare:  # without the begin/end tokens HF brings
            wrappers = self.frames[modality].wrappers
            expansions = [ids[1:-1] if (ids[0], ids[-1]) == wrappers else ids for ids in expansions]
        data[f"{modality}_replacement_ids"] = torch.tensor([t for ids in expansions for t in ids], dtype=torch.int64)
        layout.replacement_sizes = [len(ids) for ids in expansions]
        if modality == "audio":
            embed = self.info.embed_token_ids("audio")
            data["num_audio_tokens"] = torch.tensor([sum(t in embed for t in ids) for ids in expansions])
            layout.size_keys.append("num_audio_tokens")

    def _expansions(self, modality: str, items: Any, hf_out: Mapping[str, Any], hf_kwargs: Mapping[str, Any]
                    ) -> list[tuple[list[int], int, int]]:
        """``(its text sample's ids, start, end)`` of each item's expansion in one dummy-text call:
        images all in one sample, audio one per sample."""
        rows = [[int(t) for t in row] for row in hf_out["input_ids"].tolist()]
        marks = hf_out.get("mm_token_type_ids", hf_out.get("token_type_ids"))
        mark_rows = marks.tolist() if isinstance(marks, torch.Tensor) else [None] * len(rows)
        if modality == "image":
            sizes = self._image_token_counts(items, hf_kwargs)
            return [(rows[0], start, stop)
                    for start, stop in self._locate(rows[0], mark_rows[0], "image", items.get_count(), sizes)]
        return [(ids, *self._locate(ids, row_marks, modality, 1, None)[0]) for ids, row_marks in zip(rows, mark_rows)]

    def _locate(self, ids: list[int], marks: list[int] | None, modality: str, count: int,
                sizes: list[int] | None) -> list[tuple[int, int]]:
        """Each item's ``[start, end)`` in one sample's ids, widened to its wrapper tokens."""
        array = np.asarray(ids, dtype=np.int64)
        positions = np.flatnonzero(np.asarray(marks) == MM_TOKEN_TYPE[modality]) if marks is not None else None
        if positions is None or positions.size == 0:
            positions = np.flatnonzero(np.isin(array, self.info.embed_token_ids(modality)))
        found = split_positions(positions, count, sizes)
        if found is None:
            if sizes is None:
                why = ("the processor reports no per-item token counts before transformers 5.15, and the items' tokens "
                       "are not one run each (a tiled image: SmolVLM's tiles, Gemma3's pan-and-scan crops)")
            elif sum(sizes) != positions.size:
                why = ("the counts do not add up to those tokens: before transformers 5.15 Idefics3's processor counts "
                       "each <row_R_col_C> and <global-img> marker as one token whatever the tokenizer makes of it, "
                       "and Gemma3's does not count its pan-and-scan crops")
            else:
                why = "the counts do not split those tokens into one contiguous run per item"
            raise ProcessorError(
                f"Could not locate {count} {modality} item(s) in {type(self.info.hf_processor).__name__}'s "
                f"expansion of the dummy text: {positions.size} {modality} token(s) in {len(token_runs(positions))} "
                f"run(s), per-item counts {sizes}: {why}. Upgrade transformers to >= 5.15 (Offsets backend), or turn "
                "off the processor's tiling (do_image_splitting, do_pan_and_scan)."
            )
        begin, end = self.info.wrapper_ids(modality)
        return widen_to_wrappers(ids, found, [begin] * count, [end] * count)

    def _image_token_counts(self, images: ImageProcessorItems, hf_kwargs: Mapping[str, Any]) -> list[int] | None:
        sizes = [images.get_image_size(i) for i in range(images.get_count())]
        query = self.query_mm_tokens(hf_kwargs, image_sizes=[(s.height, s.width) for s in sizes])
        tokens = getattr(query, "num_image_tokens", None)
        return [int(t) for t in tokens] if isinstance(tokens, (list, tuple)) else None

    def _get_prompt_updates(
        self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any], out_mm_kwargs: MultiModalKwargsItems,
    ) -> Sequence[PromptUpdate]:
        """Item ``i`` takes its own located expansion; the embedding token it repeats most receives
        embeddings (``{modality}_token_ids`` also lists structure tokens on some processors, Pixtral's
        ``[IMG_BREAK]`` and ``[IMG_END]``: they are marked, not embedded)."""
        return self._replacement_updates(mm_items, out_mm_kwargs, self._embedding_details)

    def _embedding_details(self, modality: str, ids: list[int]) -> PromptUpdateDetails[list[int]]:
        embeds = set(self.info.embed_token_ids(modality))
        candidates = [t for t in ids if t in embeds]
        return PromptUpdateDetails.select_token_id(ids, most_frequent_token(candidates or ids))

    # --- learning the frame ----------------------------------------------------------------------

    def _learn_frame(self, modality: str) -> PromptFrame:
        """The frame HF writes around ``modality``'s expansions, from its ids for the dummy text of
        one item and (images, which share a sample) two items; refused when it does not reproduce
        those ids exactly."""
        one = self._probe(modality, 1)
        ids, start, stop = one[0]
        before, trail = self._decode(ids[:start]), self._decode(ids[stop:])
        frame = PromptFrame(lead=before, trail=trail)
        probes = [one]
        if modality == "image":
            two = self._probe(modality, 2)
            (ids2, start2, stop2), (_, start3, _) = two
            between = self._decode(ids2[stop2:start3])
            lead = between[len(trail):] if between.startswith(trail) else None
            start_one = _strip_suffix(before, lead)
            start_two = _strip_suffix(self._decode(ids2[:start2]), lead)
            if lead is None or start_one is None or start_two is None:
                raise self._frame_error(modality)
            frame = PromptFrame(lead=lead, trail=trail, start=start_one,
                                start_per_item=bool(start_one) and start_two == start_one * 2)
            probes.append(two)
        frame = PromptFrame(frame.lead, frame.trail, frame.start, frame.start_per_item,
                            self._own_wrappers(modality, ids[start:stop]))
        for probe in probes:
            self._check_frame(modality, frame, probe)
        return frame

    def _probe(self, modality: str, count: int) -> list[tuple[list[int], int, int]]:
        hf_kwargs = resolve_hf_kwargs(self.info.hf_processor, self.info.config.mm_processor_kwargs)
        if modality == "video":  # one video per call, as every video is processed
            videos = self.info.parse_mm_data({"video": [_probe_video(self.info.hf_processor)]}, validate=False)
            return self._expansions("video", videos["video"], self._call_on_video(videos["video"].get(0), hf_kwargs),
                                    hf_kwargs)
        data: list[Any] = (
            [Image.new("RGB", (PROBE_IMAGE_SIZE, PROBE_IMAGE_SIZE), (255, 255, 255))] * count if modality == "image"
            else [np.zeros(int(self.info.get_target_sample_rate() or 16000), dtype=np.float32)] * count
        )
        items = self.info.parse_mm_data({modality: data}, validate=False)[modality]
        return self._expansions(modality, items, self._call_on_dummy_text(modality, data, hf_kwargs), hf_kwargs)

    def _own_wrappers(self, modality: str, core: list[int]) -> tuple[int, int] | None:
        begin, end = self.info.wrapper_ids(modality)
        placeholder = self.info.placeholder_ids(modality)
        if core[0] in begin and core[-1] in end and core[0] not in placeholder and core[-1] not in placeholder:
            return core[0], core[-1]
        return None

    def _check_frame(self, modality: str, frame: PromptFrame, probe: list[tuple[list[int], int, int]]) -> None:
        """The frame and the located expansions must give back HF's ids for the probe."""
        placeholder = self.info.placeholder(modality)
        samples = ([(probe[0][0], [ids[a:b] for ids, a, b in probe])] if modality == "image"
                   else [(ids, [ids[a:b]]) for ids, a, b in probe])
        for ids, cores in samples:
            text = frame.rewrite(placeholder * len(cores), placeholder, len(cores))
            framed = list(self.info.tokenizer.encode(text, add_special_tokens=False))
            rebuilt: list[int] = []
            prev = 0
            for (start, stop), core in zip(iter_token_matches(framed, self.info.placeholder_ids(modality)), cores):
                rebuilt += framed[prev:start] + core
                prev = stop
            if rebuilt + framed[prev:] != ids:
                raise self._frame_error(modality)

    def _frame_error(self, modality: str) -> UnsupportedModelError:
        return UnsupportedModelError(
            f"The Legacy transformers backend cannot reproduce how {type(self.info.hf_processor).__name__} rewrites "
            f"the text around its {modality} placeholder (it is neither text on either side of each expansion nor text "
            "at the start of the prompt), so it cannot place items apart from their prompt. Use transformers >= 5.15 "
            "(Offsets backend) if the processor reports text_replacement_offsets there."
        )


def _probe_video(hf_processor: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """White frames, one temporal patch of them, with the metadata a 2 fps clip of them has."""
    frames = int(getattr(hf_processor.video_processor, "temporal_patch_size", None) or 2)
    metadata = {"total_num_frames": frames, "fps": 2.0, "duration": frames / 2.0, "video_backend": "opencv",
                "frames_indices": list(range(frames)), "do_sample_frames": False}
    return np.full((frames, PROBE_IMAGE_SIZE, PROBE_IMAGE_SIZE, 3), 255, dtype=np.uint8), metadata


def _strip_suffix(text: str, suffix: str | None) -> str | None:
    if suffix is None or not text.endswith(suffix):
        return None
    return text[:len(text) - len(suffix)] if suffix else text
