"""Offline model folders: the tiny processors saved the way a checkpoint ships them, plus the
embedded default model of ``make demo``.

A folder holds what ``save_pretrained`` writes for the processor and its tokenizer, plus a minimal
``config.json`` (``model_type``, ``architectures``, ``torch_dtype`` and the keys its kind adds) so a
loader can learn the model type and dtype from the folder alone. It loads back with
``transformers.AutoProcessor.from_pretrained``, exactly as users load a downloaded model;
:func:`load_processor` does that and also works around one transformers 5.14.1 bug.

Each model's fixture module declares its kinds (``gemma3`` and ``gemma3-896`` in
``mmfront.fixtures.models.gemma3``); :func:`~mmfront.fixtures.catalog.fixture_kinds` finds them all.

Importing this module does not import transformers: :func:`default_model_dir` on a warm cache
costs a few ``stat`` calls.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mmfront.errors import ConfigError
from mmfront.fixtures.catalog import fixture_kinds
from mmfront.fixtures.kinds import ModelKind

if TYPE_CHECKING:
    from transformers import ProcessorMixin

__all__ = [
    "DEFAULT_MODEL_KIND",
    "FIXTURE_VERSION",
    "build_model_folder",
    "cached_model_dir",
    "default_model_dir",
    "fixture_model_impl",
    "load_processor",
    "mmfront_home",
]

#: Bump whenever a builder's output changes: cached default models are keyed by it.
FIXTURE_VERSION = "2"

#: Bump whenever the weights builder's output changes (cached folders with weights are keyed by it).
WEIGHTS_VERSION = "1"

#: The default model of ``make demo`` and the benchmarks.
DEFAULT_MODEL_KIND = "gemma3-896"


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
    ``"gemma3-896"``); see :func:`~mmfront.fixtures.catalog.fixture_kinds` for which each kind takes. ``with_weights`` adds a
    random-weight float32 model of the real architecture and its full ``config.json``
    (:func:`mmfront.testing.weights.write_weights`). Returns ``folder``.
    """
    kinds = fixture_kinds()
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
    from transformers.utils import logging as hf_logging

    # The builders exercise deprecated paths on purpose (5.14.1 Gemma3 image_token, Whisper
    # sampling rate); their warnings would bury real test output.
    hf_logging.set_verbosity_error()
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


def fixture_model_impl(kind: str) -> Literal["auto", "transformers"]:
    """``--model-impl`` a user serves ``kind`` with on the installed transformers: ``auto``, or
    ``transformers`` where vLLM's native class is refused for its family there (the Legacy backend,
    transformers < 5.15, for a family whose ``NativeInputs.legacy_mismatch`` says why)."""
    from mmfront.models.catalog import model_specs
    from mmfront.models.transformers import OFFSETS_MIN_VERSION, TRANSFORMERS_VERSION

    spec = model_specs().get(fixture_kinds()[kind].model_type)
    refused = spec is not None and spec.native is not None and bool(spec.native.legacy_mismatch)
    return "transformers" if refused and TRANSFORMERS_VERSION < OFFSETS_MIN_VERSION else "auto"


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
    if final.is_dir():  # before looking the kind up, which imports the fixture modules
        return final
    kinds = fixture_kinds()
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
