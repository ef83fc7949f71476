"""``@register_processor``: names are checked against transformers at registration, each name is
registered once, and a registered processor is what ``create_processor`` builds."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront.errors import ConfigError, InputTypeError
from mmfront.models import ModelSpec, catalog
from mmfront.models.catalog import register_processor
from mmfront.models.gemma3 import Gemma3MultiModalProcessor, Gemma3ProcessingInfo
from mmfront.models.registry import create_processor, resolve_factory
from mmfront.models.transformers import LegacyMultiModalProcessor, MultiModalProcessor, TransformersProcessingInfo


class MyInfo(TransformersProcessingInfo):
    pass


@pytest.fixture
def tables(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """The registry tables, restored after the test (built-ins registered first, so a built-in
    first imported inside the test does not land in the copy only)."""
    catalog.model_specs()
    native, by_type = dict(catalog._NATIVE), dict(catalog._NATIVE_BY_MODEL_TYPE)
    monkeypatch.setattr(catalog, "_NATIVE", native)
    monkeypatch.setattr(catalog, "_NATIVE_BY_MODEL_TYPE", by_type)
    monkeypatch.setattr(catalog, "_MODELS", dict(catalog._MODELS))
    yield native, by_type


def snapshot(tables: tuple[Mapping[str, Any], Mapping[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    return dict(tables[0]), dict(tables[1])


def test_gemma3_registers_itself(gemma3_processor: Any) -> None:
    for factory in (resolve_factory(gemma3_processor, MultiModalConfig()),
                    resolve_factory(object(), MultiModalConfig(), model_type="gemma3")):
        assert (factory.processor_cls, factory.info_cls) == (Gemma3MultiModalProcessor, Gemma3ProcessingInfo)


def test_registered_processor_serves_its_class_and_model_type(tables: Any, idefics3_dir: Path,
                                                             idefics3_processor: Any) -> None:
    @register_processor("Idefics3Processor", info=MyInfo, model_types="idefics3")
    class MyProcessor(MultiModalProcessor):  # type: ignore[valid-type,misc]
        pass

    assert MyProcessor.__name__ == "MyProcessor"  # the decorator returns the class itself
    proc = create_processor(idefics3_dir, MultiModalConfig(model_impl="transformers"))
    assert type(proc) is MyProcessor and type(proc.info) is MyInfo
    assert proc.info.get_hf_config().model_type == "idefics3"
    by_type = resolve_factory(object(), MultiModalConfig(), model_type="idefics3")
    assert (by_type.processor_cls, by_type.info_cls) == (MyProcessor, MyInfo)


def test_class_outside_the_auto_mapping_is_accepted(tables: Any) -> None:
    # transformers has DonutProcessor, but its AutoProcessor mapping does not list it
    register_processor("DonutProcessor", info=MyInfo)(MultiModalProcessor)
    assert tables[0]["DonutProcessor"].processor_cls is MultiModalProcessor


def test_misspelled_processor_class_is_refused_with_the_known_names(tables: Any) -> None:
    before = snapshot(tables)
    with pytest.raises(ConfigError) as caught:
        register_processor("Gemma3Procesor", info=MyInfo)
    message = str(caught.value)
    assert message.startswith("register_processor: 'Gemma3Procesor' is not an HF processor class transformers ")
    assert "Did you mean 'Gemma3Processor'" in message
    known = message.split("Known HF processor classes: ")[1].rstrip(".").split(", ")
    assert {"Gemma3Processor", "Idefics3Processor", "Emu3Processor", "Qwen2AudioProcessor",
            "GlmAsrProcessor"} <= set(known)
    assert known == sorted(known)
    assert snapshot(tables) == before


def test_misspelled_model_type_is_refused(tables: Any) -> None:
    before = snapshot(tables)
    with pytest.raises(ConfigError) as caught:
        register_processor("Idefics3Processor", info=MyInfo, model_types=("idefics3", "gema3"))
    message = str(caught.value)
    assert message.startswith("register_processor: 'gema3' is not a model type transformers ")
    assert "Did you mean 'gemma3'" in message and "keys of transformers' CONFIG_MAPPING_NAMES" in message
    assert snapshot(tables) == before


def test_name_without_close_match_still_lists_the_known_names(tables: Any) -> None:
    with pytest.raises(ConfigError, match="Known HF processor classes: ") as caught:
        register_processor("Qqqqqqqq", info=MyInfo)
    assert "Did you mean" not in str(caught.value)


def test_duplicate_processor_class_is_refused(tables: Any) -> None:
    before = snapshot(tables)
    with pytest.raises(ConfigError) as caught:
        register_processor("Gemma3Processor", info=MyInfo)(LegacyMultiModalProcessor)
    message = str(caught.value)
    assert ("cannot register LegacyMultiModalProcessor: HF processor class 'Gemma3Processor' is already served by "
            "Gemma3MultiModalProcessor") in message
    assert "(registered classes: [" in message and "'Gemma3Processor'" in message
    assert snapshot(tables) == before


def test_duplicate_model_type_leaves_nothing_registered(tables: Any) -> None:
    before = snapshot(tables)
    with pytest.raises(ConfigError, match="model type 'gemma3' is already served by Gemma3MultiModalProcessor"):
        register_processor("PaliGemmaProcessor", info=MyInfo, model_types=("paligemma", "gemma3"))(MultiModalProcessor)
    assert snapshot(tables) == before


def test_model_type_named_twice_is_refused(tables: Any) -> None:
    with pytest.raises(ConfigError, match=r"model_types \['paligemma', 'paligemma'\] names a model type twice"):
        register_processor("PaliGemmaProcessor", info=MyInfo, model_types=("paligemma", "paligemma"))


def test_registering_twice_is_refused(tables: Any) -> None:
    register_processor("PaliGemmaProcessor", info=MyInfo, model_types=("paligemma",))(MultiModalProcessor)
    with pytest.raises(ConfigError, match="'PaliGemmaProcessor' is already served by"):
        register_processor("PaliGemmaProcessor", info=MyInfo, model_types=("paligemma",))(MultiModalProcessor)


def test_wrong_types_are_refused(tables: Any) -> None:
    with pytest.raises(InputTypeError, match="takes a BaseProcessingInfo subclass, got <class 'dict'>"):
        register_processor("PaliGemmaProcessor", info=dict)  # type: ignore[arg-type]
    with pytest.raises(InputTypeError, match="decorates a BaseMultiModalProcessor subclass"):
        register_processor("PaliGemmaProcessor", info=MyInfo)(dict)  # type: ignore[type-var]
    assert "PaliGemmaProcessor" not in tables[0]


def test_the_catalog_finds_every_model_module_by_scanning_the_package() -> None:
    specs = catalog.model_specs()
    assert {"gemma3", "idefics3", "qwen2_audio"} <= set(specs)
    gemma3 = specs["gemma3"]
    assert (gemma3.processor, gemma3.info) == (Gemma3MultiModalProcessor, Gemma3ProcessingInfo)
    from transformers import Gemma3Processor, Idefics3Processor

    class MyGemma3Processor(Gemma3Processor):
        pass

    for cls in (Gemma3Processor, MyGemma3Processor):
        assert catalog.backend_placeholder_attr(cls, "image") == "boi_token"
    assert catalog.backend_placeholder_attr(Idefics3Processor, "image") is None


def test_importing_mmfront_imports_no_model_module() -> None:
    code = ("import sys, mmfront, mmfront.testing.models; "
            "print(sorted(m for m in sys.modules if m.startswith('mmfront.models.') and m not in "
            "('mmfront.models.catalog', 'mmfront.models.native', 'mmfront.models.registry', 'mmfront.models.spec')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"


def test_every_model_option_is_in_the_configuration_reference() -> None:
    """docs/index.md's model options table lists exactly the declared options, with their defaults."""
    text = (Path(__file__).parents[2] / "docs" / "index.md").read_text(encoding="utf-8")
    table = text.split("Model options (`model_options`)", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|")[1:-1] for line in table.splitlines()[2:]]
    documented = {cells[0].strip().strip("`"): cells[2].strip().strip("`") for cells in rows}
    assert documented == {name: str(o.default) for name, o in catalog.model_options().items()}


def test_a_model_spec_needs_both_processor_and_info(tables: Any) -> None:
    with pytest.raises(ConfigError, match="gives a processor without info or info without a processor"):
        catalog.register_model(ModelSpec("aya_vision", "AyaVisionProcessor", processor=MultiModalProcessor))
    with pytest.raises(InputTypeError, match="register_model takes a ModelSpec"):
        catalog.register_model("aya_vision")  # type: ignore[arg-type]
    assert "aya_vision" not in catalog._MODELS


def test_a_model_spec_newer_than_the_installed_transformers_is_registered_unchecked(tables: Any) -> None:
    """``transformers_since`` newer than the installed release: the names cannot be checked (no folder of
    the model loads there) and the spec is registered; from that release on, they are checked."""
    import transformers

    future = ModelSpec("future_vlm", "FutureVLMProcessor", transformers_since="999.0")
    assert catalog.register_model(future) is future and catalog._MODELS["future_vlm"] is future
    with pytest.raises(ConfigError, match="'FutureVLMProcessor' is not an HF processor class"):
        catalog.register_model(ModelSpec("past_vlm", "FutureVLMProcessor", transformers_since=transformers.__version__))
    assert "past_vlm" not in catalog._MODELS
