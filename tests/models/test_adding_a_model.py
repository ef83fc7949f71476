"""Adding a model is one module, and its fixture one more: a throwaway model, written into a folder
that joins ``mmfront.models``' search path, is found by the catalog's scan with everything it
declares (processor and info, a config option, its reference encoder), its fixture module, written
into a folder on ``mmfront.fixtures.models``' path, by the fixture catalog's scan; and it serves a
request through ``InputPreprocessor`` from the folder its own fixture builder made. Nothing else
in mmfront names it (CONTRIBUTING.md, "Adding a model")."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from mmfront import InputPreprocessor, MultiModalConfig
from mmfront.errors import ConfigError
from mmfront.fixtures import catalog as fixture_catalog
from mmfront.models import catalog
from mmfront.models.registry import create_processor
from mmfront.testing.media import make_image
from mmfront.testing.models import build_model_folder

MODULE = '''
"""A throwaway LLaVA-style model (a model type no module declares): each <image> becomes ``tokens_per_image`` copies of itself."""

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mmfront.config import ModelOption
from mmfront.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec, ReferenceModel
from mmfront.parse import MultiModalDataItems
from mmfront.processing.hf import call_hf
from mmfront.processing.processor import BaseMultiModalProcessor, BaseProcessingInfo
from mmfront.processing.updates import PromptReplacement, PromptUpdate

TOKENS_PER_IMAGE = ModelOption("throwaway_tokens_per_image", 4, minimum=1, doc="placeholder tokens per image")


class ThrowawayInfo(BaseProcessingInfo):
    def get_supported_mm_limits(self) -> Mapping[str, int | None]:
        return {"image": None}


class ThrowawayProcessor(BaseMultiModalProcessor):
    def get_placeholder_str(self, modality: str, index: int) -> str:
        return "<image>"

    def _call_hf_processor(self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any]) -> dict[str, Any]:
        images = mm_items["image"].get_all()
        out = call_hf(self.info.hf_processor.image_processor, what="the image processor",
                      data_desc=f"{len(images)} image(s)", images=images, return_tensors="pt")
        return {"pixel_values": out["pixel_values"]}

    def _get_mm_fields_config(self, hf_inputs: Mapping[str, Any], hf_kwargs: Mapping[str, Any],
                              ) -> Mapping[str, MultiModalFieldConfig]:
        return {"pixel_values": MultiModalFieldConfig.batched("image")}

    def _get_prompt_updates(self, mm_items: MultiModalDataItems, hf_kwargs: Mapping[str, Any],
                            out_mm_kwargs: MultiModalKwargsItems) -> Sequence[PromptUpdate]:
        image = self.info.tokenizer.convert_tokens_to_ids("<image>")
        count = self.info.config.model_option(TOKENS_PER_IMAGE)
        return [PromptReplacement("image", [image], [image] * count)]


def encode_images(model: Any, modality: str, kwargs: Any, features: Sequence[Any]) -> list[torch.Tensor]:
    return [torch.zeros(4, 8) for _ in features]


THROWAWAY = register_model(ModelSpec(
    model_type="video_llava",
    hf_processor_class="LlavaNextProcessor",
    processor=ThrowawayProcessor,
    info=ThrowawayInfo,
    options=(TOKENS_PER_IMAGE,),
    reference=ReferenceModel(encode_images),
))
'''

FIXTURE_MODULE = '''
"""The throwaway model's offline fixture: a tiny LLaVA-NeXT processor."""

from typing import Any

from mmfront.fixtures.bpe import make_tokenizer
from mmfront.fixtures.catalog import register_fixtures
from mmfront.fixtures.kinds import ModelKind
from mmfront.fixtures.processors import image_processor_class


def make_throwaway_processor(image_size: int = 16) -> Any:
    from transformers import LlavaNextProcessor

    tokenizer = make_tokenizer(["<image>"], bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    image_processor = image_processor_class("clip", "CLIPImageProcessor")(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size})
    return LlavaNextProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=8,
                          vision_feature_select_strategy="default", image_token="<image>")


THROWAWAY_FIXTURES = register_fixtures({
    "throwaway": ModelKind("video_llava", "VideoLlavaForConditionalGeneration", "float32", make_throwaway_processor,
                           ("image_size",)),
})
'''

NAME = "mmfront.models.throwaway"
FIXTURE_NAME = "mmfront.fixtures.models.throwaway"


@pytest.fixture
def throwaway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The model module written into its own folder on ``mmfront.models.__path__``, its fixture
    module into one on ``mmfront.fixtures.models.__path__``; the catalogs' tables and the paths are
    restored afterwards."""
    catalog.model_specs()  # the built-in modules first, so the copies below hold them
    fixture_catalog.fixture_kinds()
    for table in ("_NATIVE", "_NATIVE_BY_MODEL_TYPE", "_MODELS"):
        monkeypatch.setattr(catalog, table, dict(getattr(catalog, table)))
    monkeypatch.setattr(fixture_catalog, "_KINDS", dict(fixture_catalog._KINDS))
    import mmfront.fixtures.models
    import mmfront.models

    for package, source in ((mmfront.models, MODULE), (mmfront.fixtures.models, FIXTURE_MODULE)):
        folder = tmp_path / package.__name__
        folder.mkdir()
        (folder / "throwaway.py").write_text(source, encoding="utf-8")
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
    assert "video_llava" in catalog.model_specs()  # found by the scans, nothing else told
    assert "throwaway" in fixture_catalog.fixture_kinds()
    yield sys.modules[NAME]
    del sys.modules[NAME], sys.modules[FIXTURE_NAME]


def test_one_module_declares_and_serves_a_model(throwaway: ModuleType, tmp_path: Path) -> None:
    folder = build_model_folder("throwaway", tmp_path / "folder")  # the module's own fixture builder
    pre = InputPreprocessor(folder, MultiModalConfig(model_impl="transformers"))
    assert type(pre.processor) is throwaway.ThrowawayProcessor
    out = pre.preprocess("<image> hello", {"image": [make_image(40, 30)]})
    image = pre.processor.info.tokenizer.convert_tokens_to_ids("<image>")
    assert out["prompt_token_ids"].count(image) == 4
    assert out["mm_placeholders"]["image"][0].length == 4
    assert out["mm_kwargs"]["image"][0]["pixel_values"].data.shape == (3, 16, 16)
    assert catalog.reference_model("video_llava") is throwaway.THROWAWAY.reference


def test_the_module_declares_its_own_config_option(throwaway: ModuleType, tmp_path: Path) -> None:
    folder = build_model_folder("throwaway", tmp_path / "folder", image_size=8)
    pre = InputPreprocessor(folder, MultiModalConfig(model_options={"throwaway_tokens_per_image": 2}, model_impl="transformers"))
    out = pre.preprocess("<image>", {"image": [make_image(40, 30)]})
    assert out["mm_placeholders"]["image"][0].length == 2
    with pytest.raises(ConfigError, match=r"model_options.throwaway_tokens_per_image must be an integer >= 1, got 0"):
        create_processor(folder, MultiModalConfig(model_options={"throwaway_tokens_per_image": 0}, model_impl="transformers"))


def test_an_option_no_model_declares_is_refused(gemma3_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"has 'max_pan_and_scan_crop', which no installed model declares\. "
                                          r"Did you mean 'max_pan_and_scan_crops'\?"):
        create_processor(gemma3_dir, MultiModalConfig(model_options={"max_pan_and_scan_crop": 4}))


def test_a_name_declared_twice_is_refused(throwaway: ModuleType) -> None:
    with pytest.raises(ConfigError, match=r"model type 'video_llava', option 'throwaway_tokens_per_image' of "
                                          r"'video_llava' already declared"):
        catalog.register_model(throwaway.THROWAWAY)
    with pytest.raises(ConfigError, match=r"fixture kind 'throwaway' already declared by another module"):
        fixture_catalog.register_fixtures(sys.modules[FIXTURE_NAME].THROWAWAY_FIXTURES)
