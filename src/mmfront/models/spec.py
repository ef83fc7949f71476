"""What a model module declares: one :class:`ModelSpec`, registered with
:func:`~mmfront.models.catalog.register_model`.

Everything mmfront needs of a model lives in its module (CONTRIBUTING.md, "Adding a model"):
the native processor and info classes, its deployment options, and the encoder the reference
engine runs. Generic code reads these declarations and names no model. Its offline fixtures are
test code, in its module of ``mmfront.fixtures.models``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from mmfront.config import ModelOption
from mmfront.errors import PromptUpdateError
from mmfront.inputs import BatchedTensorInputs, MultiModalFeatureSpec, PlaceholderRange
from mmfront.processing.native import NativeInputs
from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo

__all__ = [
    "CallKwargs", "Encoder", "ImageExpansions", "ImagePatches", "ModelSpec", "Positions", "PromptLayout", "PromptOutput", "ReferenceModel", "pooled_rows",
    "split_rows",
]

Encoder = Callable[[Any, str, BatchedTensorInputs, Sequence[MultiModalFeatureSpec]], list[torch.Tensor]]
"""``(model, modality, batched kwargs, the batch's features) -> one [rows, hidden] tensor per feature``."""

Positions = Callable[[Any, Sequence[int], Sequence[MultiModalFeatureSpec]], tuple[torch.Tensor, int]]
"""``(model, prompt ids, the prompt's features) -> (the prompt's position ids, the offset of every
later position)``: the position ids ``[rows, 1, prompt_len]`` go to the prefill's forward, and a
token decoded at cache length ``n`` sits at ``n + offset`` in every row."""


PromptLayout = Callable[[str, Any], str]
"""``(prompt text with its placeholders, the HF processor) -> the text HF tokenizes``."""

PromptOutput = Callable[[Sequence[int], Mapping[str, Sequence[PlaceholderRange]],
                         Mapping[str, Sequence[Mapping[str, Any]]]], torch.Tensor]
"""``(prompt ids, the prompt's placeholder ranges by modality, its items' data by modality) -> one
HF output for that prompt, without HF's batch dimension``: how an engine rebuilds an output HF
lays out along the prompt's tokens from what mmfront sends."""

ImagePatches = Callable[[Any, int, int, Mapping[str, Any]], int]
"""``(the HF processor, an image's height, its width, the call's images_kwargs) -> the tiles (rows of
its data) HF's processor makes of that image``."""
ImageExpansions = Callable[[Any, Mapping[str, Any]], list[list[int]]]
"""``(the HF processor, what its image processor returned for a call's images) -> each image's
expansion of its placeholder as token ids``: what HF's ``replace_image_token`` writes into the text,
known from the image processor's outputs (Qwen2-VL: ``t*h*w / merge_size**2`` image pads)."""
CallKwargs = Callable[[Any, dict[str, Any]], dict[str, Any]]
"""``(the HF processor, the kwargs of one call to it) -> the kwargs that make the installed
transformers do what vLLM's transformers does with them``."""
HfSpeedups = Callable[[Any], bool]
"""``(a freshly loaded HF processor) -> whether every pixel step of a miss is now mmfront's``:
swaps steps of its sub-processors for faster ones that return the very same bytes (Qwen2-VL's
patch rows in one C pass); where all of them took, the processor's misses are processed in place
by default (``BaseMultiModalProcessor.in_place_misses``)."""


@dataclass(frozen=True)
class ReferenceModel:
    """How the reference engine (:class:`~mmfront.engine.runner.ModelRunner`) runs the model's
    multimodal encoder."""

    encode: Encoder
    marks_token_types: bool = False
    """Whether the prefill marks the embedding positions in ``token_type_ids`` (Gemma 3's image
    tokens attend to each other bidirectionally)."""
    positions: Positions | None = None
    """The prompt's positions where they are not ``0..n-1`` (Qwen2-VL's M-RoPE lays an image's
    tokens out on its 2-D grid); None: the model numbers them itself."""
    device_normalized: tuple[str, ...] = ()
    """Keys whose pixels arrive raw (``uint8``) where vLLM's engine normalises them on the device
    (``mm_device_do_normalize``): the reference engine normalises them as vLLM's vision tower does
    (:mod:`mmfront.engine.input_norm`) before the encoder runs."""


@dataclass(frozen=True)
class ModelSpec:
    """Everything mmfront needs of one model type.

    Without ``processor`` the transformers backend serves the model; ``backend_placeholders``
    then names, per modality, the HF processor attribute holding the text placeholder where it
    is not ``{modality}_token``."""

    model_type: str
    """``config.json``'s ``model_type``."""
    hf_processor_class: str
    """The HF processor class name its folders load as."""
    processor: type[BaseMultiModalProcessor] | None = None
    info: type[BaseProcessingInfo] | None = None
    options: Sequence[ModelOption] = ()
    """Its keys of ``MultiModalConfig.model_options``."""
    reference: ReferenceModel | None = None
    backend_placeholders: Mapping[str, str] = field(default_factory=dict)
    video_needs_metadata: bool = False
    """The HF processor reads each video's metadata (``video_metadata``: Qwen2.5-VL's
    ``second_per_grid_ts`` comes from its frame rate), so the transformers backend passes it."""
    prompt_layout: PromptLayout | None = None
    """The text HF's processor tokenizes for a prompt holding items, where its ``__call__``
    rewrites the prompt around the placeholders (PaliGemma's BOS after the last image and newline
    at the end); the transformers backend tokenizes that text, so its ids are HF's."""
    unexpanded_placeholders: Sequence[str] = ()
    """Modalities whose placeholder HF's processor leaves as it is, one token per item (Mllama's
    ``<|image|>``: its images reach the text through cross-attention, not as embeddings in it). The
    Legacy transformers backend (``auto`` picks it where HF reports no offsets, as Mllama's
    ``__call__`` never reaches ``replace_image_token``) takes the placeholder itself as each item's
    expansion, since adjacent items' tokens could not be told apart in HF's ids."""
    native: NativeInputs | None = None
    """What vLLM 0.33's native class for the model reads, once the parity suite proves mmfront sends
    exactly that (``tests/models/test_vllm_parity.py``). Without it, a folder whose architecture vLLM
    serves natively is refused for ``--model-impl auto``/``vllm`` (:mod:`mmfront.models.native`)."""
    transformers_since: str | None = None
    """The transformers release that first ships the model's HF processor class, where it is newer than
    the oldest mmfront supports (CohereCompass: 5.16.0). Under an older transformers no folder of the
    model loads, so nothing of it is served; the spec is registered all the same (the catalog is the
    same under every transformers) and its names are checked from that release on."""
    prompt_outputs: Mapping[str, PromptOutput] = field(default_factory=dict)
    """HF outputs laid out along the prompt's tokens that the model's engine rebuilds, by key, with
    how (Mllama's ``cross_attention_mask``: which images each token attends to). They belong to the
    prompt as a whole, so no item can carry them: the transformers backend leaves them out of the
    items (any other such output refuses the processor: ``transformers.layout.PROMPT_LAID_OUT_KEYS``),
    and the coverage suite proves each rebuild equal to HF's output."""
    hf_speedups: HfSpeedups | None = None
    """Applied to the HF processor of every folder of the model as it loads
    (:func:`mmfront.models.registry.create_processor`): faster steps, same outputs bit for bit, so
    every backend and the parity suite see no difference but the time."""
    image_patches: ImagePatches | None = None
    """Tiles per image where the HF processor cannot be asked (no ``_get_num_multimodal_tokens``, no
    ``get_number_of_image_patches``: LFM2-VL counts a tiled image's rows and columns, then drops
    them): the transformers backend splits a call's tiles by it, checked against the data."""
    image_expansions: ImageExpansions | None = None
    """Each image's expansion, computed from what the image processor returns, where the HF
    processor's ``__call__`` is ``ProcessorMixin``'s (the image processor, then one
    ``replace_image_token`` per image, then the tokenizer on the text): the transformers backend
    then calls the image processor itself, with the kwargs HF's merge gives (merged once per
    distinct set of kwargs: :class:`mmfront.processing.hf.MergedHfKwargs`), and neither tokenizes
    a dummy text nor reads the expansion off HF's text. Same outputs and ids as HF's call, bit for
    bit (``tests/models/test_qwen2_vl_direct.py``); videos still go through HF's call."""
    call_kwargs: CallKwargs | None = None
    """Rewrites the kwargs of every HF call the transformers backend makes, where the installed
    transformers reads a kwarg otherwise than vLLM's does (transformers 5.14's Qwen2-VL image
    processor reads ``size`` only and drops ``min_pixels``/``max_pixels``; later releases apply them)."""


def pooled_rows(output: Any) -> torch.Tensor:
    """``get_image_features``' projected rows as one ``[rows, hidden]`` tensor: transformers
    returns them in an output's ``pooler_output``, as one tensor or one per prompt."""
    pooled = output.pooler_output
    return torch.cat([p.reshape(-1, p.shape[-1]) for p in pooled])


def split_rows(rows: torch.Tensor, counts: Sequence[int]) -> list[torch.Tensor]:
    """``rows`` cut into one tensor per item of ``counts`` rows each."""
    if sum(counts) != rows.shape[0]:
        raise PromptUpdateError(
            f"The encoder produced {rows.shape[0]} embeddings for items that make {list(counts)} of them; the "
            "items' data does not fit this model.", expected=sum(counts), found=rows.shape[0])
    return list(rows.split(list(counts)))
