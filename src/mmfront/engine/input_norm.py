"""The engine's normalisation of raw pixels (vLLM 0.33's ``mm_input_norm``).

Where vLLM's engine normalises on the device (``mm_device_do_normalize``), the frontend sends raw
``uint8`` pixels and the model's vision tower runs ``FusedMMInputNorm`` on them first: one
per-channel affine map ``x * rescale_factor / std - mean / std`` computed in float32 and cast to the
tower's dtype, with the parameters read from the folder's processor config as vLLM reads them
(``_load_norm_params``). The reference engine plays that engine, so it reads the same parameters
and runs the same arithmetic.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mmfront.errors import ConfigError

__all__ = ["InputNorm", "load_input_norm"]

_PROCESSOR_CONFIGS = ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json")
"""Where vLLM's ``get_processor_config`` looks, in order: the first holding a ``processor_class``."""


@dataclass(frozen=True)
class InputNorm:
    """``x * weight[c] + bias[c]`` per channel ``c`` (``weight = rescale_factor / std``, ``bias = -mean / std``)."""

    weight: torch.Tensor
    bias: torch.Tensor

    def __call__(self, pixels: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``pixels`` (``[patches, channels * patch]``, channel-major rows as Qwen2-VL's patches are)
        normalised in float32 and cast to ``dtype``, as vLLM's ``forward_native``."""
        patches, size = pixels.shape
        channels = self.weight.numel()
        x = pixels.reshape(patches, channels, size // channels)
        weight, bias = self.weight.to(pixels.device), self.bias.to(pixels.device)
        return (x * weight.view(1, channels, 1) + bias.view(1, channels, 1)).view(patches, size).to(dtype)


def _read(path: Path) -> dict[str, Any]:
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def load_input_norm(folder: str | Path) -> InputNorm | None:
    """The folder's device normalisation, or None where it is the identity (vLLM then only casts)."""
    folder = Path(folder)
    config: dict[str, Any] = {}
    for name in _PROCESSOR_CONFIGS:
        candidate = _read(folder / name)
        if "processor_class" in candidate:
            config = candidate
            break
    config = config.get("image_processor", config)
    if not any(key in config for key in ("do_normalize", "do_rescale", "image_mean", "image_std")):
        config = _read(folder / "preprocessor_config.json")
    config = config.get("media_proc_cfg", config)
    has_params = "image_mean" in config and "image_std" in config
    rescale = float(config.get("rescale_factor", 1 / 255)) if config.get("do_rescale", has_params) else 1.0
    do_normalize = config.get("do_normalize", has_params)
    mean = [float(v) for v in config["image_mean"]] if do_normalize and "image_mean" in config else [0.0] * 3
    std = [float(v) for v in config["image_std"]] if do_normalize and "image_std" in config else [1.0] * 3
    if len(mean) != len(std) or rescale == 0.0:
        raise ConfigError(f"The image processor config of {str(folder)!r} has image_mean {mean}, image_std {std} and "
                          f"rescale_factor {rescale}: the engine cannot normalise raw pixels with them.")
    if all(math.isclose(rescale / s, 1.0, rel_tol=1e-5, abs_tol=1e-8) and math.isclose(m / s, 0.0, abs_tol=1e-8)
           for m, s in zip(mean, std)):
        return None
    std_t = torch.tensor(std, dtype=torch.float32)
    return InputNorm(weight=rescale / std_t, bias=-torch.tensor(mean, dtype=torch.float32) / std_t)
