"""Lets a torchvision whose compiled ops cannot load (PyPI's CUDA build beside CPU torch) import.

transformers needs torchvision for every video processor and for each multimodal processor that
takes one (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, LLaVA-OneVision): without it those processors do not
construct. The torchvision wheel PyPI ships for a torch release is a CUDA build; beside the CPU
torch wheel its ``_C`` extension fails to load, which torchvision tolerates everywhere except
``torchvision/_meta_registrations.py``, whose two ``register_fake`` calls then raise "operator
torchvision::nms does not exist" and fail the whole import (and with it every transformers image
processor, PIL ones included). What transformers uses of torchvision (``transforms.v2``) is pure
torch.

:func:`install` puts a finder in front of the import system that, only when torchvision's own
ops did not load, defines the schemas of those two operators (no kernels: nothing mmfront runs
calls them) just before that module imports. With a working torchvision, or none, it does
nothing. docs/models.md ("torchvision") says why mmfront takes this path.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

_META_REGISTRATIONS = "torchvision._meta_registrations"
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_libraries: list[Any] = []
"""The ``torch.library.Library`` holding the schemas: the definitions live as long as it does."""


def define_missing_ops() -> bool:
    """Defines torchvision's ``nms``/``qnms`` schemas where its compiled ops did not load;
    whether it did."""
    import torch
    import torchvision.extension

    if torchvision.extension._has_ops() or _libraries:
        return False
    library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        library.define(schema)
    _libraries.append(library)
    return True


class TorchvisionOpsFinder:
    """A meta path finder that finds nothing: it runs :func:`define_missing_ops` when
    torchvision's fake-op registrations are about to import, then lets the normal finders
    load them."""

    def find_spec(self, name: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        if name == _META_REGISTRATIONS:
            # on failure torchvision's import fails as it would have without the finder
            with contextlib.suppress(ImportError, OSError, RuntimeError):
                define_missing_ops()
        return None


def install() -> None:
    """Puts the finder first on ``sys.meta_path`` (once); costs nothing until torchvision
    imports."""
    if not any(isinstance(finder, TorchvisionOpsFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, TorchvisionOpsFinder())
