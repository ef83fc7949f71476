"""Qwen2.5-Omni: served by the transformers backend's HF call; what vLLM 0.33's native
``Qwen2_5OmniThinkerForConditionalGeneration`` reads is declared here.

vLLM's ``Qwen2_5OmniThinkerMultiModalProcessor``: images and videos as Qwen2.5-VL's (patch rows flat
by grid, grids batched on the CPU, a video's ``second_per_grid_ts``; the engine does not normalise),
each video with the request's ``use_audio_in_video`` flag (shared); a clip's mel frames trimmed to
its own length and concatenated along time (``input_audio_features``, flat along dim 1 by
``audio_feature_lengths``), with its ``feature_attention_mask``, both batched on the CPU. Every
replacement is embedding tokens alone (no ``is_embed`` mask).

:func:`omni_audio_outputs` is vLLM's audio post-processing for every processor built on this one
(Qwen3-Omni's, Qwen3-ASR's): it renames and trims the clips' features whatever the HF mask is called.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.qwen2_vl import qwen2_vl_fields
from mmfront.models.spec import ModelSpec
from mmfront.parse import MultiModalDataItems
from mmfront.processing.native import UNTRUNCATED_KWARGS, NativeInputs

__all__ = [
    "QWEN2_5_OMNI",
    "QWEN2_5_OMNI_NATIVE",
    "USE_AUDIO_IN_VIDEO_UNPROVEN",
    "omni_audio_fields",
    "omni_audio_outputs",
    "qwen2_5_omni_fields",
    "qwen2_5_omni_outputs",
]


USE_AUDIO_IN_VIDEO_UNPROVEN = (
    "vLLM's native processor then interleaves each video's audio track into the video's placeholder (one range per "
    "video holding both, the audio's and the video's tokens told apart by their is_embed masks), which mmfront does "
    "not yet build")
"""Why ``use_audio_in_video`` is refused while the native class runs (every Omni processor of vLLM's)."""


def _clips(value: Any) -> Iterator[torch.Tensor]:
    """One clip at a time from an HF batch ``[clips, ...]``, or from the list of batches of one that
    the transformers backend makes of clips it processes apart."""
    for batch in value if isinstance(value, list) else [value]:
        yield from batch


def omni_audio_outputs(hf_out: Mapping[str, Any], mask_key: str) -> dict[str, Any]:
    """vLLM's Omni audio post-processing (``_postprocess_hf_mm_data``): each clip's ``input_features``
    ``[mel, frames]`` kept where its HF mask (``mask_key``) is set, the clips concatenated along time
    as ``input_audio_features``; the masks, one per clip, as ``feature_attention_mask``; their sums as
    ``audio_feature_lengths``. Each clip's features and mask are those of its own HF batch, so what
    an item carries does not depend on what it was processed with where HF pads every clip alike
    (Qwen2.5-Omni: 30 s) or where clips are processed apart (Qwen3-ASR)."""
    if "input_features" not in hf_out:
        return dict(hf_out)
    out = {k: v for k, v in hf_out.items() if k not in ("input_features", mask_key)}
    masks = list(_clips(hf_out[mask_key]))
    features = list(_clips(hf_out["input_features"]))
    out["input_audio_features"] = torch.cat([f[:, m.bool()] for f, m in zip(features, masks, strict=True)], dim=1)
    out["feature_attention_mask"] = masks
    out["audio_feature_lengths"] = torch.stack([m.sum() for m in masks])
    return out


def omni_audio_fields(hf_out: Mapping[str, Any]) -> dict[str, MultiModalFieldConfig]:
    """vLLM's Omni audio fields: a clip's frames flat along time by its length, its mask and length
    batched on the CPU."""
    lengths = hf_out.get("audio_feature_lengths", torch.empty((0,), dtype=torch.long)).flatten()
    return {"input_audio_features": MultiModalFieldConfig.flat_from_sizes("audio", lengths, dim=1),
            "feature_attention_mask": MultiModalFieldConfig.batched("audio", keep_on_cpu=True),
            "audio_feature_lengths": MultiModalFieldConfig.batched("audio", keep_on_cpu=True)}


def qwen2_5_omni_outputs(hf_out: dict[str, Any], hf_processor: Any, mm_items: MultiModalDataItems,
                         hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``_postprocess_hf_mm_data``: the audio keys (:func:`omni_audio_outputs`), a video's
    ``video_second_per_grid`` as ``second_per_grid_ts``, and the call's ``use_audio_in_video`` flag
    with the videos."""
    out = omni_audio_outputs(hf_out, "feature_attention_mask")
    if "video_second_per_grid" in out:
        out["second_per_grid_ts"] = out.pop("video_second_per_grid")
    if "video_grid_thw" in out:
        out["use_audio_in_video"] = torch.tensor(bool(hf_kwargs.get("use_audio_in_video", False)))
    return out


def qwen2_5_omni_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's ``create_qwen2_5_omni_thinker_field_factory``: Qwen2-VL's image and video fields
    (without Qwen3-VL's ``timestamps``), a video's ``second_per_grid_ts`` and the shared
    ``use_audio_in_video`` flag, and the Omni audio fields."""
    vision = {k: v for k, v in qwen2_vl_fields(hf_out, hf_processor).items() if k != "timestamps"}
    videos = len(hf_out.get("video_grid_thw", ()))
    return {**vision, **omni_audio_fields(hf_out),
            "second_per_grid_ts": MultiModalFieldConfig.batched("video", keep_on_cpu=True),
            "use_audio_in_video": MultiModalFieldConfig.shared("video", videos, keep_on_cpu=True)}


QWEN2_5_OMNI_NATIVE = NativeInputs(
    ("Qwen2_5OmniForConditionalGeneration", "Qwen2_5OmniModel"), qwen2_5_omni_fields, outputs=qwen2_5_omni_outputs,
    whole_range_embeds=True, hf_defaults=UNTRUNCATED_KWARGS, unproven_kwargs={"use_audio_in_video": USE_AUDIO_IN_VIDEO_UNPROVEN},
    legacy_mismatch="it is not proven there: under transformers < 5.15 it cannot locate two adjacent images in HF's "
                    "expansion of its probe (one run of image tokens, no per-item counts), so it builds no Qwen2.5-Omni "
                    "processor")

QWEN2_5_OMNI = register_model(ModelSpec(model_type="qwen2_5_omni", hf_processor_class="Qwen2_5OmniProcessor",
                                        native=QWEN2_5_OMNI_NATIVE))
