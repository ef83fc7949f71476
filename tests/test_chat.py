"""Chat messages -> templated prompt + items, on the offline tiny Gemma3 folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mmfront import MediaWithBytes, MultiModalConfig
from mmfront.chat import parse_chat_messages
from mmfront.errors import ChatFormatError, ValidationError
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.registry import create_processor
from mmfront.processing.processor import BaseMultiModalProcessor
from mmfront.testing.media import image_data_url, make_image

URL = image_data_url(make_image(40, 30, seed=0))


@pytest.fixture(scope="module")
def proc(gemma3_dir: Path) -> BaseMultiModalProcessor:
    return create_processor(gemma3_dir, MultiModalConfig(enable_mm_embeds=True, limit_mm_per_prompt={"image": 2}))


def parse(proc: BaseMultiModalProcessor, messages: Any, **kwargs: Any) -> Any:
    connector = MediaConnector(proc.info.config)
    return parse_chat_messages(messages, proc, connector, budget=DecodeBudget(1 << 30), **kwargs)


def user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


def test_image_part_becomes_the_placeholder(proc: BaseMultiModalProcessor) -> None:
    out = parse(proc, user({"type": "image_url", "image_url": {"url": URL}}, {"type": "text", "text": "Describe."}))
    assert out.prompt == ("<bos><start_of_turn>user\n<start_of_image>Describe.<end_of_turn>\n"
                          "<start_of_turn>model\n")
    (item,) = out.mm_data["image"]
    assert isinstance(item, MediaWithBytes) and not item.is_decoded  # loaded lazily
    assert out.mm_uuids == {"image": [None]}


def test_string_content_and_a_uuid(proc: BaseMultiModalProcessor) -> None:
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": URL}, "uuid": "img-1"}]}]
    out = parse(proc, messages, add_generation_prompt=False)
    assert out.prompt == ("<bos><start_of_turn>system\nBe brief.<end_of_turn>\n"
                          "<start_of_turn>user\n<start_of_image><end_of_turn>\n")
    assert out.mm_uuids == {"image": ["img-1"]}


def test_a_bare_string_url_is_refused_as_vllm_refuses_it(proc: BaseMultiModalProcessor) -> None:
    with pytest.raises(ChatFormatError, match=r"^messages\[0\]\.content\[0\]\.image_url must be an object with a `url`"
                       ) as e:
        parse(proc, user({"type": "image_url", "image_url": URL}))
    assert e.value.parameter is None


def test_uuid_only_part_reuses_a_cached_item(proc: BaseMultiModalProcessor) -> None:
    out = parse(proc, user({"type": "image_url", "image_url": None, "uuid": "seen-before"}))
    assert out.mm_data == {"image": [None]} and out.mm_uuids == {"image": ["seen-before"]}
    out = parse(proc, user({"type": "image_url", "image_url": {"url": None}, "uuid": "seen-before"}))
    assert out.mm_data == {"image": [None]}


def test_template_without_parts_gets_placeholders_in_the_text(gemma3_dir: Path) -> None:
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    trusting = create_processor(gemma3_dir, MultiModalConfig(trust_request_chat_template=True))
    out = parse(trusting, user({"type": "text", "text": "Look:"}, {"type": "image_url", "image_url": {"url": URL}}),
                chat_template=template)
    assert out.prompt == "[user] Look:\n<start_of_image>\n"


@pytest.mark.parametrize(
    ("messages", "error", "match"),
    [
        (user({"type": "video_url", "video_url": {"url": "x"}}), ValidationError,
         r"does not support video inputs \(it accepts: \['image'\]\)"),  # refused before the URL is fetched
        (user({"type": "video", "video": {"url": "x"}}), ChatFormatError, "unknown type 'video'"),
        (user({"type": "image_url"}), ChatFormatError, "no `image_url` data and no `uuid`"),
        (user({"type": "text"}), ChatFormatError, "without a string `text`"),
        (user({"text": "no type"}), ChatFormatError, "string `type`"),
        ([{"content": "no role"}], ChatFormatError, r"messages\[0\]\.role must be a name"),
        ([], ChatFormatError, "non-empty list"),
        ([{"role": "user", "content": 3}], ChatFormatError, "must be a string or a list"),
        (user({"type": "image_url", "image_url": {"url": URL}}, {"type": "image_embeds", "image_embeds":
                                                                 torch.zeros(16, 8)}),
         ChatFormatError, "Mixing raw image and embedding inputs"),
        (user(*[{"type": "image_url", "image_url": {"url": URL}}] * 3), ValidationError, "At most 2 image"),
        (user({"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}), ValidationError,
         "does not support audio"),
    ],
)
def test_malformed_messages(proc: BaseMultiModalProcessor, messages: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        parse(proc, messages)


def test_multi_modal_data_video_is_refused_by_a_model_without_a_video_processor(
        proc: BaseMultiModalProcessor) -> None:
    with pytest.raises(ValidationError, match="does not support video inputs"):
        proc.info.parse_mm_data({"video": torch.zeros(2, 8, 8, 3)})


@pytest.mark.parametrize("token", ["<start_of_image>", "<image_soft_token>", "<end_of_image>"])
def test_typed_placeholder_is_refused(proc: BaseMultiModalProcessor, token: str) -> None:
    with pytest.raises(ChatFormatError, match="reserved for multimodal items"):
        parse(proc, user({"type": "text", "text": f"what is {token}?"}))
    with pytest.raises(ChatFormatError, match="reserved for multimodal items"):
        parse(proc, [{"role": "user", "content": f"{token} here"}])
