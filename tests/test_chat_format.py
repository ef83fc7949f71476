"""Issue 9.3 and 8.8: each template gets content in the shape it reads, and nothing is lost.

The reference is HF's own ``processor.apply_chat_template`` on the same conversation written the
way HF documents it (every content a list of parts, media as ``{"type": "image"|"audio"}``);
mmfront gets the OpenAI form a client sends (string contents, ``image_url``/``input_audio``
parts). Idefics3's template walks parts only, so before the fix its system prompt, assistant turn
and string user turn vanished.
"""

from __future__ import annotations

import base64
import gc
import weakref
from pathlib import Path
from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront import chat_template as ct
from mmfront.chat import parse_chat_messages
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.registry import create_processor
from mmfront.processing.processor import BaseMultiModalProcessor
from mmfront.testing.media import image_data_url, make_audio, make_image, wav_bytes
from mmfront.testing.models import fixture_model_impl, load_processor

IMAGE_PART = {"type": "image_url", "image_url": {"url": image_data_url(make_image(40, 30, seed=0))}}
AUDIO_PART = {"type": "input_audio", "input_audio": {
    "data": base64.b64encode(wav_bytes(make_audio(1.0), 16000)).decode(), "format": "wav"}}
KINDS = {"gemma3": "image", "idefics3": "image", "emu3": "image", "qwen2_audio": "audio", "glmasr": "audio"}
TRANSFORMERS_ONLY = {"glmasr"}
"""GLM-ASR's native inputs are not proven equal to vLLM's (refused for --model-impl auto): these tests check the transformers backend's layout."""


def kind_config(kind: str) -> MultiModalConfig:
    return MultiModalConfig(model_impl="transformers" if kind in TRANSFORMERS_ONLY else fixture_model_impl(kind))


def openai_conversation(modality: str) -> list[dict[str, Any]]:
    media = IMAGE_PART if modality == "image" else AUDIO_PART
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [media, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": "A test item."},
        {"role": "user", "content": "Say it again, in other words."},
        {"role": "assistant", "content": [{"type": "text", "text": "An item for tests."}]},
        {"role": "user", "content": [{"type": "text", "text": "Thanks."}, {"type": "text", "text": " Once more?"}]},
    ]


def hf_conversation(modality: str) -> list[dict[str, Any]]:
    """The same conversation in HF's documented form."""
    out = []
    for message in openai_conversation(modality):
        content = message["content"]
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        parts = [part if part["type"] == "text" else {"type": modality} for part in content]
        out.append({"role": message["role"], "content": parts})
    return out


def parse(proc: BaseMultiModalProcessor, messages: Any, **kwargs: Any) -> Any:
    return parse_chat_messages(messages, proc, MediaConnector(proc.info.config), budget=DecodeBudget(1 << 30),
                               **kwargs)


@pytest.fixture(scope="module", params=sorted(KINDS))
def kind_dir(request: pytest.FixtureRequest) -> tuple[str, Path]:
    kind: str = request.param
    return kind, request.getfixturevalue(f"{kind}_dir")


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_prompt_equals_hf_apply_chat_template(kind_dir: tuple[str, Path], add_generation_prompt: bool) -> None:
    kind, folder = kind_dir
    modality = KINDS[kind]
    proc = create_processor(folder, kind_config(kind))
    hf = load_processor(folder)
    expected = hf.apply_chat_template(hf_conversation(modality), add_generation_prompt=add_generation_prompt)
    out = parse(proc, openai_conversation(modality), add_generation_prompt=add_generation_prompt)
    assert out.prompt == expected
    assert len(out.mm_data[modality]) == 1
    for text in ("Be brief.", "A test item.", "Say it again, in other words.", "An item for tests."):
        assert text in out.prompt  # nothing is lost


def test_idefics3_string_turns_are_kept(idefics3_dir: Path) -> None:
    proc = create_processor(idefics3_dir, kind_config("idefics3"))
    out = parse(proc, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."}])
    assert out.prompt == "<|im_start|>System: Be brief.<end_of_utterance>\nUser: Hi.<end_of_utterance>\nAssistant:"


@pytest.mark.parametrize(("kind", "content", "parts"), [
    ("gemma3", "openai", {"image": {"<start_of_image>": 1}}),
    ("idefics3", "openai", {"image": {"<image>": 1}}),
    ("emu3", "openai", {"image": {"<image>": 1}}),
    ("qwen2_audio", "openai", {"audio": {"<|AUDIO|>": 1, "<|audio_bos|>": 1, "<|audio_eos|>": 1}}),
    ("glmasr", "openai", {"audio": {"<|pad|>": 1}}),
])
def test_detected_formats(kind: str, content: str, parts: dict[str, dict[str, int]],
                          request: pytest.FixtureRequest) -> None:
    proc = create_processor(request.getfixturevalue(f"{kind}_dir"), kind_config(kind))
    template = ct.resolve_chat_template(proc, None)
    assert template.format == ct.TemplateFormat(content, parts)
    assert not template.from_request


def trusted(folder: Path, **config: Any) -> BaseMultiModalProcessor:
    return create_processor(folder, MultiModalConfig(trust_request_chat_template=True, **config))


STRING_TEMPLATE = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"


def test_string_template_gets_joined_text(gemma3_dir: Path) -> None:
    proc = trusted(gemma3_dir)
    assert ct.resolve_chat_template(proc, STRING_TEMPLATE).format == ct.TemplateFormat("string", {})
    messages = [{"role": "user", "content": [{"type": "text", "text": "Look:"}, IMAGE_PART]},
                {"role": "assistant", "content": "Done."}]
    out = parse(proc, messages, chat_template=STRING_TEMPLATE)
    assert out.prompt == "[user] Look:\n<start_of_image>\n[assistant] Done.\n"


def test_parts_template_that_skips_a_modality_gets_the_placeholder_as_text(gemma3_dir: Path) -> None:
    template = ("{% for m in messages %}{% for p in m['content'] %}"
                "{% if p['type'] == 'text' %}{{ p['text'] }}|{% endif %}{% endfor %}{% endfor %}")
    proc = trusted(gemma3_dir)
    assert ct.resolve_chat_template(proc, template).format == ct.TemplateFormat("openai", {})
    out = parse(proc, [{"role": "user", "content": [IMAGE_PART, {"type": "text", "text": "What?"}]}],
                chat_template=template)
    assert out.prompt == "<start_of_image>|What?|"


def test_forced_content_format(gemma3_dir: Path) -> None:
    proc = trusted(gemma3_dir, chat_template_content_format="string")
    out = parse(proc, [{"role": "user", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]}])
    assert out.prompt == "<bos><start_of_turn>user\nA\nB<end_of_turn>\n<start_of_turn>model\n"


def test_memo_is_per_processor_bounded_and_never_caches_a_failure(gemma3_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    proc = trusted(gemma3_dir)
    other = trusted(gemma3_dir)
    first = ct.resolve_chat_template(proc, STRING_TEMPLATE).format
    assert ct._memo[proc][STRING_TEMPLATE] is first
    assert STRING_TEMPLATE not in ct._memo.get(other, {})  # keyed on the processor, not on id(tokenizer)
    ct.resolve_chat_template(other, STRING_TEMPLATE)
    assert ct._memo[other][STRING_TEMPLATE] is not first
    for i in range(ct.MEMO_SIZE + 3):
        ct.resolve_chat_template(proc, STRING_TEMPLATE + f"{{# {i} #}}")
    assert len(ct._memo[proc]) == ct.MEMO_SIZE and STRING_TEMPLATE not in ct._memo[proc]
    gone = weakref.ref(other)
    gc.collect()  # processors other tests left in reference cycles must not go in the count below
    held = len(ct._memo)
    del other
    gc.collect()
    # the processor's entries went with it (a processor another test left behind may go too)
    assert gone() is None and len(ct._memo) <= held - 1

    flaky = "{# flaky #}" + STRING_TEMPLATE
    fresh = trusted(gemma3_dir)
    real = fresh.info.tokenizer.apply_chat_template
    calls = {"n": 0}

    def failing_once(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("transient")
        return real(*args, **kwargs)

    monkeypatch.setattr(fresh.info.tokenizer, "apply_chat_template", failing_once)
    ct.resolve_chat_template(fresh, flaky)
    assert flaky not in ct._memo.get(fresh, {})  # a probe raised: not remembered
    assert ct.resolve_chat_template(fresh, flaky).format == ct.TemplateFormat("string", {})
    assert flaky in ct._memo[fresh]
