"""Chat content parts and roles as `vllm serve` 0.33 reads them, sent to it and to `mmfront serve`
side by side (each in front of a stock vLLM engine core with the stub executor, the harness of
test_vllm_serve_parity.py). Found by sending both servers the same odd messages: the parts vLLM
reads as text (``refusal``, ``thinking``), ``tool_reference`` and the Responses API's
``input_image``; parts named by their field rather than a ``type`` (or sent with a ``uuid``); the
``developer`` role, which vLLM renders as ``system`` for a template that never names it; and what
vLLM refuses: an image ``detail`` outside its four values, null content outside an assistant
message, embeddings without ``--enable-mm-embeds``, a data URL that is not base64 (501).

Accepted messages are compared by their whole answer with the rendered prompt
(``return_prompt_text``); refusals by status, type, param and code (``KIND``) or their message too
(``SAME_ERROR``)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from test_vllm_serve_parity import (
    BODY,
    IMAGE,
    KIND,
    SAME_ERROR,
    SERVED,
    Pair,
    assert_alike,
    both,
    error,
    explain,
    pair,  # noqa: F401  the module's servers
)

pytestmark = pytest.mark.vllm_side_by_side

DESCRIBE = {"type": "text", "text": "Describe."}


def user(*parts: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


def answered(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": SERVED, "messages": messages, "max_tokens": 2, "return_prompt_text": True}


def refused(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": SERVED, "messages": messages, "max_tokens": 2}


def turns(*middle: dict[str, Any]) -> list[dict[str, Any]]:
    """``middle`` between two user turns."""
    return [*user(DESCRIBE), *middle, *user(DESCRIBE)]


OK = {"type": "text", "text": "ok"}
TOOL_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
CASES: dict[str, tuple[dict[str, Any], str]] = {
    "developer_as_system": (answered([{"role": "developer", "content": "Be brief."}, *user(DESCRIBE)]), BODY),
    "developer_parts": (answered([{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                                  *user(DESCRIBE)]), BODY),
    "developer_after_system_merged": (answered([{"role": "system", "content": "One."}, *user(DESCRIBE),
                                                {"role": "developer", "content": "Two."}]), BODY),
    "refusal_in_assistant": (answered(turns({"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]})),
                             BODY),
    "refusal_without_text_skipped": (answered(turns({"role": "assistant", "content": [
        {"type": "refusal", "refusal": None}, OK]})), BODY),
    "refusal_in_user": (answered(user({"type": "refusal", "refusal": "no"}, DESCRIBE)), BODY),
    "thinking_in_assistant": (answered(turns({"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm"}, OK]})), BODY),
    "thinking_in_user": (answered(user({"type": "thinking", "thinking": "hmm"}, DESCRIBE)), BODY),
    "tool_reference": (answered(user({"type": "tool_reference", "name": "search"}, DESCRIBE)), BODY),
    "tool_reference_without_name": (answered(user({"type": "tool_reference"}, DESCRIBE)), BODY),
    "tool_reference_in_tool_result": (answered([*user(DESCRIBE), TOOL_CALL, {
        "role": "tool", "tool_call_id": "c1", "content": [{"type": "tool_reference", "name": "search"}]}]), BODY),
    "input_image": (answered(user({"type": "input_image", "image_url": IMAGE, "detail": "auto"}, DESCRIBE)), BODY),
    "image_part_without_type": (answered(user({"image_url": {"url": IMAGE}}, DESCRIBE)), BODY),
    "image_part_with_uuid_and_string_url": (answered(user({"image_url": IMAGE, "uuid": "img-s"}, DESCRIBE)), BODY),
    "image_detail_original": (answered(user({"type": "image_url", "image_url": {"url": IMAGE, "detail": "original"}},
                                            DESCRIBE)), BODY),
    "part_with_an_extra_field": (answered(user({"type": "text", "text": "hi", "cache_control": {"type": "x"}})), BODY),
    "assistant_content_null": (answered(turns({"role": "assistant", "content": None})), BODY),
    "content_left_out": (answered([{"role": "wizard"}, *user(DESCRIBE)]), BODY),
    # refused alike
    "empty_conversation": (refused([]), SAME_ERROR),
    "image_detail_bogus": (refused(user({"type": "image_url", "image_url": {"url": IMAGE, "detail": "bogus"}})), KIND),
    "image_detail_null": (refused(user({"type": "image_url", "image_url": {"url": IMAGE, "detail": None}})), KIND),
    "input_image_without_detail": (refused(user({"type": "input_image", "image_url": IMAGE}, DESCRIBE)), KIND),
    "text_part_with_uuid": (refused(user({"type": "text", "text": "hi", "uuid": "u-1"})), KIND),
    "part_without_type": (refused(user({"text": "hi"})), KIND),
    "part_of_unknown_type": (refused(user({"type": "foo"}, DESCRIBE)), KIND),
    "text_part_not_a_string": (refused(user({"type": "text", "text": 5})), KIND),
    "image_url_null": (refused(user({"type": "image_url", "image_url": None}, DESCRIBE)), KIND),
    "image_url_without_url": (refused(user({"type": "image_url", "image_url": {}}, DESCRIBE)), KIND),
    "image_url_url_not_a_string": (refused(user({"type": "image_url", "image_url": {"url": 5}}, DESCRIBE)), KIND),
    "image_embeds_without_the_flag": (refused(user({"type": "image_embeds", "image_embeds": "AAAA"}, DESCRIBE)),
                                      SAME_ERROR),
    "image_embeds_by_uuid_without_the_flag": (refused(user({"type": "image_embeds", "image_embeds": None,
                                                            "uuid": "e-1"}, DESCRIBE)), SAME_ERROR),
    "video_embeds_without_the_flag": (refused(user({"type": "video_embeds", "video_embeds": "AAAA"}, DESCRIBE)),
                                      SAME_ERROR),
    "audio_embeds_without_the_flag": (refused(user({"type": "audio_embeds", "audio_embeds": "AAAA"}, DESCRIBE)),
                                      SAME_ERROR),
}


@pytest.mark.parametrize("case", CASES)
def test_vllms_reading_of_parts_and_roles(pair: Pair, case: str) -> None:  # noqa: F811
    body, compare = CASES[case]
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", body)
    assert_alike(pair, vllm, mmfront, compare)


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": None}], [{"role": "system", "content": None}, *user(DESCRIBE)],
    [*user(DESCRIBE), {"role": "tool", "tool_call_id": "x", "content": None}], [{"role": "user", "content": 5}],
], ids=["user_null", "system_null", "tool_null", "user_int"])
def test_content_vllms_model_refuses_is_a_body_error_in_both(
        pair: Pair, messages: list[dict[str, Any]]) -> None:  # noqa: F811
    """vLLM's request model names the message type it tried last in ``param``; mmfront names the field."""
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", refused(messages))
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    want, got = error(vllm), error(mmfront)
    index = len(messages) - 1 if messages[-1].get("role") == "tool" else 0
    assert want["type"] == got["type"] == "Bad Request", explain(pair, vllm, mmfront)
    assert want["param"].startswith(f"body.messages.{index}."), explain(pair, vllm, mmfront)
    assert got["param"] == f"body.messages.{index}.content", explain(pair, vllm, mmfront)


def test_a_data_url_that_is_not_base64_is_a_501_in_both(pair: Pair) -> None:  # noqa: F811
    png = base64.b64encode(base64.b64decode(IMAGE.split(",", 1)[1])).decode()
    body = refused(user({"type": "image_url", "image_url": {"url": "data:image/png," + png}}, DESCRIBE))
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", body)
    assert vllm.status == mmfront.status == 501, explain(pair, vllm, mmfront)
    want, got = error(vllm), error(mmfront)
    assert (got["type"], got["code"]) == (want["type"], want["code"]) == ("NotImplementedError", 501), \
        explain(pair, vllm, mmfront)
    assert want["message"] == "Only base64 data URLs are supported for now.", explain(pair, vllm, mmfront)
    assert got["message"].startswith("Only base64 data URLs are supported, got data:image/png,"), \
        explain(pair, vllm, mmfront)
