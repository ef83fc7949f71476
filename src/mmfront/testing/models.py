"""Offline model folders: the tiny processors saved the way a checkpoint ships them, plus the
embedded default model of ``make demo``.

A folder holds what ``save_pretrained`` writes for the processor and its tokenizer, plus a minimal
``config.json`` (``model_type``, ``architectures``, ``torch_dtype`` and the keys its kind adds) so a
loader can learn the model type and dtype from the folder alone. It loads back with
``transformers.AutoProcessor.from_pretrained``, exactly as users load a downloaded model;
:func:`load_processor` does that and also works around one transformers 5.14.1 bug.

The kinds come from two places (:func:`model_kinds`): each model module declares its own
(``ModelSpec.fixtures``, e.g. ``gemma3`` and ``gemma3-896``), and this module adds the processors
of :mod:`mmfront.testing.processors` that the transformers backend serves.

Importing this module does not import transformers: :func:`default_model_dir` on a warm cache
costs a few ``stat`` calls.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from mmfront.errors import ConfigError
from mmfront.fixtures.kinds import TEXT_TOWER, VISION_TOWER, ModelKind, special_token_ids
from mmfront.models.registry import fixture_kinds

if TYPE_CHECKING:
    from transformers import PretrainedConfig, ProcessorMixin

__all__ = [
    "DEFAULT_MODEL_KIND",
    "FIXTURE_VERSION",
    "build_model_folder",
    "cached_model_dir",
    "default_model_dir",
    "load_processor",
    "mmfront_home",
    "model_kinds",
]

#: Bump whenever a builder's output changes: cached default models are keyed by it.
FIXTURE_VERSION = "2"

#: Bump whenever the weights builder's output changes (cached folders with weights are keyed by it).
WEIGHTS_VERSION = "1"

#: The default model of ``make demo`` and the benchmarks.
DEFAULT_MODEL_KIND = "gemma3-896"


def _processors() -> ModuleType:
    from mmfront.testing import processors  # imports transformers: only when a folder is built

    return processors


def _idefics3_weights(processor: Any) -> PretrainedConfig:
    from transformers import Idefics3Config

    tok = processor.tokenizer
    tile = processor.image_processor.max_image_size["longest_edge"]
    scale = 2
    side = math.isqrt(processor.image_seq_len)
    if side * side != processor.image_seq_len or tile % (scale * side):
        raise ConfigError(
            f"Idefics3 weights need image_seq_len a square number (got {processor.image_seq_len}) and a tile size "
            f"divisible by {scale} times its root (got {tile}).")
    return Idefics3Config(
        vision_config={**VISION_TOWER, "image_size": tile, "patch_size": tile // (scale * side)},
        text_config={**TEXT_TOWER, **special_token_ids(tok), "model_type": "llama", "vocab_size": len(tok),
                     "tie_word_embeddings": False},
        scale_factor=scale,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        # a keyword the config takes through **kwargs: its default 128002 lies outside the vocabulary
        **{"pad_token_id": tok.pad_token_id},
        tie_word_embeddings=False,
    )


def _qwen2_audio_weights(processor: Any) -> PretrainedConfig:
    from transformers import Qwen2AudioConfig

    tok = processor.tokenizer
    extractor = processor.feature_extractor
    return Qwen2AudioConfig(
        audio_config={"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
                      "num_mel_bins": extractor.feature_size, "max_source_positions": extractor.nb_max_frames // 2},
        text_config={**TEXT_TOWER, **special_token_ids(tok), "model_type": "qwen2", "vocab_size": len(tok),
                     "tie_word_embeddings": False},
        audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"),
    )


_AUDIO = ("feature_size", "chunk_length", "sampling_rate")

#: The transformers backend's kinds, float32 so their outputs compare bit-exact with the HF
#: processor's. Emu3 has no weights: its image "encoder" is a VQ-VAE tokenizer whose codes become
#: ordinary prompt tokens, not embeddings scattered into placeholder positions.
_BACKEND_KINDS: dict[str, ModelKind] = {
    "idefics3": ModelKind(
        "idefics3", "Idefics3ForConditionalGeneration", "float32",
        lambda **sizes: _processors().make_idefics3_processor(**sizes),
        ("patch_size", "max_splits_per_side", "image_seq_len"), weights_config=_idefics3_weights,
    ),
    "emu3": ModelKind(
        "emu3", "Emu3ForConditionalGeneration", "float32", lambda **sizes: _processors().make_emu3_processor(**sizes),
        ("min_pixels", "max_pixels", "spatial_factor"),
    ),
    "qwen2_audio": ModelKind(
        "qwen2_audio", "Qwen2AudioForConditionalGeneration", "float32",
        lambda **sizes: _processors().make_qwen2_audio_processor(**sizes), _AUDIO,
        weights_config=_qwen2_audio_weights, stop_tokens=("<|im_end|>",),
    ),
    "glmasr": ModelKind(
        "glmasr", "GlmAsrForConditionalGeneration", "float32",
        lambda **sizes: _processors().make_glmasr_processor(**sizes), _AUDIO,
    ),
}


def model_kinds() -> dict[str, ModelKind]:
    """Every kind :func:`build_model_folder` knows, by name: the model modules' own fixtures and
    the transformers backend's kinds of :mod:`mmfront.testing.processors`."""
    return {**fixture_kinds(), **_BACKEND_KINDS}


def _config_json(kind: ModelKind, processor: ProcessorMixin) -> dict[str, Any]:
    """What a loader reads from ``config.json``."""
    return {
        "architectures": [kind.architecture],
        "model_type": kind.model_type,
        "torch_dtype": kind.torch_dtype,
        **kind.config_keys(processor),
    }


def build_model_folder(kind: str, folder: Path, *, with_weights: bool = False, **sizes: int) -> Path:
    """Save the ``kind`` processor (with its tokenizer) and a minimal ``config.json`` into ``folder``.

    ``sizes`` override the builder's defaults (e.g. ``image_size=224, image_seq_length=64`` for
    ``"gemma3-896"``); see :func:`model_kinds` for which each kind takes. ``with_weights`` adds a
    random-weight float32 model of the real architecture and its full ``config.json``
    (:func:`mmfront.testing.weights.write_weights`). Returns ``folder``.
    """
    kinds = model_kinds()
    spec = kinds.get(kind)
    if spec is None:
        raise ConfigError(f"unknown model kind {kind!r}: pass one of {sorted(kinds)}")
    unknown = sorted(set(sizes) - set(spec.sizes))
    if unknown:
        raise ConfigError(f"{kind!r} takes no size {unknown}: pass only {list(spec.sizes)}")
    if with_weights:
        from mmfront.testing.weights import weight_kinds, write_weights

        if spec.weights_config is None:
            raise ConfigError(f"no weights for model kind {kind!r}: pass one of {list(weight_kinds())}")
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
    root = mmfront_home() / "models"
    weights = f"-weights{WEIGHTS_VERSION}" if with_weights else ""
    final = root / f"{kind}{weights}-v{FIXTURE_VERSION}-transformers{importlib.metadata.version('transformers')}"
    if final.is_dir():  # before looking the kind up, which imports the model modules
        return final
    kinds = model_kinds()
    if kind not in kinds:
        raise ConfigError(f"unknown model kind {kind!r}: pass one of {sorted(kinds)}")
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
