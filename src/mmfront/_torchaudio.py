"""Lets a torchaudio whose compiled extension cannot load (PyPI's CUDA build beside CPU torch) import.

Granite Speech's and FunASR-Nano's feature extractors in transformers compute their log-mel
features with ``torchaudio.transforms.MelSpectrogram``, which is pure torch (``torch.stft``).
PyPI has no torchaudio built for torch 2.13; the newest (2.11.1) is a CUDA build whose
``_torchaudio.so`` does not load beside CPU torch, and torchaudio, unlike torchvision, lets that
failure abort its import (``torchaudio/_extension/__init__.py`` calls ``_load_lib`` unguarded), so
those two processors do not construct.

:func:`install` puts a finder in front of the import system that, when
``torchaudio._extension.utils`` imports, wraps its ``_load_lib`` so that a library which fails to
load is reported as absent (``False``, torchaudio's own answer for an extension it was deployed
without) instead of raising. torchaudio then imports with ``_IS_TORCHAUDIO_EXT_AVAILABLE`` false;
only its compiled features (forced alignment, CTC decoders, which nothing mmfront runs uses) are
missing, and they say so when called. With a torchaudio whose extension loads, or none, nothing
changes. docs/models.md ("torchaudio") says why mmfront takes this path.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib.abc import Loader
from importlib.machinery import ModuleSpec, PathFinder
from types import ModuleType

_EXTENSION_UTILS = "torchaudio._extension.utils"


def tolerate_unloadable(load_lib: Callable[[str], bool]) -> Callable[[str], bool]:
    """``load_lib`` answering ``False`` where the library is there but does not load."""

    def load_or_report_absent(lib: str) -> bool:
        try:
            return load_lib(lib)
        except OSError:
            return False

    return load_or_report_absent


class _TolerantUtilsLoader(Loader):
    """Runs the real loader, then wraps the module's ``_load_lib``."""

    def __init__(self, loader: Loader) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        load_lib = getattr(module, "_load_lib", None)
        if callable(load_lib):
            module._load_lib = tolerate_unloadable(load_lib)  # type: ignore[attr-defined]


class TorchaudioExtensionFinder:
    """A meta path finder for ``torchaudio._extension.utils`` only: the spec the path finder
    gives, with a loader that makes ``_load_lib`` tolerant."""

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if name != _EXTENSION_UTILS:
            return None
        spec = PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _TolerantUtilsLoader(spec.loader)
        return spec


def install() -> None:
    """Puts the finder first on ``sys.meta_path`` (once); costs nothing until torchaudio imports."""
    if not any(isinstance(finder, TorchaudioExtensionFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, TorchaudioExtensionFinder())
