"""What the engine's model class reads, as a processor applies it: the field configs of vLLM's
native class, raw pixels where the engine normalises, ranges without a mask where the whole range is
embedded. A model module declares one :class:`NativeInputs` per family
(:attr:`mmfront.models.spec.ModelSpec.native`); :mod:`mmfront.models.native` decides whether the
engine runs that class (``--model-impl``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from mmfront.errors import ValidationError
from mmfront.inputs import MultiModalFieldConfig, PlaceholderRange
from mmfront.parse import MultiModalDataItems

__all__ = ["DEVICE_NORMALIZE_KWARGS", "AudioSamples", "EngineFields", "EngineOutputs", "NativeInputs", "VideoOutputs", "check_kwargs", "engine_range"]

EngineFields = Callable[[Mapping[str, Any], Any], Mapping[str, MultiModalFieldConfig]]
"""``(one HF call's outputs, the HF processor) -> field config by key``: vLLM's
``_get_mm_fields_config`` for the family. Keys it leaves out are not sent."""

EngineOutputs = Callable[[dict[str, Any], Any, MultiModalDataItems, Mapping[str, Any]], dict[str, Any]]
"""``(one HF call's outputs, the HF processor, the items of that call, its HF kwargs) -> the outputs
as vLLM's processor hands them to its fields``: where the backend lays an item's data out otherwise
(LLaVA-NeXT's tiles ``[1, tiles, C, H, W]`` per image where vLLM's batched field gives ``[tiles, C,
H, W]``), names it otherwise (InternVL's ``image_num_patches``) or vLLM adds what HF's call drops
(Llama 4's ``aspect_ratios`` from the images' sizes, Idefics3's ``num_patches``)."""
AudioSamples = Callable[[Any, Any], Any]
"""``(one clip's samples at the feature extractor's rate, the HF processor) -> the samples vLLM's
processor hands HF`` (Qwen3-Omni pads each clip to whole hops)."""
VideoOutputs = Callable[[Mapping[str, Any], Any, Mapping[str, Any]], Mapping[str, Any]]
"""``(one video's metadata, the HF processor, the request's HF kwargs) -> outputs by key``: what vLLM's
native processor adds to a video's HF outputs from its metadata (Qwen3-VL's frame ``timestamps``)."""

DEVICE_NORMALIZE_KWARGS: Mapping[str, Any] = {"do_normalize": False, "do_rescale": False}
"""What vLLM merges into every HF call when the engine normalises (``MultiModalConfig.merge_mm_processor_kwargs``):
they win over the deployment's and the request's kwargs, as there."""


@dataclass(frozen=True)
class NativeInputs:
    """What vLLM 0.33's native class for a family receives, proven equal by the parity suite
    (``tests/models/test_vllm_parity.py``)."""

    architectures: tuple[str, ...]
    """``config.json`` architectures this declaration covers."""
    fields: EngineFields | None = None
    """The family's field configs; ``None``: the module's native processor already sends vLLM's."""
    outputs: EngineOutputs | None = None
    """Reshapes the HF outputs into the layout :attr:`fields` splits (``None``: they already are)."""
    device_normalize: bool = False
    """vLLM's ``supports_mm_device_do_normalize`` for the class: the default of
    ``mm_device_do_normalize`` (raw uint8 pixels: the HF call gets :data:`DEVICE_NORMALIZE_KWARGS`)."""
    hf_samples_frames: bool = True
    """A loaded video's ``do_sample_frames`` (true where every frame was kept) reaches the HF call, as
    vLLM's transformers backend passes it. False: vLLM's native processor strips it from the metadata
    and HF keeps the frames it gets (Qwen2.5-VL: HF's own sampling of a short clip fails)."""
    legacy_mismatch: str = ""
    """Why the Legacy transformers backend (transformers < 5.15) does not send what the class reads:
    the family is refused there for the native class (empty: Legacy is proven equal too)."""
    video_outputs: VideoOutputs | None = None
    """Outputs vLLM's native processor adds to each video's HF call, where HF returns none."""
    unproven: Mapping[str, str] = field(default_factory=dict)
    """Modality -> why what the native class reads of it is not yet proven equal: such items are
    refused (the reason in the error) while the class runs, the family's other modalities served."""
    whole_range_embeds: bool = False
    """vLLM's replacement is the embedding tokens alone (no ``PromptUpdateDetails.select_*``), so a
    range whose every token is embedded carries no ``is_embed`` mask."""
    audio_samples: AudioSamples | None = None
    """What vLLM's processor does to each clip before its HF call (``_get_hf_mm_inputs``); ``None``:
    nothing. The clip's hash and the prompt's ids are those of the clip as sent."""
    refused_kwargs: Mapping[str, str] = field(default_factory=dict)
    """HF kwarg -> why the class's inputs are not proven where a request sets it: a request setting it
    (true, at the top level or in a modality's scope) is refused with the reason before HF is called."""
    placeholders: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Modality -> the HF processor attributes whose text, concatenated, is the placeholder vLLM's
    processor replaces as a whole (Cosmos3 Edge's video: ``<|vision_start|><|video_pad|><|vision_end|>``,
    its chat template's spelling, becomes the frames with their own markers); the modality's
    ``{modality}_token`` otherwise."""


def check_kwargs(native: NativeInputs | None, hf_kwargs: Mapping[str, Any]) -> None:
    """Refuse a request that sets one of ``native.refused_kwargs`` (a typed error with the reason)."""
    if native is None or not native.refused_kwargs:
        return
    scopes = [hf_kwargs, *(v for v in hf_kwargs.values() if isinstance(v, Mapping))]
    for key, why in native.refused_kwargs.items():
        if any(scope.get(key) for scope in scopes):
            raise ValidationError(f"{key} is not served while vLLM's native class runs: {why}.",
                                  parameter="mm_processor_kwargs")


def engine_range(placeholder: PlaceholderRange, native: NativeInputs | None) -> PlaceholderRange:
    """``placeholder`` as the engine's class gets it (without an all-true mask where vLLM sends none)."""
    mask = placeholder.is_embed
    if native is not None and native.whole_range_embeds and mask is not None and bool(mask.all()):
        return PlaceholderRange(offset=placeholder.offset, length=placeholder.length, is_embed=None)
    return placeholder
