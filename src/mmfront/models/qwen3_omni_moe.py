"""Qwen3-Omni: served by the transformers backend's HF call; what vLLM 0.33's native
``Qwen3OmniMoeThinkerForConditionalGeneration`` reads is declared here.

vLLM's ``Qwen3OmniMoeThinkerMultiModalProcessor`` (built on Qwen2.5-Omni's): images and videos as
Qwen2.5-VL's (patch rows flat by grid, grids batched on the CPU, a video's ``second_per_grid_ts``;
the engine does not normalise), each video with the request's ``use_audio_in_video`` flag (shared).
A clip is zero-padded to whole hops of the feature extractor before HF sees it; its mel frames
(where HF's mask is set) go flat along time as ``input_audio_features``, with a
``feature_attention_mask`` of ones over its frames (float32, as vLLM makes it after its dtype cast)
and its frame count ``audio_feature_lengths``, both batched on the CPU. Every replacement is
embedding tokens alone (no ``is_embed`` mask).

Each clip is processed alone or beside clips of its length (the transformers backend's rule), so
what an item carries does not depend on its neighbours. vLLM processes a request's clips in one HF
call, which pads them to the longest; the padding changes the last frames of a shorter clip
(Whisper's window reaches past its end), so there a clip's bytes depend on what it was sent with.
The parity test proves each of mmfront's clips equal to vLLM's clip sent alone.

The audio half repeats what the Qwen2.5-Omni module (another branch) declares for the same
post-processing; the two may share it once merged.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.qwen2_vl import qwen2_vl_fields
from mmfront.models.spec import ModelSpec
from mmfront.parse import AudioProcessorItems, MultiModalDataItems
from mmfront.processing.native import NativeInputs

__all__ = [
    "QWEN3_OMNI_MOE",
    "QWEN3_OMNI_MOE_NATIVE",
    "pad_to_hops",
    "qwen3_omni_fields",
    "qwen3_omni_outputs",
]

AUDIO_IN_VIDEO = ("vLLM's processor interleaves each video's audio track (an audio item per video) with its frames in one "
                  "range, which mmfront does not place; send the audio as its own item")
"""Why a request asking for a video's audio track is refused while vLLM's native class runs."""


def pad_to_hops(samples: Any, hf_processor: Any) -> Any:
    """vLLM's ``_get_hf_mm_inputs``: a clip zero-padded to a whole number of the feature extractor's
    hops (so its frames are the same whatever HF pads it to)."""
    hop = int(hf_processor.feature_extractor.hop_length)
    extra = -len(samples) % hop
    return np.pad(samples, (0, extra)) if extra else samples


def _clips(value: Any) -> Iterator[torch.Tensor]:
    """One clip at a time from an HF batch ``[clips, ...]``, or from the list of batches the
    transformers backend makes of clips it processes apart."""
    for batch in value if isinstance(value, list) else [value]:
        yield from batch


def _frames(mm_items: MultiModalDataItems, hf_processor: Any, hf_kwargs: Mapping[str, Any]) -> list[int]:
    """vLLM's frame count of each clip: its padded samples in hops, at most 30 s' worth when the
    request truncates."""
    extractor = hf_processor.feature_extractor
    hop = int(extractor.hop_length)
    audios = mm_items.get_items("audio", AudioProcessorItems)
    frames = [math.ceil(audios.get_audio_length(i) / hop) for i in range(audios.get_count())]
    if hf_kwargs.get("truncation", False):
        frames = [min(n, int(extractor.n_samples) // hop) for n in frames]
    return frames


def qwen3_omni_outputs(hf_out: dict[str, Any], hf_processor: Any, mm_items: MultiModalDataItems,
                       hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``_postprocess_hf_mm_data`` (Qwen2.5-Omni's, then Qwen3-Omni's): each clip's
    ``input_features`` kept where HF's mask is set, concatenated along time; the masks replaced by
    ones over each clip's frames, their counts as ``audio_feature_lengths``; a video's
    ``video_second_per_grid`` as ``second_per_grid_ts``, with the call's ``use_audio_in_video``
    (false: a request setting it is refused, :data:`AUDIO_IN_VIDEO`)."""
    out = {k: v for k, v in hf_out.items() if k not in ("input_features", "feature_attention_mask")}
    if "input_features" in hf_out:
        masks = list(_clips(hf_out["feature_attention_mask"]))
        features = list(_clips(hf_out["input_features"]))
        out["input_audio_features"] = torch.cat(
            [f[:, m.bool()] for f, m in zip(features, masks, strict=True)], dim=1)
        frames = _frames(mm_items, hf_processor, hf_kwargs)
        out["feature_attention_mask"] = [torch.ones(n) for n in frames]
        out["audio_feature_lengths"] = torch.tensor(frames)
    if "video_second_per_grid" in out:
        out["second_per_grid_ts"] = out.pop("video_second_per_grid")
    if "video_grid_thw" in out:
        out["use_audio_in_video"] = torch.tensor(False)
    return out


def qwen3_omni_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's ``create_qwen2_5_omni_thinker_field_factory``: Qwen2-VL's image and video fields, a
    video's ``second_per_grid_ts`` and the shared ``use_audio_in_video`` flag, and a clip's frames
    flat along time by its length, with its mask and length batched on the CPU."""
    vision = {k: v for k, v in qwen2_vl_fields(hf_out, hf_processor).items() if k != "timestamps"}
    lengths = hf_out.get("audio_feature_lengths", torch.empty((0,), dtype=torch.long)).flatten()
    videos = len(hf_out.get("video_grid_thw", ()))
    return {**vision,
            "input_audio_features": MultiModalFieldConfig.flat_from_sizes("audio", lengths, dim=1),
            "feature_attention_mask": MultiModalFieldConfig.batched("audio", keep_on_cpu=True),
            "audio_feature_lengths": MultiModalFieldConfig.batched("audio", keep_on_cpu=True),
            "second_per_grid_ts": MultiModalFieldConfig.batched("video", keep_on_cpu=True),
            "use_audio_in_video": MultiModalFieldConfig.shared("video", videos, keep_on_cpu=True)}


QWEN3_OMNI_MOE_NATIVE = NativeInputs(
    ("Qwen3OmniMoeForConditionalGeneration",), qwen3_omni_fields, outputs=qwen3_omni_outputs,
    audio_samples=pad_to_hops, whole_range_embeds=True,
    unproven_kwargs={"use_audio_in_video": AUDIO_IN_VIDEO, "load_audio_from_video": AUDIO_IN_VIDEO})

QWEN3_OMNI_MOE = register_model(ModelSpec(model_type="qwen3_omni_moe", hf_processor_class="Qwen3OmniMoeProcessor",
                                          native=QWEN3_OMNI_MOE_NATIVE))
