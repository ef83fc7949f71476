"""The offline model folders ``mmfront fixtures`` writes, so a user can try ``mmfront serve`` on any
served family without a download: the fixture kinds (:func:`~mmfront.fixtures.catalog.fixture_kinds`,
the tests' folders, some with a random-weight model the reference worker runs) and every HF
processor class the coverage survey builds (``docs/models.md``'s table: processor, tokenizer and
``config.json``, no weights). Both are the builders the tests use, so a folder written here is the
folder the suite proves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mmfront.errors import ConfigError
from mmfront.fixtures.catalog import fixture_kinds
from mmfront.testing.coverage import HOOKED_PROCESSORS, build_processor_folder
from mmfront.testing.models import build_model_folder

__all__ = ["Family", "build_family_folder", "families"]


@dataclass(frozen=True)
class Family:
    """One folder ``mmfront fixtures build`` writes."""

    name: str
    """A fixture kind (``gemma3``, ``qwen2_5_vl``) or an HF processor class (``LlavaProcessor``)."""
    source: Literal["fixture kind", "HF processor"]
    model_type: str | None
    """``config.json``'s ``model_type`` (``None`` for a processor class: known once it is built)."""
    weights: bool
    """Whether ``--weights`` adds a random-weight model (then the reference worker serves it)."""


def families() -> dict[str, Family]:
    """Every family by name: the fixture kinds first, then the survey's processor classes."""
    kinds = {name: Family(name, "fixture kind", kind.model_type, kind.weights_config is not None)
             for name, kind in sorted(fixture_kinds().items())}
    return {**kinds, **{name: Family(name, "HF processor", None, False) for name in HOOKED_PROCESSORS}}


def build_family_folder(name: str, folder: Path, *, with_weights: bool = False) -> Path:
    """Write ``name``'s offline folder into ``folder`` (which must not exist, or be empty); returns it.
    Raises :class:`~mmfront.errors.ConfigError` for an unknown name, weights a family has none of,
    or a ``folder`` holding files."""
    known = families()
    family = known.get(name)
    if family is None:
        raise ConfigError(f"no fixture family {name!r}; 'mmfront fixtures list' names them all (e.g. "
                          f"{', '.join(list(known)[:4])}).")
    if with_weights and not family.weights:
        with_weights_names = [f.name for f in known.values() if f.weights]
        raise ConfigError(f"{name!r} has no random-weight model; --weights takes one of {', '.join(with_weights_names)}.")
    folder = Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError(f"{folder} exists and is not an empty folder; pass a new one.")
    if family.source == "fixture kind":
        return build_model_folder(name, folder, with_weights=with_weights)
    return build_processor_folder(name, folder)
