"""``BaseProcessingInfo``'s vLLM accessors on every model of the suite, loaded from its folder.

The backend models run under the backend the installed transformers selects (Legacy on 5.14.1,
Offsets from 5.15) and again under Legacy forced, so both classes are covered on either version.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront.errors import ConfigError
from mmfront.models.registry import create_processor
from mmfront.models.transformers import LegacyMultiModalProcessor, MultiModalProcessor, TransformersProcessingInfo
from mmfront.processing.processor import BaseProcessingInfo

# (fixture holding the folder, HF processor class, config class, model_type)
SUITE = {
    "gemma3": ("gemma3_dir", "Gemma3Processor", "Gemma3Config", "gemma3"),
    "idefics3": ("idefics3_dir", "Idefics3Processor", "Idefics3Config", "idefics3"),
    "emu3": ("emu3_dir", "Emu3Processor", "Emu3Config", "emu3"),
    "qwen2_audio": ("qwen2_audio_dir", "Qwen2AudioProcessor", "Qwen2AudioConfig", "qwen2_audio"),
    "glmasr": ("glmasr_dir", "GlmAsrProcessor", "GlmAsrConfig", "glmasr"),
}
BACKEND_KINDS = [kind for kind in SUITE if kind != "gemma3"]


def check_accessors(proc: Any, folder: Path, kind: str) -> None:
    _, processor_cls, config_cls, model_type = SUITE[kind]
    info = proc.info
    hf = info.get_hf_processor()
    assert hf is info.hf_processor and type(hf).__name__ == processor_cls
    assert info.get_tokenizer() is hf.tokenizer is info.tokenizer
    config = info.get_hf_config()
    assert (type(config).__name__, config.model_type) == (config_cls, model_type)
    assert info.get_hf_config() is config  # read once
    assert info.model_id == str(folder)


def test_native_gemma3(gemma3_dir: Path) -> None:
    proc = create_processor(gemma3_dir)
    assert type(proc).__name__ == "Gemma3MultiModalProcessor"
    check_accessors(proc, gemma3_dir, "gemma3")


@pytest.mark.parametrize("kind", BACKEND_KINDS)
def test_transformers_backend_as_selected_by_version(kind: str, request: pytest.FixtureRequest) -> None:
    folder = request.getfixturevalue(SUITE[kind][0])
    proc = create_processor(folder, MultiModalConfig(model_impl="transformers"))
    assert type(proc) is MultiModalProcessor
    check_accessors(proc, folder, kind)


@pytest.mark.parametrize("kind", BACKEND_KINDS)
def test_transformers_backend_legacy_forced(kind: str, request: pytest.FixtureRequest) -> None:
    folder = request.getfixturevalue(SUITE[kind][0])
    proc = create_processor(folder, MultiModalConfig(transformers_backend="legacy", model_impl="transformers"))
    assert type(proc) is LegacyMultiModalProcessor
    check_accessors(proc, folder, kind)


def test_model_id_is_the_one_given(idefics3_dir: Path) -> None:
    assert create_processor(idefics3_dir, MultiModalConfig(model_impl="transformers"), model_id="HuggingFaceTB/SmolVLM").info.model_id == "HuggingFaceTB/SmolVLM"


def test_hf_processor_with_overrides_is_loaded_from_the_folder_and_kept(idefics3_dir: Path) -> None:
    info = create_processor(idefics3_dir, MultiModalConfig(model_impl="transformers")).info
    variant = info.get_hf_processor(image_seq_len=9)
    assert variant is not info.hf_processor and variant.image_seq_len == 9
    assert info.hf_processor.image_seq_len == 4  # the serving processor is untouched
    assert variant.tokenizer is info.get_tokenizer()
    assert info.get_hf_processor(image_seq_len=9) is variant
    assert info.get_hf_processor(image_seq_len=9, tokenizer=object()) is variant  # the tokenizer stays the info's
    assert info.get_hf_processor(tokenizer=object()) is info.hf_processor


def test_gemma3_processor_override(gemma3_dir: Path) -> None:
    info = create_processor(gemma3_dir).info
    assert info.get_hf_processor(do_pan_and_scan=True).image_processor.do_pan_and_scan is True
    assert not info.hf_processor.image_processor.do_pan_and_scan


def test_processor_variants_are_bounded(idefics3_dir: Path) -> None:
    info = create_processor(idefics3_dir, MultiModalConfig(model_impl="transformers")).info
    first = info.get_hf_processor(image_seq_len=1)
    last = None
    for n in range(2, 10):  # eight more: the oldest (the first) is dropped
        last = info.get_hf_processor(image_seq_len=n)
    assert info.get_hf_processor(image_seq_len=9) is last
    again = info.get_hf_processor(image_seq_len=1)
    assert again is not first and again.image_seq_len == 1


def test_processor_without_folder(idefics3_processor: Any) -> None:
    info = TransformersProcessingInfo(idefics3_processor, model_id="tiny")
    assert info.get_hf_processor() is idefics3_processor
    assert info.get_tokenizer() is idefics3_processor.tokenizer
    with pytest.raises(ConfigError, match=r"get_hf_config\(\) reads config.json from the model folder") as caught:
        info.get_hf_config()
    assert "ready Idefics3Processor without one" in str(caught.value)
    assert "create_processor(folder)" in str(caught.value)
    with pytest.raises(ConfigError, match=r"get_hf_processor\(image_seq_len=...\) rebuilds the HF processor"):
        info.get_hf_processor(image_seq_len=2)


def test_processor_without_folder_given_its_folder(idefics3_processor: Any, idefics3_dir: Path) -> None:
    info = TransformersProcessingInfo(idefics3_processor, model_id="tiny", model_dir=idefics3_dir)
    assert info.get_hf_config().model_type == "idefics3"


def test_unreadable_config_is_a_config_error(idefics3_processor: Any, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no_such_model"}))
    info = BaseProcessingInfo(idefics3_processor, model_id="tiny", model_dir=tmp_path)
    with pytest.raises(ConfigError, match="Could not read the model config from") as caught:
        info.get_hf_config()
    assert "config.json with a `model_type` this transformers knows" in str(caught.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="Could not read the model config from"):
        BaseProcessingInfo(idefics3_processor, model_id="tiny", model_dir=empty).get_hf_config()


def test_names_and_facades() -> None:
    import mmfront.models as models
    import mmfront.processing as processing
    from mmfront.models.catalog import register_processor

    assert processing.BaseProcessingInfo is BaseProcessingInfo and not hasattr(processing, "ProcessingInfo")
    assert models.BaseProcessingInfo is BaseProcessingInfo and not hasattr(models, "ProcessingInfo")
    assert models.register_processor is register_processor
