"""Project-wide pytest fixtures: offline model folders and the processors loaded from them.

Every fixture is session-scoped and lazy: a folder is built (``build_model_folder``) into a
``tmp_path_factory`` directory the first time a test asks for it, and its processor is loaded the
way users load one (``AutoProcessor.from_pretrained(folder)``, via ``load_processor``). The loaded
processors are shared by the whole session: do not mutate them; build your own with
``mmfront.testing.processors`` when a test needs different settings.

``@pytest.mark.hf_version(">=5.15", reason="...")`` runs a test only when the installed
transformers matches the PEP 440 specifier, and otherwise skips it with the reason and the
installed version. The ``hf_version`` fixture is the installed version itself.

``preloaded_lane_parents`` (module-scoped, for ``pytestmark = pytest.mark.usefixtures(...)``) starts
the processing lanes' parents of a module from the suite's preloaded interpreter
(``lane_processes.preloaded_lane_parents``).
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import mmfront  # noqa: F401  first: a test module may import transformers, and torchvision with it (docs/models.md)

if TYPE_CHECKING:
    from transformers import ProcessorMixin

HF_VERSION = Version(importlib.metadata.version("transformers"))

# Tests build every model offline; a hub lookup would be a bug, so make it fail fast.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "hf_version(spec, reason): run only when the installed transformers matches the PEP 440 "
        "specifier spec (e.g. '>=5.15'); otherwise skip, citing reason and the installed version",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers(name="hf_version"):
        reason = mark.kwargs.get("reason")
        if len(mark.args) != 1 or not reason:
            raise pytest.UsageError(
                f"{item.nodeid}: write @pytest.mark.hf_version('>=X.Y', reason='why the fact differs by version')"
            )
        spec = SpecifierSet(mark.args[0])
        if not spec.contains(HF_VERSION, prereleases=True):
            pytest.skip(f"needs transformers{spec}, installed {HF_VERSION}: {reason}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Modules with a ``slow`` test first, then the others, each group by descending test count.

    ``make test`` runs ``--dist loadscope --no-loadscope-reorder``, so the two workers take modules
    in this order. xdist's own order (descending test count) dealt the slow modules of one test
    last, and the last of them kept one worker running after the other had finished
    (``tests/serve/test_bench_soak_http.py``: ~34 s). A test's own order within its module stays."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    order = sorted(modules.values(), key=lambda tests: (not any(t.get_closest_marker("slow") for t in tests), -len(tests)))
    items[:] = [item for tests in order for item in tests]


@pytest.fixture(scope="module")
def preloaded_lane_parents() -> Iterator[None]:
    from lane_processes import preloaded_lane_parents

    with preloaded_lane_parents():
        yield


@pytest.fixture(scope="session")
def hf_version() -> Version:
    """The installed transformers version."""
    return HF_VERSION


def _build(kind: str, factory: pytest.TempPathFactory) -> Path:
    from mmfront.testing.models import build_model_folder

    return build_model_folder(kind, factory.mktemp(kind))


def _load(folder: Path) -> ProcessorMixin:
    from mmfront.testing.models import load_processor

    return load_processor(folder)


@pytest.fixture(scope="session")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Gemma3: 32 px images, 16 soft tokens per image."""
    return _build("gemma3", tmp_path_factory)


@pytest.fixture(scope="session")
def gemma3_processor(gemma3_dir: Path) -> ProcessorMixin:
    return _load(gemma3_dir)


@pytest.fixture(scope="session")
def gemma3_896_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma3 at real sizes and ids (896 px, 256 tokens, vocabulary 262145); ~1 s to build."""
    return _build("gemma3-896", tmp_path_factory)


@pytest.fixture(scope="session")
def gemma3_896_processor(gemma3_896_dir: Path) -> ProcessorMixin:
    return _load(gemma3_896_dir)


@pytest.fixture(scope="session")
def idefics3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Idefics3: 32 px tiles, up to 2x2 splits plus a global tile, 4 tokens per tile."""
    return _build("idefics3", tmp_path_factory)


@pytest.fixture(scope="session")
def idefics3_processor(idefics3_dir: Path) -> ProcessorMixin:
    return _load(idefics3_dir)


@pytest.fixture(scope="session")
def emu3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Emu3: 256..4096 pixels, spatial factor 8."""
    return _build("emu3", tmp_path_factory)


@pytest.fixture(scope="session")
def emu3_processor(emu3_dir: Path) -> ProcessorMixin:
    return _load(emu3_dir)


@pytest.fixture(scope="session")
def qwen2_audio_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Qwen2-Audio: 16 mel bins, 2 s windows. It reports offsets only from transformers 5.16:
    mark tests that need them with ``hf_version(">=5.16", ...)``."""
    return _build("qwen2_audio", tmp_path_factory)


@pytest.fixture(scope="session")
def qwen2_audio_processor(qwen2_audio_dir: Path) -> ProcessorMixin:
    return _load(qwen2_audio_dir)


@pytest.fixture(scope="session")
def glmasr_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny GLM-ASR: 16 mel bins, 2 s windows; one audio per text sample."""
    return _build("glmasr", tmp_path_factory)


@pytest.fixture(scope="session")
def glmasr_processor(glmasr_dir: Path) -> ProcessorMixin:
    return _load(glmasr_dir)


def _build_with_weights(kind: str, factory: pytest.TempPathFactory) -> Path:
    from mmfront.testing.models import build_model_folder

    return build_model_folder(kind, factory.mktemp(f"{kind}-weights"), with_weights=True)


@pytest.fixture(scope="session")
def gemma3_weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Gemma3 folder plus a random-weight float32 ``Gemma3ForConditionalGeneration``."""
    return _build_with_weights("gemma3", tmp_path_factory)


@pytest.fixture(scope="session")
def idefics3_weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Idefics3 folder plus a random-weight float32 ``Idefics3ForConditionalGeneration``."""
    return _build_with_weights("idefics3", tmp_path_factory)


@pytest.fixture(scope="session")
def qwen2_audio_weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2-Audio folder plus a random-weight float32 ``Qwen2AudioForConditionalGeneration``."""
    return _build_with_weights("qwen2_audio", tmp_path_factory)
