"""CohereCompass: served by the transformers backend's HF call; what vLLM 0.33's native
``CohereCompassForConditionalGeneration`` reads is declared here.

vLLM's ``_create_cohere_compass_field_factory`` is Qwen2-VL's for images: an image's
``pixel_values`` are its ``t*h*w`` patch rows (flat), its ``image_grid_thw`` batched and kept on the
CPU; pixels are normalised by the processor (the class does not normalise on the device), and each
range is the image's embedding tokens alone (no ``is_embed`` mask). vLLM's class takes images only
(its video limit is 0), so while it runs a video is refused with that reason. transformers ships
``CohereCompassProcessor`` from 5.16.0 on.
"""

from __future__ import annotations

from mmfront.models.catalog import register_model
from mmfront.models.qwen2_vl import qwen2_vl_fields
from mmfront.models.spec import ModelSpec
from mmfront.processing.native import NativeInputs

__all__ = ["COHERE_COMPASS", "COHERE_COMPASS_NATIVE"]

_VIDEO_UNPROVEN = ("vLLM 0.33's native CohereCompass class takes no videos (its processor supports images only: "
                   "'At most 0 video(s) may be provided in one prompt'), so no engine running it reads one. Serve "
                   "the model with --model-impl transformers for videos.")

COHERE_COMPASS_NATIVE = NativeInputs(("CohereCompassForConditionalGeneration",), qwen2_vl_fields,
                                     whole_range_embeds=True, unproven={"video": _VIDEO_UNPROVEN})

COHERE_COMPASS = register_model(ModelSpec(model_type="cohere_compass", hf_processor_class="CohereCompassProcessor",
                                          native=COHERE_COMPASS_NATIVE, transformers_since="5.16.0"))
