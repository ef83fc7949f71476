"""What the engine's model class reads, as a processor applies it: the field configs of vLLM's
native class, raw pixels where the engine normalises, ranges without a mask where the whole range is
embedded. A model module declares one :class:`NativeInputs` per family
(:attr:`mmfront.models.spec.ModelSpec.native`); :mod:`mmfront.models.native` decides whether the
engine runs that class (``--model-impl``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from mmfront.inputs import MultiModalFieldConfig, PlaceholderRange
from mmfront.parse import MultiModalDataItems
from mmfront.processing.updates import PromptUpdate

__all__ = ["DEVICE_NORMALIZE_KWARGS", "UNTRUNCATED_KWARGS", "AudioSamples", "EngineFields", "EngineOutputs", "EngineUpdates",
           "ItemLimit", "NativeInputs", "PromptFinish", "VideoOutputs", "engine_range", "refuse_unproven_kwargs"]

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

EngineUpdates = Callable[[Sequence[PromptUpdate], Any], Sequence[PromptUpdate]]
"""``(the processor's prompt updates, the HF processor) -> vLLM's``: where vLLM's native processor places
items otherwise than on the placeholder HF expands (PaliGemma inserts its image at the start of the prompt)."""
PromptFinish = Callable[[list[int], Any], list[int]]
"""``(a prompt's ids with its items placed, the tokenizer) -> the ids vLLM's processor hands on``: what it
appends after placing the items (PaliGemma's newline)."""

DEVICE_NORMALIZE_KWARGS: Mapping[str, Any] = {"do_normalize": False, "do_rescale": False}
"""What vLLM merges into every HF call when the engine normalises (``MultiModalConfig.merge_mm_processor_kwargs``):
they win over the deployment's and the request's kwargs, as there."""

UNTRUNCATED_KWARGS: Mapping[str, Any] = {"truncation": False}
"""What vLLM's ``_get_hf_mm_inputs`` puts under every HF call that has text, below the deployment's and
the request's kwargs. It is meant for the tokenizer (the text is a dummy), but HF hands it to the
feature extractor too, and Whisper's then keeps a clip's frames past its 30 s window."""


@dataclass(frozen=True)
class ItemLimit:
    """A modality's items per prompt while the native class runs: vLLM's own limit for it
    (``get_supported_mm_limits``), or the count beyond which vLLM's processor fails."""

    count: int | None = None
    """At most this many items in one prompt (``None``: no cap of the class's own)."""
    reason: str = ""
    """Why, as the refusal of more items says it, where the limit is not the class's declared one."""


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
    mm_limits: Mapping[str, ItemLimit] | None = None
    """vLLM's ``get_supported_mm_limits`` for the class, where it differs from the backend's: a
    modality it leaves out is refused (vLLM's limit of 0), a count caps the items of one prompt (the
    refusal gives the limit's reason), and a modality it names is placed even where the HF processor
    does not count its tokens (vLLM's native processor counts them itself; the parity suite proves
    HF's expansion equal). ``None``: the backend's own limits."""
    whole_range_embeds: bool = False
    """vLLM's replacement is the embedding tokens alone (no ``PromptUpdateDetails.select_*``), so a
    range whose every token is embedded carries no ``is_embed`` mask."""
    prompt_updates: EngineUpdates | None = None
    """vLLM's ``_get_prompt_updates`` where its class places items itself rather than on the placeholder
    HF expands. Prompts then name no placeholder, as vLLM's ``get_placeholder_str`` names none: the
    processor's placeholder string is empty, and a placeholder typed into a prompt is refused as a token
    no item fills."""
    finish_prompt: PromptFinish | None = None
    """What vLLM's processor appends to a prompt holding items once they are placed. It only appends,
    so the placeholder ranges stay."""

    hf_defaults: Mapping[str, Any] = field(default_factory=dict)
    """HF kwargs vLLM's processor calls HF with, below the deployment's and the request's
    (:data:`UNTRUNCATED_KWARGS`; with them Qwen2.5-Omni's clips past 30 s keep every frame)."""
    unproven_kwargs: Mapping[str, str] = field(default_factory=dict)
    """HF kwarg -> why what the native class reads when it is set (truthy) is not yet proven equal:
    a request or deployment setting it is refused (the reason in the error) while the class runs."""

    audio_samples: AudioSamples | None = None
    """What vLLM's processor does to each clip before its HF call (``_get_hf_mm_inputs``); ``None``:
    nothing. The clip's hash and the prompt's ids are those of the clip as sent."""
    placeholders: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Modality -> the HF processor attributes whose text, concatenated, is the placeholder vLLM's
    processor replaces as a whole (Cosmos3 Edge's video: ``<|vision_start|><|video_pad|><|vision_end|>``,
    its chat template's spelling, becomes the frames with their own markers); the modality's
    ``{modality}_token`` otherwise."""


    def takes(self, modality: str) -> bool:
        """Whether the class takes ``modality`` items at all (:attr:`mm_limits`)."""
        return self.mm_limits is None or modality in self.mm_limits

    def why_limited(self, modality: str) -> str:
        """Why the class takes no more ``modality`` items than :attr:`mm_limits` says (empty: no limit of its own)."""
        if self.mm_limits is None:
            return ""
        arch = self.architectures[0]
        if modality not in self.mm_limits:
            return (f"vLLM 0.33's native {arch} class takes no {modality} items (its limit is 0; it takes "
                    f"{', '.join(sorted(self.mm_limits))} only): serve the model with --model-impl transformers for them.")
        limit = self.mm_limits[modality]
        if limit.reason or limit.count is None:
            return limit.reason
        return f"vLLM 0.33's native {arch} class takes at most {limit.count} {modality}(s) per prompt."


def engine_range(placeholder: PlaceholderRange, native: NativeInputs | None) -> PlaceholderRange:
    """``placeholder`` as the engine's class gets it (without an all-true mask where vLLM sends none)."""
    mask = placeholder.is_embed
    if native is not None and native.whole_range_embeds and mask is not None and bool(mask.all()):
        return PlaceholderRange(offset=placeholder.offset, length=placeholder.length, is_embed=None)
    return placeholder


def refuse_unproven_kwargs(native: NativeInputs | None, kwargs: Mapping[str, Any], *, where: str) -> str:
    """Why ``kwargs`` (named ``where`` in the message) cannot be served by the native class, or ``""``."""
    if native is None:
        return ""
    scopes = [("", kwargs), *((f"{name}.", v) for name, v in kwargs.items() if isinstance(v, Mapping))]
    for key, why in native.unproven_kwargs.items():
        for prefix, scope in scopes:
            if scope.get(key):
                return (f"{where}.{prefix}{key}={scope[key]!r}: {why}. Leave it unset, or serve the model with "
                        "--model-impl transformers.")
    return ""
