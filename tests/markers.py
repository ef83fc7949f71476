"""Skip markers several test folders share: what the installed libraries allow."""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import sysconfig
from types import ModuleType

import pytest

NEEDS_TORCHVISION = pytest.mark.skipif(
    importlib.util.find_spec("torchvision") is None,
    reason="transformers builds no video processor, nor the processors that take one, without torchvision "
           "(`make test` installs it; docs/models.md, 'torchvision')")

NEEDS_TORCHAUDIO = pytest.mark.skipif(
    importlib.util.find_spec("torchaudio") is None,
    reason="Granite Speech's and FunASR-Nano's feature extractors compute log-mels with torchaudio "
           "(`make test` installs it; docs/models.md, 'torchaudio')")

VIDEO_SERVED = pytest.mark.hf_version(
    ">=5.18", reason="the transformers backend serves video from transformers 5.18, as vLLM 0.33's does: before, "
                     "the video processors cannot count a video's tokens (5.14.1: Qwen2VLVideoProcessor has no "
                     "get_number_of_video_patches, LLaVA-OneVision counts None)")


def optional_extension(name: str) -> ModuleType | None:
    """One of mmfront's optional C extensions (``mmfront._pixels``, ``mmfront._bicubic``), or None
    where the install had no C compiler to build it."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def has_c_compiler() -> bool:
    """Whether the install could have built the optional C extensions (setup.py marks them
    optional, so a failed build shows only as a slower path)."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(compiler) is not None
