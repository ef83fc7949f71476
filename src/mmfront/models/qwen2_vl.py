"""Qwen2-VL: served by the transformers backend's HF call; what vLLM 0.33's native
``Qwen2VLForConditionalGeneration`` reads is declared here (Qwen2.5-VL's module adds its
``second_per_grid_ts``).

vLLM's ``_create_qwen2vl_field_factory``: an item's ``pixel_values`` are its ``t*h*w`` patch rows
(flat), its grid ``image_grid_thw`` is batched and kept on the CPU, as are a video's
``video_grid_thw``; the engine normalises raw uint8 patches on the GPU by default
(``supports_mm_device_do_normalize``), and each placeholder range is embedding tokens only.

Three steps of the HF image processor are swapped for ones that give the same bytes with less
copying (:func:`qwen2_vl_speedups`; Qwen2.5-VL's folders load the same image processor):
``patchify`` (a permute, a temporal expand and a reshape: torch copies a 1024x768 image's 4.7 MB
of rows element by element through an 8-dimensional stride pattern) becomes
:func:`mmfront.pixels.patch_rows`, one C pass in about half the CPU time; the resize, torch's
uint8 antialiased bicubic, becomes :func:`mmfront.bicubic.resize_planes`, the same bytes straight
into the planes the patch rows are copied from (torch's writes channels-last pixels, which the
patch rows split into planes again); and an RGB PIL image reaches the resize as a channels-first
view of its pixel array, without HF's contiguous copy (both resizes read that layout where it
lies). A JPEG decoded straight into pixels reaches it as such a view already (the transformers
backend's ``call_image_processor``), so on a JPEG miss no PIL image is made at all.

An image's expansion is known from its grid (:func:`qwen2_vl_image_expansions`), so the
transformers backend runs the image processor alone on a miss: no dummy text of 999 image pads
tokenized, and HF's kwargs merged once per distinct set of kwargs rather than on every call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
import transformers
from packaging.version import Version
from PIL import Image

from mmfront.bicubic import resize_planes, resizes_in_c
from mmfront.inputs import MultiModalFieldConfig
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec
from mmfront.pixels import patch_rows, patch_rows_in_c, to_hwc_uint8
from mmfront.processing.hf import KwargsPreparedOnce
from mmfront.processing.native import NativeInputs

__all__ = ["QWEN2_VL", "QWEN2_VL_NATIVE", "qwen2_vl_fields", "qwen2_vl_image_expansions", "qwen2_vl_pixel_limits", "qwen2_vl_speedups"]


def _merge_size(hf_processor: Any) -> int:
    return int(getattr(hf_processor.image_processor, "merge_size", 2))


def qwen2_vl_fields(hf_out: Mapping[str, Any], hf_processor: Any) -> dict[str, MultiModalFieldConfig]:
    """vLLM's ``_qwen2vl_field_config``: patch rows per item from its grid."""
    unit = _merge_size(hf_processor) ** 2
    image_rows = hf_out.get("image_grid_thw", torch.empty((0, 3), dtype=torch.long)).prod(-1)
    video_rows = hf_out.get("video_grid_thw", torch.empty((0, 3), dtype=torch.long)).prod(-1)
    return {
        "pixel_values": MultiModalFieldConfig.flat_from_sizes("image", image_rows),
        "image_embeds": MultiModalFieldConfig.flat_from_sizes("image", image_rows // unit),
        "image_grid_thw": MultiModalFieldConfig.batched("image", keep_on_cpu=True),
        "pixel_values_videos": MultiModalFieldConfig.flat_from_sizes("video", video_rows),
        "video_embeds": MultiModalFieldConfig.flat_from_sizes("video", video_rows // unit),
        "video_grid_thw": MultiModalFieldConfig.batched("video", keep_on_cpu=True),
        "timestamps": MultiModalFieldConfig.batched("video", keep_on_cpu=True),
    }


def qwen2_vl_image_expansions(hf_processor: Any, image_outputs: Mapping[str, Any]) -> list[list[int]]:
    """HF's ``replace_image_token`` as ids (vLLM's ``get_replacement_qwen2vl`` too): ``t*h*w /
    merge_size**2`` image pads per image, from its ``image_grid_thw`` row."""
    unit = _merge_size(hf_processor) ** 2
    token = int(hf_processor.image_token_id)
    return [[token] * (int(rows) // unit) for rows in image_outputs["image_grid_thw"].prod(-1).tolist()]


def _patchify(hf_patchify: Callable[..., tuple[torch.Tensor, int, int]], images: torch.Tensor, patch_size: int,
              merge_size: int, temporal_patch_size: int) -> tuple[torch.Tensor, int, int]:
    rows = patch_rows(images, patch_size, merge_size, temporal_patch_size)
    if rows is None:
        return hf_patchify(images, patch_size=patch_size, merge_size=merge_size, temporal_patch_size=temporal_patch_size)
    return rows, int(images.shape[-2]) // patch_size, int(images.shape[-1]) // patch_size


_BICUBIC = 3
"""``PILImageResampling.BICUBIC``, what Qwen2-VL's image processors resample with."""
_RESIZE_KWARGS = frozenset({"images", "image", "size", "resample", "factor"})


def _resize(hf_resize: Callable[..., torch.Tensor], smart_resize: Callable[..., tuple[int, int]] | None,
            *args: Any, **kwargs: Any) -> torch.Tensor:
    """HF's resize of a group of images, by :func:`mmfront.bicubic.resize_planes` where it takes
    them. Two call forms: the image processor's own ``resize(images=, size=, resample=,
    factor=)``, which sizes the images by its pixel limits (HF's ``smart_resize``, called here
    too), and the base one, ``resize(image=, size=SizeDict(height=, width=), resample=)``, to
    which releases before 5.15 hand the size they computed."""
    target = None if args or not _RESIZE_KWARGS.issuperset(kwargs) else _resize_target(smart_resize, kwargs)
    resample = kwargs.get("resample")  # PIL's number, or torchvision's InterpolationMode
    bicubic = (isinstance(resample, int) and int(resample) == _BICUBIC) or getattr(resample, "value", None) == "bicubic"
    if target is not None and bicubic:
        images = kwargs.get("images", kwargs.get("image"))
        planes = resize_planes(images, *target) if isinstance(images, torch.Tensor) else None
        if planes is not None:
            return planes
    return hf_resize(*args, **kwargs)


def _resize_target(smart_resize: Callable[..., tuple[int, int]] | None, kwargs: dict[str, Any]) -> tuple[int, int] | None:
    images, size = kwargs.get("images", kwargs.get("image")), kwargs.get("size")
    if not isinstance(images, torch.Tensor) or images.ndim != 4 or size is None:
        return None
    factor = kwargs.get("factor")
    if factor is None:
        height, width = getattr(size, "height", None), getattr(size, "width", None)
        return (height, width) if isinstance(height, int) and isinstance(width, int) else None
    shortest, longest = getattr(size, "shortest_edge", None), getattr(size, "longest_edge", None)
    if smart_resize is None or not shortest or not longest:
        return None  # HF's own call raises for the size
    height, width = smart_resize(int(images.shape[-2]), int(images.shape[-1]), factor=factor, min_pixels=shortest,
                                 max_pixels=longest)
    return int(height), int(width)


def _process_image(hf_process_image: Callable[..., torch.Tensor], image: Any, *args: Any, **kwargs: Any,
                   ) -> torch.Tensor:
    if args or kwargs.get("device") is not None:
        return hf_process_image(image, *args, **kwargs)
    if isinstance(image, torch.Tensor):
        # HF takes a 3-channel first dimension as the channels (even where the last is 3 too), and
        # its only conversion is the contiguous copy this skips
        rgb_planes = (image.dtype == torch.uint8 and image.ndim == 3 and image.shape[0] == 3
                      and kwargs.get("input_data_format") is None)
        return image if rgb_planes else hf_process_image(image, *args, **kwargs)
    # HF composites an image with a transparency key onto white; only a plain RGB image skips it
    plain = isinstance(image, Image.Image) and image.mode == "RGB" and image.info.get("transparency") is None
    hwc = to_hwc_uint8(image) if plain else None
    if hwc is None:
        return hf_process_image(image, *args, **kwargs)
    return hwc.permute(2, 0, 1)


def qwen2_vl_speedups(hf_processor: Any) -> bool:
    """Gives the processor's image processor :func:`mmfront.pixels.patch_rows` for its
    ``patchify``, :func:`mmfront.bicubic.resize_planes` for its ``resize`` and the view of an RGB
    image for its ``process_image`` (transformers releases whose Qwen2-VL image processor inlines
    a step keep theirs), and its kwargs prepared once per distinct set
    (:class:`~mmfront.processing.hf.KwargsPreparedOnce`: its ``preprocess`` is HF's base one,
    reached through a pass-through override, in every supported release). True where all three
    steps are mmfront's and its C loops run here (transformers 5.14 inlines ``patchify``, whose
    copies then fault ~26 MB of fresh pages in per 1024x768 miss in ``mmfront serve``)."""
    image_processor = getattr(hf_processor, "image_processor", None)
    smart_resize = getattr(sys.modules.get(type(image_processor).__module__), "smart_resize", None)
    steps: tuple[tuple[str, Callable[[Any], Callable[..., Any]]], ...] = (
        ("patchify", lambda hf_step: partial(_patchify, hf_step)),
        ("process_image", lambda hf_step: partial(_process_image, hf_step)),
        ("resize", lambda hf_step: partial(_resize, hf_step, smart_resize)))
    swapped = 0
    for name, fast in steps:
        hf_step = getattr(image_processor, name, None)
        if hf_step is not None and name not in vars(image_processor):
            setattr(image_processor, name, fast(hf_step))
            swapped += 1
    if (hasattr(image_processor, "_preprocess_image_like_inputs") and image_processor is not None
            and "preprocess" not in vars(image_processor)):
        image_processor.preprocess = KwargsPreparedOnce(image_processor, image_processor.preprocess)
    return swapped == len(steps) and resizes_in_c() and patch_rows_in_c()


_READS_PIXEL_LIMITS = Version(transformers.__version__) >= Version("5.15")
"""Before 5.15 the image processor resizes by ``size`` alone and drops a call's ``min_pixels`` and
``max_pixels``; from 5.15 (and in vLLM's transformers) they replace ``size``'s edges."""


def qwen2_vl_pixel_limits(hf_processor: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's image ``min_pixels``/``max_pixels`` folded into ``size``'s ``shortest_edge`` and
    ``longest_edge`` where the installed image processor would drop them, so a request's pixel
    limits give the grid vLLM's gives (the item's hash still covers the request's kwargs as sent)."""
    images = kwargs.get("images_kwargs") or {}
    limits = {edge: images[key] for edge, key in (("shortest_edge", "min_pixels"), ("longest_edge", "max_pixels"))
              if images.get(key) is not None}
    if _READS_PIXEL_LIMITS or not limits:
        return kwargs
    size = images.get("size") or hf_processor.image_processor.size
    edges = {edge: size[edge] for edge in ("shortest_edge", "longest_edge")}
    rest = {key: value for key, value in images.items() if key not in ("min_pixels", "max_pixels")}
    return {**kwargs, "images_kwargs": {**rest, "size": {**edges, **limits}}}


QWEN2_VL_NATIVE = NativeInputs(("Qwen2VLForConditionalGeneration",), qwen2_vl_fields, device_normalize=True,
                               whole_range_embeds=True, hf_samples_frames=False)

QWEN2_VL = register_model(ModelSpec(model_type="qwen2_vl", hf_processor_class="Qwen2VLProcessor",
                                    native=QWEN2_VL_NATIVE, hf_speedups=qwen2_vl_speedups, call_kwargs=qwen2_vl_pixel_limits,
                                    image_expansions=qwen2_vl_image_expansions))
