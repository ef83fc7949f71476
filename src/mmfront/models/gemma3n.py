"""Gemma 3n: served by the transformers backend's HF call; what vLLM 0.33's native
``Gemma3nForConditionalGeneration`` reads is declared here.

vLLM's ``Gemma3nMultiModalProcessor``: an image's ``pixel_values`` per item (batched); a clip's mel
frames as ``input_features_padded`` with its ``input_features_mask``, each trimmed to the frames the
clip has alone (batched; the transformers backend already processes clips of different lengths
apart, so its features are the clip's own).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.parse import MultiModalDataItems
from mmfront.processing.native import NativeInputs

__all__ = ["GEMMA3N", "GEMMA3N_NATIVE", "gemma3n_fields", "gemma3n_outputs"]


def gemma3n_outputs(hf_out: dict[str, Any], hf_processor: Any, mm_items: MultiModalDataItems,
                    hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's ``_postprocess_hf_mm_data``: the clips' features under ``input_features_padded``, one
    entry per clip (clips processed apart come as a list of HF batches of one)."""
    if "input_features" not in hf_out:
        return hf_out
    out = dict(hf_out, input_features_padded=hf_out["input_features"])
    for key in ("input_features_padded", "input_features_mask"):
        value = out.get(key)
        if isinstance(value, list):
            out[key] = [v[0] if isinstance(v, torch.Tensor) and v.shape[0] == 1 else v for v in value]
    return out


def gemma3n_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's Gemma 3n fields: one image or clip per item."""
    return {"pixel_values": MultiModalFieldConfig.batched("image"),
            "input_features_padded": MultiModalFieldConfig.batched("audio"),
            "input_features_mask": MultiModalFieldConfig.batched("audio")}


GEMMA3N_NATIVE = NativeInputs(
    ("Gemma3nForConditionalGeneration",), gemma3n_fields, outputs=gemma3n_outputs,
    legacy_mismatch="its ranges cover the soft tokens alone, vLLM's the whole replacement around them")

GEMMA3N = register_model(ModelSpec(model_type="gemma3n", hf_processor_class="Gemma3nProcessor", native=GEMMA3N_NATIVE))
