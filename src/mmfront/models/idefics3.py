"""Idefics3 (SmolVLM): served by the transformers backend. This module declares the rest of what
mmfront needs of it: the encoder the reference engine runs (its offline ``idefics3`` fixture is
:mod:`mmfront.fixtures.models.idefics3`'s)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from mmfront.inputs import BatchedTensorInputs, MultiModalFeatureSpec
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec, ReferenceModel, pooled_rows, split_rows


def encode_idefics3_images(model: Any, modality: str, kwargs: BatchedTensorInputs,
                           features: Sequence[MultiModalFeatureSpec]) -> list[torch.Tensor]:
    """The vision tower and connector on every tile; an image owns its tiles' rows."""
    pixel_values = kwargs["pixel_values"]
    pooled = pooled_rows(model.get_image_features(pixel_values, kwargs.get("pixel_attention_mask"), return_dict=True))
    tiles = [f.data["pixel_values"].data.shape[1] for f in features]  # type: ignore[index, union-attr]
    per_tile = pooled.shape[0] // max(sum(tiles), 1)
    return split_rows(pooled, [t * per_tile for t in tiles])


IDEFICS3 = register_model(ModelSpec(
    model_type="idefics3",
    hf_processor_class="Idefics3Processor",
    reference=ReferenceModel(encode_idefics3_images),
))
