"""Offline model folders: the tiny processors saved the way a checkpoint ships them, plus the
embedded default model of ``make demo``.

A folder holds what ``save_pretrained`` writes for the processor and its tokenizer, plus a minimal
``config.json`` (``model_type``, ``architectures``, ``torch_dtype``) so a loader can learn the model
type and dtype from the folder alone. It loads back with ``transformers.AutoProcessor.from_pretrained``,
exactly as users load a downloaded model; :func:`load_processor` does that and also works around
one transformers 5.14.1 bug.

Importing this module does not import transformers: :func:`default_model_dir` on a warm cache
costs a few ``stat`` calls.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mmfront.errors import ConfigError

if TYPE_CHECKING:
    from transformers import ProcessorMixin

__all__ = [
    "DEFAULT_MODEL_KIND",
    "FIXTURE_VERSION",
    "KINDS",
    "ModelKind",
    "build_model_folder",
    "cached_model_dir",
    "default_model_dir",
    "load_processor",
    "mmfront_home",
]

#: Bump whenever a builder's output changes: cached default models are keyed by it.
FIXTURE_VERSION = "2"

#: Bump whenever the weights builder's output changes (cached folders with weights are keyed by it).
WEIGHTS_VERSION = "1"

#: The default model of ``make demo`` and the benchmarks.
DEFAULT_MODEL_KIND = "gemma3-896"


@dataclass(frozen=True)
class ModelKind:
    """One buildable folder: which builder, which sizes it takes, and what ``config.json`` says."""

    model_type: str
    architecture: str
    torch_dtype: str
    builder: str
    sizes: tuple[str, ...]

    def build(self, **sizes: int) -> ProcessorMixin:
        from mmfront.testing import processors

        make: Callable[..., ProcessorMixin] = getattr(processors, self.builder)
        return make(**sizes)


_IMAGE_GEMMA = ("image_size", "image_seq_length")
_AUDIO = ("feature_size", "chunk_length", "sampling_rate")

#: Every kind :func:`build_model_folder` knows. The Gemma3 kinds declare bfloat16 like the real
#: checkpoint (so loaders exercise the cast); the others float32, so their outputs compare
#: bit-exact with the HF processor's.
KINDS: dict[str, ModelKind] = {
    "gemma3": ModelKind("gemma3", "Gemma3ForConditionalGeneration", "bfloat16", "make_gemma3_processor", _IMAGE_GEMMA),
    "gemma3-896": ModelKind(
        "gemma3", "Gemma3ForConditionalGeneration", "bfloat16", "make_gemma3_896_processor", _IMAGE_GEMMA
    ),
    "idefics3": ModelKind(
        "idefics3",
        "Idefics3ForConditionalGeneration",
        "float32",
        "make_idefics3_processor",
        ("patch_size", "max_splits_per_side", "image_seq_len"),
    ),
    "emu3": ModelKind(
        "emu3", "Emu3ForConditionalGeneration", "float32", "make_emu3_processor", ("min_pixels", "max_pixels", "spatial_factor")
    ),
    "qwen2_audio": ModelKind(
        "qwen2_audio", "Qwen2AudioForConditionalGeneration", "float32", "make_qwen2_audio_processor", _AUDIO
    ),
    "glmasr": ModelKind("glmasr", "GlmAsrForConditionalGeneration", "float32", "make_glmasr_processor", _AUDIO),
}


def _config_json(kind: ModelKind, processor: ProcessorMixin) -> dict[str, Any]:
    """What a loader reads from ``config.json``; Gemma3 adds the token indices and image size
    vLLM's Gemma3 model reads there, so the folder is self-consistent with its tokenizer."""
    from transformers import Gemma3Processor

    config: dict[str, Any] = {
        "architectures": [kind.architecture],
        "model_type": kind.model_type,
        "torch_dtype": kind.torch_dtype,
    }
    if isinstance(processor, Gemma3Processor):
        tok = processor.tokenizer
        config |= {
            "boi_token_index": tok.boi_token_id,
            "eoi_token_index": tok.eoi_token_id,
            "image_token_index": tok.image_token_id,
            "mm_tokens_per_image": processor.image_seq_length,
            "vision_config": {"image_size": processor.image_processor.size["height"]},
        }
    return config


def build_model_folder(kind: str, folder: Path, *, with_weights: bool = False, **sizes: int) -> Path:
    """Save the ``kind`` processor (with its tokenizer) and a minimal ``config.json`` into ``folder``.

    ``sizes`` override the builder's defaults (e.g. ``image_size=224, image_seq_length=64`` for
    ``"gemma3-896"``); see :data:`KINDS` for which each kind takes. ``with_weights`` adds a
    random-weight float32 model of the real architecture and its full ``config.json``
    (:func:`mmfront.testing.weights.write_weights`). Returns ``folder``.
    """
    spec = KINDS.get(kind)
    if spec is None:
        raise ConfigError(f"unknown model kind {kind!r}: pass one of {sorted(KINDS)}")
    unknown = sorted(set(sizes) - set(spec.sizes))
    if unknown:
        raise ConfigError(f"{kind!r} takes no size {unknown}: pass only {list(spec.sizes)}")
    if with_weights:
        from mmfront.testing.weights import WEIGHT_KINDS, write_weights

        if kind not in WEIGHT_KINDS:
            raise ConfigError(f"no weights for model kind {kind!r}: pass one of {list(WEIGHT_KINDS)}")
    processor = spec.build(**sizes)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    processor.save_pretrained(str(folder))
    (folder / "config.json").write_text(json.dumps(_config_json(spec, processor), indent=2) + "\n", encoding="utf-8")
    if with_weights:
        write_weights(kind, processor, folder)
    return folder


def load_processor(folder: Path | str, **kwargs: Any) -> ProcessorMixin:
    """``AutoProcessor.from_pretrained(folder, **kwargs)``, as users load a model, after making
    the PIL image processors reachable on transformers versions whose auto-loading misses them."""
    from transformers import AutoProcessor

    from mmfront.processing.hf import make_pil_image_processors_reachable

    make_pil_image_processors_reachable()
    return AutoProcessor.from_pretrained(str(folder), **kwargs)


def mmfront_home() -> Path:
    """mmfront's per-user cache root: ``$MMFRONT_HOME``, else ``$XDG_CACHE_HOME/mmfront``, else
    ``~/.cache/mmfront``."""
    home = os.environ.get("MMFRONT_HOME")
    if home:
        return Path(home).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "mmfront"


def cached_model_dir(kind: str, *, with_weights: bool = False) -> Path:
    """A ready folder of ``kind`` at its default sizes in ``mmfront_home()/models``, built once
    (``with_weights``: with its random-weight model, in a folder of its own).

    The folder name carries :data:`FIXTURE_VERSION` and the transformers version, so a changed
    builder or a different transformers gets its own folder. The build goes to a temporary
    sibling that is renamed into place, so a reader never sees a half-written folder; when two
    processes race, one rename wins and the other's copy is discarded.
    """
    if kind not in KINDS:
        raise ConfigError(f"unknown model kind {kind!r}: pass one of {sorted(KINDS)}")
    root = mmfront_home() / "models"
    weights = f"-weights{WEIGHTS_VERSION}" if with_weights else ""
    final = root / f"{kind}{weights}-v{FIXTURE_VERSION}-transformers{importlib.metadata.version('transformers')}"
    if final.is_dir():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=root))
    try:
        build_model_folder(kind, tmp, with_weights=with_weights)
        try:
            tmp.rename(final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def default_model_dir() -> Path:
    """The embedded default model of ``make demo``: the ``"gemma3-896"`` folder (Gemma 3's real
    image size, token count, preprocessor values and token ids; no weights), built on first use."""
    return cached_model_dir(DEFAULT_MODEL_KIND)
