"""The reference engine's device normalisation reads the folder's image processor config as vLLM's
``_load_norm_params`` does and runs vLLM's per-channel affine map (``FusedMMInputNorm``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mmfront.engine.input_norm import load_input_norm
from mmfront.errors import ConfigError

MEAN = [0.48145466, 0.4578275, 0.40821073]
STD = [0.26862954, 0.26130258, 0.27577711]


def _folder(tmp_path: Path, image_processor: dict, name: str = "processor_config.json") -> Path:
    (tmp_path / name).write_text(json.dumps({"processor_class": "Qwen2_5_VLProcessor", "image_processor": image_processor}))
    return tmp_path


def test_weight_and_bias_are_vllm_s(tmp_path: Path) -> None:
    norm = load_input_norm(_folder(tmp_path, {"do_normalize": True, "do_rescale": True, "image_mean": MEAN,
                                              "image_std": STD, "rescale_factor": 1 / 255}))
    assert norm is not None
    std = torch.tensor(STD, dtype=torch.float32)
    assert torch.equal(norm.weight, (1 / 255) / std)
    assert torch.equal(norm.bias, -torch.tensor(MEAN, dtype=torch.float32) / std)


def test_channel_major_patches_normalised_then_cast(tmp_path: Path) -> None:
    norm = load_input_norm(_folder(tmp_path, {"image_mean": MEAN, "image_std": STD}))  # flags default on
    assert norm is not None
    pixels = torch.arange(2 * 3 * 4, dtype=torch.uint8).reshape(2, 12) * 10  # 2 patches, 3 channels of 4 values
    out = norm(pixels, torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 12)
    want = (pixels.float().reshape(2, 3, 4) / 255 - torch.tensor(MEAN).view(1, 3, 1)) / torch.tensor(STD).view(1, 3, 1)
    assert torch.allclose(out.float(), want.reshape(2, 12).to(torch.bfloat16).float(), atol=1e-2)
    assert torch.allclose(norm(pixels, torch.float32), want.reshape(2, 12), atol=1e-6)


def test_identity_is_none_and_bad_params_refused(tmp_path: Path) -> None:
    assert load_input_norm(_folder(tmp_path, {"do_normalize": False, "do_rescale": False})) is None
    assert load_input_norm(_folder(tmp_path, {"image_mean": [0.0] * 3, "image_std": [1 / 255] * 3})) is None
    with pytest.raises(ConfigError, match="cannot normalise raw pixels"):
        load_input_norm(_folder(tmp_path, {"image_mean": [0.5] * 3, "image_std": [0.5] * 2}))


def test_preprocessor_config_without_processor_class(tmp_path: Path) -> None:
    """vLLM falls back to the image processor config (preprocessor_config.json) where no processor
    config names a processor class."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"image_mean": MEAN, "image_std": STD,
                                                                   "rescale_factor": 1 / 255}))
    norm = load_input_norm(tmp_path)
    assert norm is not None and torch.equal(norm.bias, -torch.tensor(MEAN) / torch.tensor(STD))
