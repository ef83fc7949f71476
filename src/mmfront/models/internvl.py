"""InternVL (HF-format ``InternVLForConditionalGeneration`` checkpoints, e.g. OpenGVLab's ``-hf``
folders): served by the transformers backend's HF call; what vLLM 0.33's native class reads is
declared here. vLLM runs ``InternS1MultiModalProcessor`` for the architecture.

Its ``_get_mm_fields_config``: an image's tiles are its rows of ``pixel_values`` (flat, counted by
``image_num_patches``, which is batched and kept on the CPU: mmfront's backend counts the same rows
as ``num_image_patches``), and the context token's id ``image_token_id`` is shared by the request's
images. Each range is ``<img>`` + context tokens + ``</img>``, only the context tokens embedded.
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

__all__ = ["INTERNVL", "INTERNVL_NATIVE", "internvl_fields", "internvl_outputs"]


def internvl_outputs(hf_out: dict[str, Any], hf_processor: Any, mm_items: MultiModalDataItems,
                     hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The backend's per-image tile counts under vLLM's name, and the context token's id."""
    out = dict(hf_out)
    if "num_image_patches" in out:
        out["image_num_patches"] = out.pop("num_image_patches")
        out["image_token_id"] = torch.tensor(hf_processor.image_token_id)
    return out


def internvl_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's ``InternS1MultiModalProcessor._get_mm_fields_config`` for images."""
    patches = hf_out.get("image_num_patches", torch.empty(0, dtype=torch.long))
    return {"pixel_values": MultiModalFieldConfig.flat_from_sizes("image", patches),
            "image_num_patches": MultiModalFieldConfig.batched("image", keep_on_cpu=True),
            "image_embeds": MultiModalFieldConfig.batched("image"),
            "image_token_id": MultiModalFieldConfig.shared("image", len(patches), keep_on_cpu=True)}


INTERNVL_NATIVE = NativeInputs(("InternVLForConditionalGeneration",), internvl_fields, outputs=internvl_outputs)

INTERNVL = register_model(ModelSpec(model_type="internvl", hf_processor_class="InternVLProcessor",
                                    native=INTERNVL_NATIVE))
