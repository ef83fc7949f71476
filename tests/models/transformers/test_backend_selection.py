"""Which backend class serves a processor, and how a processor without offsets is refused.

The refusal cases use real HF classes from the offsets survey: ``Idefics2Processor`` has no
``replace_image_token`` (5.14.1 through 5.24), ``MllamaProcessor`` has the hook but its own
``__call__`` never reports offsets, and ``Gemma3Processor`` lacks the hook before 5.15.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from backend_cases import build
from packaging.version import Version
from transformers import Idefics2Processor, MllamaProcessor, WhisperProcessor

from mmfront import MultiModalConfig
from mmfront.errors import InputTypeError, MissingOffsetsError, UnsupportedModelError, ValidationError
from mmfront.fixtures.bpe import make_tokenizer
from mmfront.fixtures.models.glmasr import make_glmasr_processor
from mmfront.fixtures.processors import image_processor_class
from mmfront.models.registry import create_processor, resolve_factory
from mmfront.models.transformers import (
    LegacyMultiModalProcessor,
    MultiModalProcessor,
    OffsetsMultiModalProcessor,
    TransformersProcessingInfo,
    has_replacement_hook,
    offsets_missing,
    offsets_request_kwargs,
    select_backend,
)
from mmfront.processing.processor import BaseProcessingInfo
from mmfront.testing.media import make_audio, make_image

pytestmark = pytest.mark.backend


def make_idefics2(cls: type[Idefics2Processor] = Idefics2Processor) -> Idefics2Processor:
    tokenizer = make_tokenizer(["<fake_token_around_image>", "<image>", "<end_of_utterance>"], bos_token="<s>",
                               eos_token="</s>", pad_token="<pad>", add_bos=False)
    image_processor = image_processor_class("idefics2", "Idefics2ImageProcessor")(
        size={"longest_edge": 32, "shortest_edge": 16}, do_image_splitting=False)
    return cls(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4)


def make_mllama() -> MllamaProcessor:
    tokenizer = make_tokenizer(["<|image|>", "<|python_tag|>"], bos_token="<|begin_of_text|>", eos_token="<|eot_id|>",
                               pad_token="<|finetune_right_pad_id|>", add_bos=True)
    image_processor = image_processor_class("mllama", "MllamaImageProcessor")(
        size={"height": 32, "width": 32}, max_image_tiles=2)
    return MllamaProcessor(image_processor=image_processor, tokenizer=tokenizer)


# --- selection ------------------------------------------------------------------------------


@pytest.mark.hf_version(">=5.15", reason="HF processors report text_replacement_offsets from transformers 5.15.0")
def test_offsets_is_the_default_from_5_15() -> None:
    assert MultiModalProcessor is OffsetsMultiModalProcessor
    assert select_backend(MultiModalConfig()).processor_cls is OffsetsMultiModalProcessor


@pytest.mark.hf_version("<5.15", reason="before transformers 5.15.0 most HF processors report no offsets")
def test_legacy_is_the_default_before_5_15() -> None:
    assert MultiModalProcessor is LegacyMultiModalProcessor
    assert select_backend(MultiModalConfig()).processor_cls is LegacyMultiModalProcessor


@pytest.mark.parametrize(("setting", "cls"), [("legacy", LegacyMultiModalProcessor),
                                              ("offsets", OffsetsMultiModalProcessor)])
def test_config_overrides_the_version_rule(setting: str, cls: type) -> None:
    factory = select_backend(MultiModalConfig(transformers_backend=setting))  # type: ignore[arg-type]
    assert factory.processor_cls is cls and factory.info_cls is TransformersProcessingInfo


def test_registry_sends_non_native_processors_to_the_backend(glmasr_dir: Path) -> None:
    proc = create_processor(glmasr_dir, MultiModalConfig(dtype="float32", model_impl="transformers"))
    assert type(proc) is MultiModalProcessor
    out = proc.apply("<|user|><|pad|>", {"audio": [make_audio(1.0)]})
    assert [(p.offset, p.length) for p in out["mm_placeholders"]["audio"]] == [(1, 12)]
    legacy = create_processor(glmasr_dir, MultiModalConfig(transformers_backend="legacy", model_impl="transformers"))
    assert type(legacy) is LegacyMultiModalProcessor


def test_native_gemma3_stays_native(gemma3_processor: Any) -> None:
    factory = resolve_factory(gemma3_processor, MultiModalConfig(transformers_backend="offsets"))
    assert factory.processor_cls.__name__ == "Gemma3MultiModalProcessor"


@pytest.mark.parametrize(("version", "expected"), [
    ("5.14.1", {"text_kwargs": {"return_text_replacement_offsets": True}}),
    ("5.15.0", {"return_text_replacement_offsets": True}),
    ("5.24.0", {"return_text_replacement_offsets": True}),
])
def test_offsets_kwarg_spelling_by_version(version: str, expected: dict[str, Any]) -> None:
    assert offsets_request_kwargs(Version(version)) == expected


# --- refusing processors without offsets ------------------------------------------------------


def test_hook_survey_facts(hf_version: Version) -> None:
    from transformers import Gemma3Processor, GlmAsrProcessor, Idefics3Processor

    assert not has_replacement_hook(Idefics2Processor, "image")
    assert has_replacement_hook(MllamaProcessor, "image")
    assert has_replacement_hook(Idefics3Processor, "image")
    assert has_replacement_hook(GlmAsrProcessor, "audio")
    assert has_replacement_hook(Gemma3Processor, "image") is (hf_version >= Version("5.15"))


def test_processor_without_hook_is_refused_with_advice() -> None:
    with pytest.raises(MissingOffsetsError) as info:
        build(OffsetsMultiModalProcessor, make_idefics2())
    message = str(info.value)
    for part in ("Idefics2Processor", "`replace_image_token`", "report it to transformers", "`transformers<5.15`",
                 'transformers_backend="legacy"'):
        assert part in message
    assert isinstance(info.value, UnsupportedModelError)


def test_the_advice_works_legacy_serves_idefics2() -> None:
    hf = make_idefics2()
    out = build(LegacyMultiModalProcessor, hf).apply("User:<image> hi", {"image": [make_image(32, 32)]})
    expected = hf(text="User:<image> hi", images=[make_image(32, 32)])["input_ids"][0]
    assert out["prompt_token_ids"] == list(expected)
    (placeholder,) = out["mm_placeholders"]["image"]
    # <fake_token_around_image> + 4 <image> + <fake_token_around_image>
    assert (placeholder.offset, placeholder.length, placeholder.get_num_embeds()) == (2, 6, 4)
    assert out["mm_kwargs"]["image"][0]["pixel_values"].data.shape == (1, 1, 3, 32, 32)


def test_processor_with_hook_but_no_offsets_is_refused_at_runtime() -> None:
    proc = build(OffsetsMultiModalProcessor, make_mllama())
    with pytest.raises(MissingOffsetsError, match="MllamaProcessor returned no text_replacement_offsets") as info:
        proc.apply("<|image|>hi", {"image": [make_image(32, 32)]})
    assert "`replace_image_token`" in str(info.value) and "`transformers<5.15`" in str(info.value)


@pytest.mark.hf_version("<5.15", reason="Gemma3Processor gained replace_image_token in transformers 5.15.0")
def test_gemma3_under_offsets_before_5_15_is_refused(gemma3_processor: Any) -> None:
    with pytest.raises(MissingOffsetsError, match="Gemma3Processor does not implement `replace_image_token`"):
        build(OffsetsMultiModalProcessor, gemma3_processor)


def test_glmasr_under_offsets_works_on_every_version() -> None:
    proc = build(OffsetsMultiModalProcessor, make_glmasr_processor())
    assert proc.modalities == ("audio",)


def test_processor_without_a_placeholder_is_refused() -> None:
    from mmfront.fixtures.processors import whisper_feature_extractor

    hf = WhisperProcessor(feature_extractor=whisper_feature_extractor(16, 2, 16000),
                          tokenizer=make_tokenizer([], bos_token=None, eos_token="<eos>", pad_token="<pad>"))
    with pytest.raises(UnsupportedModelError, match="WhisperProcessor has a audio sub-processor but no `audio_token`"):
        build(LegacyMultiModalProcessor, hf)


def test_backend_needs_its_own_info(idefics3_processor: Any) -> None:
    with pytest.raises(InputTypeError, match="TransformersProcessingInfo"):
        OffsetsMultiModalProcessor(BaseProcessingInfo(idefics3_processor, model_id="x"))


# --- placeholders for the chat layer -----------------------------------------------------------


@pytest.mark.parametrize("cls", [LegacyMultiModalProcessor, OffsetsMultiModalProcessor])
def test_placeholders_and_special_tokens(cls: type, idefics3_processor: Any, qwen2_audio_processor: Any,
                                         gemma3_processor: Any, hf_version: Version) -> None:
    idefics3 = build(cls, idefics3_processor)
    assert idefics3.get_placeholder_str("image", 0) == "<image>"
    assert {"<image>", "<fake_token_around_image>", "<global-img>"} <= idefics3.get_mm_special_tokens()
    with pytest.raises(ValidationError, match="no placeholder for audio"):
        idefics3.get_placeholder_str("audio", 0)
    if cls is LegacyMultiModalProcessor or hf_version >= Version("5.16"):
        qwen2 = build(cls, qwen2_audio_processor)
        assert qwen2.get_placeholder_str("audio", 1) == "<|AUDIO|>"
        assert {"<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"} <= qwen2.get_mm_special_tokens()
    if cls is LegacyMultiModalProcessor or hf_version >= Version("5.15"):
        # <start_of_image> in every version, although 5.14.1 calls the soft token `image_token`
        gemma3 = build(cls, gemma3_processor)
        assert gemma3.get_placeholder_str("image", 0) == "<start_of_image>"
        assert {"<start_of_image>", "<end_of_image>", "<image_soft_token>"} <= gemma3.get_mm_special_tokens()


# --- auto: a processor without offsets falls back to Legacy -----------------------------------


@pytest.mark.hf_version(">=5.15", reason="auto probes for offsets only where Offsets is the default")
def test_auto_serves_a_processor_without_the_hook_through_legacy(caplog: pytest.LogCaptureFixture) -> None:
    hf = make_idefics2()
    assert select_backend(MultiModalConfig(), hf).processor_cls is LegacyMultiModalProcessor
    with caplog.at_level("WARNING", logger="mmfront.models.transformers"):
        proc = create_processor(hf, MultiModalConfig())
    assert type(proc) is LegacyMultiModalProcessor
    assert "Idefics2Processor is served by the Legacy transformers backend" in caplog.text
    out = proc.apply("User:<image> hi", {"image": [make_image(32, 32)]})
    assert out["prompt_token_ids"] == list(hf(text="User:<image> hi", images=[make_image(32, 32)])["input_ids"][0])


@pytest.mark.hf_version(">=5.15", reason="auto probes for offsets only where Offsets is the default")
def test_auto_probes_a_processor_that_has_the_hook_but_reports_no_offsets() -> None:
    reason = offsets_missing(make_mllama(), MultiModalConfig())
    assert isinstance(reason, MissingOffsetsError)
    assert "MllamaProcessor returned no text_replacement_offsets for its image items" in str(reason)
    assert select_backend(MultiModalConfig(), make_mllama()).processor_cls is LegacyMultiModalProcessor


@pytest.mark.hf_version(">=5.15", reason="Idefics3 and GLM-ASR report offsets; Offsets is the default from 5.15")
def test_auto_keeps_offsets_for_a_processor_that_reports_them(idefics3_processor: Any) -> None:
    assert offsets_missing(idefics3_processor, MultiModalConfig()) is None
    assert select_backend(MultiModalConfig(), idefics3_processor).processor_cls is OffsetsMultiModalProcessor
    assert type(create_processor(make_glmasr_processor(), MultiModalConfig())) is OffsetsMultiModalProcessor


def test_explicit_offsets_still_refuses_a_processor_without_offsets() -> None:
    with pytest.raises(MissingOffsetsError, match="Idefics2Processor does not implement `replace_image_token`"):
        create_processor(make_idefics2(), MultiModalConfig(transformers_backend="offsets"))


class PromptMaskIdefics2(Idefics2Processor):
    """Idefics2 returning an output laid out along the prompt, as a cross-attention model's
    processor does, that no model module says how to rebuild."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = super().__call__(*args, **kwargs)
        out["cross_attention_mask"] = torch.ones(*out["input_ids"].shape, 1, 1, dtype=torch.int64)
        return out


@pytest.mark.parametrize("setting", ["auto", "legacy"])
def test_an_output_laid_out_along_the_prompt_is_refused_unless_a_model_module_rebuilds_it(setting: str) -> None:
    hf = make_idefics2(PromptMaskIdefics2)
    with pytest.raises(UnsupportedModelError) as info:
        create_processor(hf, MultiModalConfig(transformers_backend=setting))  # type: ignore[arg-type]
    message = str(info.value)
    for part in ("PromptMaskIdefics2 returns 'cross_attention_mask', one row per prompt token",
                 "cannot split it into items", "ModelSpec.prompt_outputs"):
        assert part in message


@pytest.mark.parametrize("setting", ["auto", "legacy"])
def test_mllama_is_served_by_legacy_its_mask_left_to_the_engine(setting: str, caplog: pytest.LogCaptureFixture) -> None:
    hf = make_mllama()
    with caplog.at_level("WARNING", logger="mmfront.models.transformers"):
        proc = create_processor(hf, MultiModalConfig(transformers_backend=setting))  # type: ignore[arg-type]
    assert type(proc) is LegacyMultiModalProcessor
    assert caplog.text == ""  # its module declares the unexpanded placeholder: Legacy by design, no warning
    out = proc.apply("<|image|>hi", {"image": [make_image(32, 32)]})
    ids = out["prompt_token_ids"]
    assert ids == list(hf(text="<|image|>hi", images=[make_image(32, 32)])["input_ids"][0])
    # the tokenizer's BOS, then the processor's after the image (as a Llama 3 tokenizer adding BOS gets)
    assert ids[:3] == [hf.tokenizer.bos_token_id, hf.image_token_id, hf.tokenizer.bos_token_id]
    assert [(p.offset, p.length) for p in out["mm_placeholders"]["image"]] == [(1, 1)]
    assert set(out["mm_kwargs"]["image"][0]) == {"pixel_values", "aspect_ratio_ids", "aspect_ratio_mask",
                                                 "num_image_patches"}
