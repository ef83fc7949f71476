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


def user(*parts: Any) -> list[dict[str, Any]]:
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
        (user({"type": "video", "video": {"url": "x"}}), ChatFormatError,
         r"^messages\[0\]\.content\[0\] has unsupported type 'video'\. Supported types: audio_embeds, audio_url, "
         "image_embeds, image_pil, image_url, input_audio, input_image, refusal, text, thinking, tool_reference, "
         r"video_embeds, video_url\.$"),
        (user({"type": "image_url"}), ChatFormatError, "no `image_url` data and no `uuid`"),
        (user({"type": "text"}), ChatFormatError, "without a string `text`"),
        (user({"text": "no type"}), ChatFormatError, r"missing 'type' field in multimodal part"),
        (user("a string part"), ChatFormatError, "must be an object with a string `type`"),
        (user({"type": "text", "text": "hi", "uuid": "u-1"}), ChatFormatError, "missing 'type' field"),  # vLLM's quirk
        (user({"type": 5, "text": "hi"}), ChatFormatError, "invalid 'type' field"),
        (user({"type": "refusal", "refusal": 5}), ChatFormatError, "refusal part without a string `refusal`"),
        (user({"type": "thinking"}), ChatFormatError, "thinking part without a string `thinking`"),
        (user({"type": "prompt_embeds", "data": "AAAA"}), ChatFormatError, "prompt embeddings are not supported"),
        (user({"type": "image_url", "image_url": {"url": URL, "detail": "bogus"}}), ChatFormatError,
         r"image_url\.detail must be one of 'auto', 'low', 'high', 'original'"),
        (user({"type": "image_url", "image_url": {"url": URL, "detail": None}}), ChatFormatError, "detail must be one"),
        (user({"type": "input_image", "image_url": URL}), ChatFormatError,
         r"content\[0\]\.detail must be one of"),  # the Responses API's image part requires its detail
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


TURN = "<start_of_turn>user\nDescribe.<end_of_turn>\n"
DESCRIBE = {"type": "text", "text": "Describe."}
OK = {"type": "text", "text": "ok"}


@pytest.mark.parametrize(
    ("messages", "prompt"),
    [  # each prompt as `vllm serve` 0.33 renders the same messages (return_prompt_text) on this template
        (user({"type": "refusal", "refusal": "no"}, DESCRIBE), "<start_of_turn>user\nnoDescribe.<end_of_turn>\n"),
        (user({"type": "thinking", "thinking": "hmm"}, DESCRIBE), "<start_of_turn>user\nhmmDescribe.<end_of_turn>\n"),
        ([*user(DESCRIBE), {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm"}, OK]},
          *user(DESCRIBE)],
         TURN + "<start_of_turn>model\nhmmok<end_of_turn>\n" + TURN),
        ([*user(DESCRIBE), {"role": "assistant", "content": [{"type": "refusal", "refusal": None}, OK]},
          *user(DESCRIBE)],
         TURN + "<start_of_turn>model\nok<end_of_turn>\n" + TURN),  # a refusal without text is skipped
        (user({"type": "tool_reference", "name": "search"}, DESCRIBE), TURN),  # for a template that expands it
        (user({"type": "tool_reference"}, DESCRIBE), TURN),
        ([{"role": "developer", "content": "Be brief."}, *user(DESCRIBE)],
         "<start_of_turn>system\nBe brief.<end_of_turn>\n" + TURN),
        ([{"role": "developer", "content": [{"type": "text", "text": "Be brief."}], "tools": []}, *user(DESCRIBE)],
         "<start_of_turn>system\nBe brief.<end_of_turn>\n" + TURN),
        ([{"role": "system", "content": "One."}, *user(DESCRIBE), {"role": "developer", "content": "Two."}],
         "<start_of_turn>system\nOne.\n\nTwo.<end_of_turn>\n" + TURN),  # merged, first
        ([{"role": "system", "content": ""}, {"role": "developer", "content": "Two."}, *user(DESCRIBE)],
         "<start_of_turn>system\nTwo.<end_of_turn>\n" + TURN),
    ],
)
def test_parts_and_roles_vllm_renders(proc: BaseMultiModalProcessor, messages: Any, prompt: str) -> None:
    out = parse(proc, messages)
    assert out.prompt == "<bos>" + prompt + "<start_of_turn>model\n"
    assert out.mm_data == {}


@pytest.mark.parametrize(
    "part",
    [
        {"type": "input_image", "image_url": URL, "detail": "auto"},  # the Responses API's image part
        {"image_url": {"url": URL}},  # no type: the field names it, as in vLLM
        {"type": "image_url", "image_url": URL, "uuid": "img-2"},  # with a uuid, a string URL too
        {"type": "video_url", "image_url": {"url": URL}, "uuid": "img-3"},  # with a uuid the field decides
        {"type": "image_url", "image_url": {"url": URL, "detail": "original"}},
    ],
)
def test_image_parts_vllm_takes(proc: BaseMultiModalProcessor, part: dict[str, Any]) -> None:
    out = parse(proc, user(part, DESCRIBE))
    assert out.prompt == "<bos><start_of_turn>user\n<start_of_image>Describe.<end_of_turn>\n<start_of_turn>model\n"
    (item,) = out.mm_data["image"]
    assert isinstance(item, MediaWithBytes) and out.mm_uuids == {"image": [part.get("uuid")]}


def test_a_template_that_names_the_developer_role_gets_it(gemma3_dir: Path) -> None:
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}{# 'developer' #}"
    trusting = create_processor(gemma3_dir, MultiModalConfig(trust_request_chat_template=True))
    messages = [{"role": "developer", "content": "Be brief."}]
    assert parse(trusting, messages, chat_template=template).prompt == "[developer] Be brief.\n"
    assert parse(trusting, messages, chat_template=template.replace("'developer'", "")).prompt == "[system] Be brief.\n"


def test_a_parts_own_fields_reach_the_template(gemma3_dir: Path) -> None:
    template = ("{% for m in messages %}{% if m['content'] is string %}text:{{ m['content'] }}:- {% else %}"
                "{% for p in m['content'] %}{{ p['type'] }}:{% if p['type'] == 'image' %}<start_of_image>{% else %}"
                "{{ p['text'] }}{% endif %}:{{ p.get('cache_control', '-') }} {% endfor %}"
                "{% endif %}{% endfor %}")
    trusting = create_processor(gemma3_dir, MultiModalConfig(trust_request_chat_template=True))
    marked = {"type": "ephemeral"}
    out = parse(trusting, user({"type": "text", "text": "a", "cache_control": marked},
                               {"type": "image_url", "image_url": {"url": URL}, "cache_control": marked},
                               {"type": "text", "text": "b"}), chat_template=template)
    assert out.prompt == "text:a:{'type': 'ephemeral'} image:<start_of_image>:{'type': 'ephemeral'} text:b:- "


def test_a_string_template_gets_a_tool_references_name_as_text(gemma3_dir: Path) -> None:
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    trusting = create_processor(gemma3_dir, MultiModalConfig(trust_request_chat_template=True))
    out = parse(trusting, user({"type": "tool_reference", "name": "search"}, {"type": "text", "text": "Go."}),
                chat_template=template)
    assert out.prompt == "[user] search\nGo.\n"
    with pytest.raises(ChatFormatError, match=r"tool_reference part without a `name`"):
        parse(trusting, user({"type": "tool_reference"}), chat_template=template)


@pytest.mark.parametrize("kind", ["image_embeds", "video_embeds"])
def test_embeddings_without_enable_mm_embeds_name_the_flag(gemma3_dir: Path, kind: str) -> None:
    plain = create_processor(gemma3_dir, MultiModalConfig())
    with pytest.raises(ValidationError, match=rf"^You must set `--enable-mm-embeds` to input `{kind}`$") as e:
        parse(plain, user({"type": kind, kind: "AAAA"}))
    assert e.value.parameter == kind


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
