"""What both transformers-backend processors share: reading the HF processor, calling it, and
splitting its outputs into one kwargs item per multimodal item.

The backend serves any HF processor mmfront has no native processor for, so nothing here knows a
model by name: where a model's text placeholder is not ``{modality}_token``, its model module says
so (``ModelSpec.backend_placeholders``, see :meth:`TransformersProcessingInfo.placeholder`).
Everything is read from the processor: which modalities it has (its sub-processors), which key
belongs to which modality (each modality's items go to HF in a call of their own), and how many
data rows each item owns (``image_grid_thw``, ``_get_num_multimodal_tokens`` or the replacement text).

An item's data must not depend on the other items of its request, or a cached item would differ
from the same item processed alone. Two HF behaviours break that and are undone here: a batch of
images padded to its largest image (Emu3; each is cropped back to its ``image_sizes``), and audio
padded to the longest audio of the call (each audio is then processed alone).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from functools import cached_property
from typing import Any

import torch
import transformers
from packaging.version import Version
from transformers import ProcessorMixin

from mmfront.errors import FieldConfigError, InputTypeError, ProcessorError, UnsupportedModelError, ValidationError
from mmfront.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from mmfront.models.catalog import (
    backend_placeholder_attr,
    call_kwargs,
    image_expansions,
    image_patches,
    prompt_layout,
    prompt_outputs,
    video_needs_metadata,
)
from mmfront.models.transformers.layout import (
    LAYOUT_KEY,
    ModalityLayout,
    OutputLayout,
    drop_prompt_outputs,
    drop_tile_padding,
    field_config,
    found_rows,
    main_key,
    merge_item_outputs,
    row_count,
    split_text_outputs,
    unpad_images,
)
from mmfront.parse import (
    AudioProcessorItems,
    EmbeddingItems,
    ImageProcessorItems,
    ImageSize,
    MultiModalDataItems,
    VideoProcessorItems,
)
from mmfront.processing.hf import SCOPES, MergedHfKwargs, call_hf, resolve_hf_kwargs
from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo
from mmfront.processing.updates import PromptReplacement, PromptUpdate, PromptUpdateDetails

MM_TOKEN_TYPE = {"image": 1, "video": 2, "audio": 3}
"""The values ``mm_token_type_ids`` marks each modality's tokens with."""

PROBE_IMAGE_SIZE = 64
"""Edge of the dummy images a processor is probed with (every tested image processor takes it)."""

MAX_DUMMY_SIDE = 10_000
"""vLLM 0.33's last dummy image candidate: arbitrarily large, bounded only by the processor's own
resizing (tiling processors reach their most tokens only there)."""

MIN_DUMMY_SIDE = 224
"""Below this vLLM 0.33 stops halving a dummy image (tiny inputs trip processors' channel-axis
inference)."""

TRANSFORMERS_VERSION = Version(transformers.__version__)
VIDEO_MIN_VERSION = Version("5.18.0")
"""From this version the transformers backend serves video, as vLLM 0.33's does (its gate): video
processors report their replacements and count their tokens there."""

_SUBPROCESSORS = {"image": ("image_processor",), "audio": ("feature_extractor", "audio_processor"),
                  "video": ("video_processor",)}
_HF_DATA_ARG = {"image": "images", "audio": "audio", "video": "videos"}
_WRAPPER_ATTRS = {
    "image": (("boi_token", "image_start_token", "fake_image_token"),
              ("eoi_token", "image_end_token", "fake_image_token")),
    "audio": (("audio_bos_token", "audio_start_token"), ("audio_eos_token", "audio_end_token")),
    "video": (("video_start_token",), ("video_end_token",)),
}
_STRUCTURE_ATTRS = ("global_image_tag", "image_wrapper_token")


class TransformersProcessingInfo(BaseProcessingInfo):
    """What the backend reads from an HF processor it has no native knowledge of."""

    @cached_property
    def modalities(self) -> tuple[str, ...]:
        """The modalities this processor can place: a sub-processor for the data and a text
        placeholder for the prompt. Video only from transformers 5.18 (:data:`VIDEO_MIN_VERSION`)
        and where the processor counts video tokens, as in vLLM 0.33."""
        proc = self.hf_processor
        found, present = [], []
        for modality, attrs in _SUBPROCESSORS.items():
            if not any(getattr(proc, a, None) is not None for a in attrs):
                continue
            present.append(modality)
            if modality == "video" and not self.serves_video:
                continue
            if self.native is not None and modality in self.native.unproven:
                continue
            if self.native is not None and not self.native.takes(modality):
                continue
            if not isinstance(getattr(proc, f"{modality}_token", None), str):
                raise UnsupportedModelError(
                    f"{type(proc).__name__} has a {modality} sub-processor but no `{modality}_token` text "
                    f"placeholder, so the transformers backend cannot place {modality} items in a prompt. It is "
                    "not a chat-style multimodal processor mmfront can serve."
                )
            found.append(modality)
        reasons = [self.why_unsupported(m) for m in present if m not in found]
        if not found and any(reasons):
            raise UnsupportedModelError(f"{type(proc).__name__}: none of its modalities can be served here. "
                                        + " ".join(r for r in reasons if r))
        if not found:
            raise UnsupportedModelError(
                f"{type(proc).__name__} exposes no image processor or audio feature extractor, so the "
                "transformers backend has nothing to process."
            )
        return tuple(found)

    @cached_property
    def serves_video(self) -> bool:
        """Video is placed where vLLM's transformers backend places it: transformers >= 5.18, a
        ``video_token`` and a processor that counts a video's tokens."""
        proc = self.hf_processor
        if TRANSFORMERS_VERSION < VIDEO_MIN_VERSION or not isinstance(getattr(proc, "video_token", None), str):
            return False
        if self.native is not None and self.native.mm_limits is not None and "video" in self.native.mm_limits:
            return True  # vLLM's native processor counts a video's tokens itself
        frames = getattr(proc.video_processor, "temporal_patch_size", 1)
        try:
            counted = proc._get_num_multimodal_tokens(video_sizes=[(frames, 224, 224)])
        except (AttributeError, NotImplementedError, TypeError, ValueError, KeyError):
            return False
        return getattr(counted, "num_video_tokens", None) is not None

    def why_unsupported(self, modality: str) -> str:
        if self.native is not None and modality in self.native.unproven:
            return self.native.unproven[modality]
        if self.native is not None and not self.native.takes(modality):
            return self.native.why_limited(modality)
        proc = self.hf_processor
        if modality != "video" or getattr(proc, "video_processor", None) is None:
            return ""
        name = type(proc).__name__
        if TRANSFORMERS_VERSION < VIDEO_MIN_VERSION:
            return (f"{name} has a video processor, but the transformers backend places videos from transformers "
                    f"{VIDEO_MIN_VERSION} on (vLLM 0.33's gate too); upgrade transformers.")
        return (f"{name} has a video processor, but it does not count a video's tokens "
                "(`_get_num_multimodal_tokens(video_sizes=...)`), which the transformers backend needs to place a "
                "video, as vLLM 0.33's does. Send the frames as images, or serve the model with a native processor.")

    @cached_property
    def video_needs_metadata(self) -> bool:
        """The HF video processor samples frames itself by default (vLLM's transformers backend
        rule), or the model's module says its processor reads the metadata (Qwen2.5-VL's
        ``second_per_grid_ts``, as vLLM's own Qwen2.5-VL processor passes it)."""
        proc = self.hf_processor
        if "video" not in self.modalities:
            return False
        return bool(getattr(proc.video_processor, "do_sample_frames", False)) or video_needs_metadata(type(proc))

    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        """Unlimited, as vLLM's transformers backend; where the native class runs, its limits."""
        limits = self.native.mm_limits if self.native is not None and self.native.mm_limits is not None else {}
        return {m: limits[m].count if m in limits else None for m in self.modalities}

    def why_limited(self, modality: str) -> str:
        return self.native.why_limited(modality) if self.native is not None else ""

    @property
    def places_items_itself(self) -> bool:
        """vLLM's native class places the items where the prompt names none (``NativeInputs.prompt_updates``)."""
        return self.native is not None and self.native.prompt_updates is not None

    def subprocessor(self, modality: str) -> Any:
        proc = self.hf_processor
        return next(getattr(proc, a) for a in _SUBPROCESSORS[modality] if getattr(proc, a, None) is not None)

    def placeholder(self, modality: str) -> str:
        """The text placeholder of ``modality``: the processor's ``{modality}_token``, or the
        attribute its model module names (Gemma 3's ``boi_token``, since transformers < 5.15
        names the soft token ``processor.image_token``), or, while vLLM's native class runs, the
        text its processor replaces (``NativeInputs.placeholders``)."""
        key = (modality, id(self.hf_processor), id(self.native))
        found = self._placeholders.get(key)
        if found is None:
            found = self._placeholders[key] = self._find_placeholder(modality)
        return found

    @cached_property
    def _placeholders(self) -> dict[tuple[str, int, int], str]:
        """:meth:`placeholder`'s answers, read once per processor and native class: every chat
        request asks for each item's (the model specs' lookup walks every model module)."""
        return {}

    def _find_placeholder(self, modality: str) -> str:
        proc = self.hf_processor
        if self.native is not None and modality in self.native.placeholders:
            return "".join(str(getattr(proc, attr)) for attr in self.native.placeholders[modality])
        attr = backend_placeholder_attr(type(proc), modality)
        if attr is not None and isinstance(getattr(proc, attr, None), str):
            return str(getattr(proc, attr))
        return str(getattr(proc, f"{modality}_token"))

    def placeholder_ids(self, modality: str) -> list[int]:
        return self.encode(self.placeholder(modality))

    def embed_token_ids(self, modality: str) -> list[int]:
        """Token ids that receive embeddings, as the processor's ``mm_token_type_ids`` counts them
        (``image_token_ids`` where defined: Gemma3's soft token, not its placeholder)."""
        proc = self.hf_processor
        ids = getattr(proc, f"{modality}_token_ids", None)
        ids = [i for i in ids if i is not None] if isinstance(ids, (list, tuple)) else None
        if ids:
            return [int(i) for i in ids]
        token_id = getattr(proc, f"{modality}_token_id", None)
        if isinstance(token_id, int):
            return [token_id]
        return [int(self.tokenizer.convert_tokens_to_ids(getattr(proc, f"{modality}_token")))]

    def _token_attr(self, name: str) -> str | None:
        for owner in (self.hf_processor, self.tokenizer):
            value = getattr(owner, name, None)
            if isinstance(value, str) and value:
                return value
        return None

    def wrapper_ids(self, modality: str) -> tuple[frozenset[int], frozenset[int]]:
        """Token ids that open and close an item's expansion (``<start_of_image>``/``<end_of_image>``)."""
        begin_attrs, end_attrs = _WRAPPER_ATTRS[modality]
        tok = self.tokenizer

        def ids(attrs: Sequence[str]) -> frozenset[int]:
            out = set()
            for attr in attrs:
                token = self._token_attr(attr)
                if token is not None:
                    out.add(int(tok.convert_tokens_to_ids(token)))
            return frozenset(out)

        return ids(begin_attrs), ids(end_attrs)

    def mm_special_tokens(self) -> set[str]:
        return set(self._mm_special_tokens)

    @cached_property
    def _mm_special_tokens(self) -> frozenset[str]:
        """Read once: every chat request asks for them (twice), and they never change."""
        tok = self.tokenizer
        out: set[str] = set()
        for modality in self.modalities:
            out.add(self.placeholder(modality))
            out.update(str(t) for t in tok.convert_ids_to_tokens(self.embed_token_ids(modality)))
            for attrs in _WRAPPER_ATTRS[modality]:
                out.update(t for t in (self._token_attr(a) for a in attrs) if t is not None)
        out.update(t for t in (self._token_attr(a) for a in _STRUCTURE_ATTRS) if t is not None)
        return frozenset(out)


class _MultiModalProcessorBase(BaseMultiModalProcessor):
    """Calls the HF processor on a dummy text (one placeholder per item) and lays out its outputs.

    Subclasses decide how each item's expansion is learned: from the replacements HF reports
    (Offsets) or located in HF's token ids for the dummy text (Legacy).
    """

    info: TransformersProcessingInfo

    def __init__(self, info: BaseProcessingInfo) -> None:
        if not isinstance(info, TransformersProcessingInfo):
            raise InputTypeError(
                f"{type(self).__name__} needs a TransformersProcessingInfo, got {type(info).__name__}; build it with "
                "TransformersProcessingInfo(hf_processor, model_id=...)."
            )
        super().__init__(info)
        self.modalities = info.modalities
        proc = info.hf_processor
        self.image_expansions = image_expansions(type(proc)) if calls_like_mixin(proc) else None
        """Where set, images skip HF's ``__call__``: the image processor runs on its own, each image's
        expansion comes from its outputs (``ModelSpec.image_expansions``)."""
        self.reads_pixels = self.image_expansions is not None  # call_image_processor hands it pixels
        self.in_place_misses = self.reads_pixels and info.kernel_misses
        self.merged_kwargs = MergedHfKwargs(proc)

    def get_placeholder_str(self, modality: str, index: int) -> str:
        if modality in self.modalities:
            return "" if self.info.places_items_itself else self.info.placeholder(modality)
        return super().get_placeholder_str(modality, index)

    def get_mm_special_tokens(self) -> set[str]:
        return self.info.mm_special_tokens()

    def _tokenize_prompt(
        self, prompt: str | list[int], mm_counts: Mapping[str, int], *, add_special_tokens: bool,
    ) -> list[int]:
        return super()._tokenize_prompt(self.laid_out(prompt, mm_counts), mm_counts,
                                        add_special_tokens=add_special_tokens)

    def laid_out(self, prompt: str | list[int], mm_counts: Mapping[str, int]) -> str | list[int]:
        """A text prompt holding items as the model's HF processor lays it out before tokenizing
        it (``ModelSpec.prompt_layout``); a token-id prompt is taken as it is (its ids came from
        text laid out that way)."""
        layout = prompt_layout(type(self.info.hf_processor))
        if self.info.places_items_itself:  # vLLM's native class lays the prompt out itself
            return prompt
        if layout is not None and isinstance(prompt, str) and any(mm_counts.values()):
            return layout(prompt, self.info.hf_processor)
        return prompt

    # --- calling HF --------------------------------------------------------------------------

    def _dummy_call_kwargs(self) -> dict[str, Any]:
        """Extra kwargs of the dummy-text call: what the subclass needs HF to report about each
        item's expansion (Offsets: ``text_replacement_offsets``; Legacy: the token marks)."""
        return {}

    def call_kwargs(self, modalities: Collection[str], hf_kwargs: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
        """The kwargs of one HF call on items of ``modalities``: ``extra`` adds kwargs (scoped ones
        merge into their scope)."""
        kwargs: dict[str, Any] = dict(hf_kwargs)
        for key, value in extra.items():
            kwargs[key] = {**kwargs.get(key, {}), **value} if key in SCOPES else value
        if "audio" in modalities:
            rate = self.info.get_target_sample_rate()
            if rate is not None:
                kwargs["audio_kwargs"] = {"sampling_rate": int(rate), **kwargs.get("audio_kwargs", {})}
        kwargs["return_tensors"] = "pt"
        rewrite = call_kwargs(type(self.info.hf_processor))
        return kwargs if rewrite is None else rewrite(self.info.hf_processor, kwargs)

    def run_hf(self, text: str | list[str], data: Mapping[str, list[Any]], hf_kwargs: Mapping[str, Any],
               **extra: Any) -> dict[str, Any]:
        """One HF processor call; ``extra`` adds kwargs (scoped ones merge into their scope). Its
        outputs laid out along the (dummy) prompt are dropped here, or refused."""
        kwargs = self.call_kwargs(data, hf_kwargs, **extra)
        proc = self.info.hf_processor
        desc = ", ".join(f"{len(items)} {m}(s)" for m, items in data.items()) or "text only"
        out = dict(call_hf(proc, what=type(proc).__name__, data_desc=desc, text=text,
                           **{_HF_DATA_ARG[m]: items for m, items in data.items()}, **kwargs))
        drop_prompt_outputs(type(proc).__name__, out, prompt_outputs(type(proc)))
        return out

    def _call_hf_processor(self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """Process ``mm_items`` on dummy text: one HF call for the images, and for audio one call
        per audio when their lengths differ (HF pads a batch to its longest audio)."""
        refuse_embeddings(mm_items)
        out: dict[str, Any] = {}
        layout: OutputLayout = {}
        for modality in mm_items:
            items = mm_items[modality]
            if modality == "image":
                outputs, (data, lay) = self._image_outputs(items, hf_kwargs)
            else:
                if modality == "video":
                    videos = mm_items.get_items("video", VideoProcessorItems)
                    outputs = [self._call_on_video(videos.get(i), hf_kwargs) for i in range(videos.get_count())]
                else:
                    clips = self._hf_clips(mm_items.get_items("audio", AudioProcessorItems))
                    groups = [clips] if len({len(c) for c in clips}) == 1 else [[c] for c in clips]
                    outputs = [self._call_on_dummy_text("audio", group, hf_kwargs) for group in groups]
                data, lay = self._lay_out(modality, items, outputs, hf_kwargs)
            self._add_item_sizes(modality, outputs, data, lay)
            self._add_expansions(modality, items, outputs, data=data, layout=lay, hf_kwargs=hf_kwargs)
            for key in data:
                if key in out:
                    raise FieldConfigError(f"{type(self.info.hf_processor).__name__} returned {key!r} for two "
                                           "modalities; the transformers backend cannot attribute it.")
            out.update(data)
            layout[modality] = lay
        out[LAYOUT_KEY] = layout
        return out

    def _hf_clips(self, audios: AudioProcessorItems) -> list[Any]:
        """The clips as HF gets them: as parsed, or as vLLM's native processor hands them to HF
        (``NativeInputs.audio_samples``) while its class runs."""
        clips = list(audios.get_all())
        native = self.info.native
        if native is not None and native.audio_samples is not None:
            clips = [native.audio_samples(clip, self.info.hf_processor) for clip in clips]
        return clips

    def _image_outputs(self, items: Any, hf_kwargs: Mapping[str, Any],
                       ) -> tuple[list[dict[str, Any]], tuple[dict[str, Any], ModalityLayout]]:
        """One HF call for all images, or one per image where that call's rows cannot be told
        apart per image (Llama 4 tiles a large image into ``[tiles, C, H, W]`` and has no per-image
        count to ask) and each image expands alone exactly as beside the others: alone, an image
        owns its call's rows. Where the model's module knows each image's expansion from the image
        processor's outputs (:attr:`image_expansions`), the image processor runs alone instead."""
        if self.image_expansions is not None:
            direct = [self.call_image_processor(items, hf_kwargs)]
            data, lay = self._lay_out("image", items, direct, hf_kwargs)
            lay.expansions = self.image_expansions(self.info.hf_processor, direct[0])
            return direct, (data, lay)
        joint = [self._call_on_dummy_text("image", items.get_all(), hf_kwargs)]
        try:
            return joint, self._lay_out("image", items, joint, hf_kwargs)
        except ProcessorError:
            pixels = joint[0].get("pixel_values")
            if items.get_count() == 1 or not (isinstance(pixels, torch.Tensor) and pixels.ndim == 4):
                raise
            singles = [self._call_on_dummy_text("image", [image], hf_kwargs) for image in items.get_all()]
            if not self.same_expansions(joint[0], singles, items.get_count()):
                raise
        return singles, self._lay_out("image", items, singles, hf_kwargs)

    def call_image_processor(self, items: ImageProcessorItems, hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """What HF's ``ProcessorMixin.__call__`` returns for the images of ``items`` on a dummy
        text, less the text's outputs: its image processor's outputs, called with the
        ``images_kwargs`` HF's merge of the same call's kwargs gives (merged once per distinct set:
        :attr:`merged_kwargs`), and without the keys the processor drops (``unused_input_names``).

        A JPEG decoded straight into pixels (:meth:`ImageProcessorItems.get_pixels`) goes as a
        channels-first uint8 tensor view of them, no PIL image made: HF's torchvision backend
        reads that as it reads the PIL RGB image of those pixels (channels inferred first, RGB
        already), unless the call names ``input_data_format``, which it ignores for a PIL image
        only (then the PIL image goes)."""
        proc = self.info.hf_processor
        name = type(proc).__name__
        desc = f"{items.get_count()} image(s)"
        kwargs = self.call_kwargs(("image",), hf_kwargs, **self._dummy_call_kwargs())
        images_kwargs = call_hf(self.merged_kwargs, what=f"{name}'s kwarg merge", data_desc=desc,
                                kwargs=kwargs)["images_kwargs"]
        as_pixels = images_kwargs.get("input_data_format") is None
        images = [torch.from_numpy(pixels).permute(2, 0, 1)
                  if as_pixels and (pixels := items.get_pixels(i)) is not None else items.get(i)
                  for i in range(items.get_count())]
        out = call_hf(proc.image_processor, what=name, data_desc=desc, images=images, **images_kwargs)
        unused = set(getattr(proc, "unused_input_names", None) or ())
        return {key: value for key, value in out.items() if key not in unused}

    def same_expansions(self, joint: Mapping[str, Any], singles: Sequence[Mapping[str, Any]], count: int) -> bool:
        """Whether the images of one call expand as each does alone (no text that numbers them,
        as MiniCPM-V's): only then may they be processed one per call. Unknown here: no."""
        return False

    def _call_on_video(self, video: Any, hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """One video per call: processors stack a call's videos, which fails on (or would pad) clips
        of different lengths, and one video's data must not depend on its neighbours'. The frames
        were sampled when loaded, so HF samples none (``do_sample_frames=False``, unless the
        metadata asks otherwise); the metadata goes along where the processor reads it, as vLLM
        passes it."""
        extra: dict[str, Any] = {**self._dummy_call_kwargs(), "do_sample_frames": False}
        if isinstance(video, tuple):
            video, metadata = video
            native = self.info.native
            if native is None or native.hf_samples_frames:
                extra["do_sample_frames"] = bool(metadata.get("do_sample_frames", False))
            extra["video_metadata"] = [{k: v for k, v in metadata.items() if k != "do_sample_frames"}]
            if native is not None and native.video_outputs is not None:
                out = self.run_hf([self.info.placeholder("video")], {"video": [video]}, hf_kwargs, **extra)
                out.update({k: [v] for k, v in native.video_outputs(metadata, self.info.hf_processor, hf_kwargs).items()})
                return out
        return self.run_hf([self.info.placeholder("video")], {"video": [video]}, hf_kwargs, **extra)

    def _call_on_dummy_text(self, modality: str, items: list[Any], hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        placeholder = self.info.placeholder(modality)
        # Images go in one text sample (several samples pad Idefics3's tiles); audio one per sample
        # (GLM-ASR and AudioFlamingo3 take exactly one audio per text).
        text: str | list[str] = placeholder * len(items) if modality == "image" else [placeholder] * len(items)
        return self.run_hf(text, {modality: items}, hf_kwargs, **self._dummy_call_kwargs())

    def _lay_out(
        self, modality: str, items: Any, outputs: Sequence[Mapping[str, Any]], hf_kwargs: Mapping[str, Any],
    ) -> tuple[dict[str, Any], ModalityLayout]:
        """The data keys of ``outputs`` (one call for all items, or one per item) and their layout."""
        datas = [split_text_outputs(o)[1] for o in outputs]
        if modality == "image":
            for d in datas:
                unpad_images(d)
                drop_tile_padding(d, items.get_count() if len(datas) == 1 else 1)
        if len(datas) == 1:
            data = datas[0]
            rows = self.item_rows(modality, items, data, hf_kwargs, outputs[0])
        else:
            rows = [self.item_rows(modality, items.subset([i]), d, hf_kwargs, o)[0]
                    for i, (d, o) in enumerate(zip(datas, outputs))]
            data = merge_item_outputs(datas, unbatch=modality == "video")
        return data, ModalityLayout(count=items.get_count(), keys=list(data), rows=rows)

    def _add_item_sizes(self, modality: str, outputs: Sequence[Mapping[str, Any]], data: dict[str, Any],
                        layout: ModalityLayout) -> None:
        """Per-item counts the model receives with the data (``num_image_patches``)."""
        if modality in ("image", "video"):
            data[f"num_{modality}_patches"] = torch.tensor(layout.rows)
            layout.size_keys.append(f"num_{modality}_patches")

    def _add_expansions(self, modality: str, items: Any, outputs: Sequence[Mapping[str, Any]], *,
                        data: dict[str, Any], layout: ModalityLayout, hf_kwargs: Mapping[str, Any]) -> None:
        """Record each item's expansion as ``{modality}_replacement_ids`` (sizes in
        ``layout.replacement_sizes``) where it is learned from the dummy call's token ids (Legacy)."""

    def is_consumed_key(self, key: str) -> bool:
        """Each item's recorded expansion (``{modality}_replacement_ids``), taken out by
        :meth:`_replacement_updates`."""
        return key.endswith("_replacement_ids")

    def _replacement_updates(
        self, mm_items: MultiModalDataItems, out_mm_kwargs: MultiModalKwargsItems,
        details: Callable[[str, list[int]], PromptUpdateDetails[list[int]]],
    ) -> list[PromptUpdate]:
        """One replacement of the placeholder per modality; item ``i`` takes its own recorded
        expansion. The ids are taken out of the items: the updates are cached with the item, so
        neither the cache nor the engine needs them as data."""
        updates: list[PromptUpdate] = []
        for modality in mm_items:
            key = f"{modality}_replacement_ids"
            contents: list[PromptUpdateDetails[list[int]]] = []
            for item in out_mm_kwargs[modality]:
                data = item[key].data if item is not None and key in item else None
                if item is None or not isinstance(data, torch.Tensor) or data.is_floating_point():
                    raise FieldConfigError(f"A {modality} item lacks its {key}; it was not processed by this backend.")
                ids = data.tolist()  # Python ints already: a 999-token expansion took 0.2 ms more through int()
                del item[key]
                contents.append(details(modality, ids))
            updates.append(PromptReplacement(modality, target=self.info.placeholder_ids(modality),
                                             replacement=contents.__getitem__))
        return updates

    def item_rows(self, modality: str, items: Any, data: Mapping[str, Any], hf_kwargs: Mapping[str, Any],
                  hf_out: Mapping[str, Any]) -> list[int]:
        """Rows each item owns in one call's outputs, checked against the data."""
        count = items.get_count()
        key = main_key(modality, data)
        if modality == "image":
            rows = self.image_rows(items, data, hf_kwargs, hf_out)
        elif modality == "video":
            grid = data.get("video_grid_thw")
            rows = [int(x) for x in grid.prod(-1).tolist()] if isinstance(grid, torch.Tensor) else [1] * count
        else:
            total = row_count(data[key]) if key is not None else count
            if total % count:
                raise ProcessorError(
                    f"{type(self.info.hf_processor).__name__} returned {total} {modality} feature rows for {count} "
                    f"{modality}(s) of equal length; the transformers backend cannot split them per item."
                )
            rows = [total // count] * count
        if key is not None:
            self.check_rows(modality, key, data[key], rows)
        return rows

    def image_rows(self, images: ImageProcessorItems, data: Mapping[str, Any], hf_kwargs: Mapping[str, Any],
                   hf_out: Mapping[str, Any]) -> list[int]:
        """Rows (tiles, crops, patches) per image: ``image_grid_thw``, else the processor's
        ``num_image_patches``, else one."""
        count = images.get_count()
        grid = data.get("image_grid_thw")
        if isinstance(grid, torch.Tensor) and grid.ndim == 2 and grid.shape[0] == count:
            return [int(x) for x in grid.prod(-1).tolist()]
        sizes = [images.get_image_size(i) for i in range(count)]
        query = self.query_mm_tokens(hf_kwargs, image_sizes=[(s.height, s.width) for s in sizes])
        patches = getattr(query, "num_image_patches", None)
        key = main_key("image", data)
        if query is None and key is not None and found_rows(data[key], count) != count:
            patches = self.image_processor_patches(hf_kwargs, sizes)
        rows = [1] * count
        if isinstance(patches, (list, tuple)) and len(patches) == count:
            # Idefics3 and SmolVLM report 0 for an image they do not split; that image still has one tile.
            rows = [max(1, int(p)) for p in patches]
        value = data.get(key) if key is not None else None
        if count == 1 and isinstance(value, torch.Tensor) and value.ndim == 4 and value.shape[0] != rows[0]:
            return [int(value.shape[0])]  # alone, an image owns every tile ``[tiles, C, H, W]`` of its call
        return rows

    def image_processor_patches(self, hf_kwargs: Mapping[str, Any], sizes: Sequence[ImageSize]) -> list[int] | None:
        """Patches per image from ``image_processor.get_number_of_image_patches``, for processors
        with no ``_get_num_multimodal_tokens`` to ask whose data has more rows than images (SmolVLM's
        tiles), else from the model module's count (``ModelSpec.image_patches``: LFM2-VL); None
        where both are missing. Only then: elsewhere (Step3p7) it counts other rows."""
        images_kwargs = dict(hf_kwargs.get("images_kwargs") or {})
        proc = self.info.hf_processor
        method = getattr(getattr(proc, "image_processor", None), "get_number_of_image_patches", None)
        if method is None:
            tiles = image_patches(type(proc))
            return None if tiles is None else [tiles(proc, s.height, s.width, images_kwargs) for s in sizes]
        try:
            counts = [method(s.height, s.width, images_kwargs) for s in sizes]
        except (AttributeError, NotImplementedError, TypeError, ValueError, KeyError):
            return None
        # SmolVLM's answers (patches, rows, cols); others answer the count alone.
        return [int(c[0]) if isinstance(c, tuple) else int(c) for c in counts]

    def get_dummy_image_size(self) -> tuple[int, int]:
        """vLLM 0.33's transformers backend rule: of the sizes the image processor's ``size``
        names and :data:`MAX_DUMMY_SIDE`, the first the HF processor counts the most image tokens
        for, halved while that count holds. The generic rule reads ``longest_edge`` as an edge, but
        Qwen2-VL and GLM keep their pixel budget there: Qwen2.5-VL's 12845056 made a dummy image of
        12845056 x 12845056 pixels, which killed ``mmfront serve`` at start. Processors that cannot
        count keep the generic rule."""
        hf_kwargs = resolve_hf_kwargs(self.info.hf_processor, self.info.config.mm_processor_kwargs)

        def count(size: ImageSize) -> int | None:
            query = self.query_mm_tokens(hf_kwargs, image_sizes=[(size.height, size.width)])
            tokens = getattr(query, "num_image_tokens", None)
            return int(tokens[0]) if isinstance(tokens, (list, tuple)) and len(tokens) == 1 else None

        image_processor = getattr(self.info.hf_processor, "image_processor", None)
        sizes = [*size_candidates(image_processor), ImageSize(MAX_DUMMY_SIDE, MAX_DUMMY_SIDE)]
        counts = [count(size) for size in sizes]
        if None in counts:
            return super().get_dummy_image_size()
        most = max(c for c in counts if c is not None)
        size = sizes[counts.index(most)]
        while min(size) // 2 >= MIN_DUMMY_SIDE:
            smaller = ImageSize(size.width // 2, size.height // 2)
            if (count(smaller) or 0) < most:
                break
            size = smaller
        return size.width, size.height

    def query_mm_tokens(self, hf_kwargs: Mapping[str, Any], **sizes: Any) -> Any:
        """``hf_processor._get_num_multimodal_tokens(...)``, or None where it is missing or fails.

        It is optional: what it says is checked against the data (or the located tokens) by the
        callers. Idefics3 on transformers < 5.15 writes its kwargs into the class-wide defaults,
        so those are snapshotted and restored around the call.
        """
        proc = self.info.hf_processor
        method = getattr(proc, "_get_num_multimodal_tokens", None)
        if method is None:
            return None
        kwargs_cls = getattr(type(proc), "valid_processor_kwargs", None)
        defaults = getattr(kwargs_cls, "_defaults", None)
        snapshot = copy.deepcopy(defaults) if isinstance(defaults, dict) else None
        try:
            return method(**sizes, **dict(hf_kwargs.get("images_kwargs") or {}))
        except (AttributeError, NotImplementedError, TypeError, ValueError, KeyError):
            return None
        finally:
            if snapshot is not None and isinstance(defaults, dict):
                defaults.clear()
                defaults.update(snapshot)

    def check_rows(self, modality: str, key: str, value: Any, rows: Sequence[int]) -> None:
        """The per-item row counts must cover ``value`` exactly (a list holds one entry per item)."""
        total = sum(rows)
        found = found_rows(value, total)
        expected = len(rows) if isinstance(value, list) else total
        if found != expected:
            raise ProcessorError(
                f"{type(self.info.hf_processor).__name__} returned {found} rows of {key!r} but its per-item counts "
                f"say {list(rows)} (total {expected}); the transformers backend cannot split {modality} data per item. "
                "Known case: Gemma3 with do_pan_and_scan on transformers < 5.15 (upgrade transformers, or turn "
                "do_pan_and_scan off)."
            )

    # --- laying out outputs ----------------------------------------------------------------

    def _get_mm_fields_config(
        self, hf_inputs: Mapping[str, Any], hf_kwargs: Mapping[str, Any],
    ) -> Mapping[str, MultiModalFieldConfig]:
        layout: OutputLayout = hf_inputs[LAYOUT_KEY]
        config: dict[str, MultiModalFieldConfig] = {}
        for modality, lay in layout.items():
            for key in lay.keys:
                try:
                    config[key] = field_config(modality, key, hf_inputs[key], lay)
                except FieldConfigError as exc:
                    raise FieldConfigError(
                        f"{type(self.info.hf_processor).__name__} cannot be served by the transformers backend: {exc} "
                        "A native processor can lay its outputs out (`@register_processor`, see "
                        "docs/processing.md).") from None
            for key in lay.size_keys:
                config[key] = MultiModalFieldConfig.batched(modality, keep_on_cpu=True)
            if lay.replacement_sizes is not None:
                config[f"{modality}_replacement_ids"] = MultiModalFieldConfig.flat_from_sizes(
                    modality, torch.tensor(lay.replacement_sizes), keep_on_cpu=True)
        return config


def calls_like_mixin(hf_processor: Any) -> bool:
    """Whether the processor's call is ``ProcessorMixin``'s own: the image processor on the images,
    one ``replace_image_token`` per image, then the tokenizer (transformers rewrote Qwen2-VL's and
    others' so from 5.14). Only then may the image processor run without it."""
    cls = type(hf_processor)
    return (cls.__call__ is ProcessorMixin.__call__
            and getattr(cls, "_process_images", None) is getattr(ProcessorMixin, "_process_images", object()))


def size_candidates(subprocessor: Any) -> list[ImageSize]:
    """Dummy sizes read off a sub-processor's ``size``, as vLLM 0.33 reads them: an exact
    ``height``/``width`` (or ``max_height``/``max_width``), else ``max_pixels`` or ``longest_edge``
    as an area budget (a square of that many pixels); ``shortest_edge`` bounds only the small
    side, so it names none."""
    size = getattr(subprocessor, "size", None)

    def read(name: str) -> Any:
        value = size.get(name) if isinstance(size, Mapping) else getattr(size, name, None)
        return value if isinstance(value, int) and value > 0 else None

    height, width = read("height") or read("max_height"), read("width") or read("max_width")
    if height and width:
        return [ImageSize(width, height)]
    area = read("max_pixels") or read("longest_edge")
    side = math.isqrt(area) if area else 0
    return [ImageSize(side, side)] if side else []


def refuse_embeddings(mm_items: MultiModalDataItems) -> None:
    for modality, items in mm_items.items():
        if isinstance(items, EmbeddingItems):
            raise ValidationError(
                f"The transformers backend cannot place precomputed {modality} embeddings: it learns each item's "
                "expansion from the HF processor, which needs the media. Send the media instead.",
                parameter=modality,
            )
