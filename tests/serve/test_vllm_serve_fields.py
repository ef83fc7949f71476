"""The request fields that shape the prompt and the engine request (``truncate_prompt_tokens``,
``truncation_side``, ``add_special_tokens``, ``documents``, ``return_prompt_text``,
``session_id``), sent to ``vllm serve`` and ``mmfront serve`` side by side in front of a stock
vLLM 0.33 engine core with the stub executor (the harness of test_vllm_serve_parity.py): the same
status and the same body (``return_token_ids`` shows the prompt each sent the engine, and the
usage its length), or the same error.

vLLM's semantics (``vllm/renderers/params.py``): a text prompt without ``truncation_side`` is cut
by the tokenizer, which keeps the special tokens it adds; with a side, and for token ids, the
prompt is sliced (``left``: its last tokens, the side vLLM loads tokenizers with); ``-1`` keeps
the context less one token (all of it for a completion without ``max_tokens``); more than
``max_model_len`` is a 400; a multimodal prompt is cut once its placeholders are expanded, never
through an item.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from test_vllm_serve_parity import (
    BODY,
    CHAT,
    KIND,
    REQUEST_S,
    SAME_ERROR,
    SERVED,
    Answer,
    Pair,
    assert_alike,
    both,
    error,
    explain,
    pair,  # noqa: F401  the module's servers
    read_stream,
)

pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side]

TEXT = [{"role": "user", "content": "Tell me a long story about a cat, a dog and a very old tree by the river."}]
LONG_PROMPT = "Once upon a time there was a cat who lived by the river under a very old tree"
STREAM = "stream"
CHAT_PATH, COMPLETION_PATH = "/v1/chat/completions", "/v1/completions"


def text_chat(**fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "messages": TEXT, "max_tokens": 3, "return_token_ids": True, **fields}


def image_chat(**fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "messages": CHAT, "max_tokens": 3, "return_token_ids": True, **fields}


def text_completion(**fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "prompt": LONG_PROMPT, "max_tokens": 3, "return_token_ids": True, **fields}


CASES: dict[str, tuple[str, dict[str, Any], str]] = {
    # truncate_prompt_tokens on chat: the tokenizer's cut (the template's BOS is text: it goes)
    "chat_truncate_5": (CHAT_PATH, text_chat(truncate_prompt_tokens=5), BODY),
    "chat_truncate_right": (CHAT_PATH, text_chat(truncate_prompt_tokens=5, truncation_side="right"), BODY),
    "chat_truncate_left": (CHAT_PATH, text_chat(truncate_prompt_tokens=5, truncation_side="left"), BODY),
    "chat_truncate_longer_than_prompt": (CHAT_PATH, text_chat(truncate_prompt_tokens=1000), BODY),
    "chat_truncate_minus_one": (CHAT_PATH, text_chat(truncate_prompt_tokens=-1), BODY),
    "chat_truncate_model_len": (CHAT_PATH, text_chat(truncate_prompt_tokens=4096), BODY),
    "chat_truncate_above_model_len": (CHAT_PATH, text_chat(truncate_prompt_tokens=4097), SAME_ERROR),
    "chat_truncate_below_minus_one": (CHAT_PATH, text_chat(truncate_prompt_tokens=-2), KIND),
    "chat_truncate_with_special_tokens": (CHAT_PATH, text_chat(truncate_prompt_tokens=6, add_special_tokens=True),
                                          BODY),
    "chat_truncate_max_tokens_too_big": (CHAT_PATH, text_chat(truncate_prompt_tokens=4097, max_tokens=5000),
                                         SAME_ERROR),
    "chat_truncate_stream": (CHAT_PATH, text_chat(truncate_prompt_tokens=5, stream=True), STREAM),
    # completions: the tokenizer keeps its BOS and cuts the text after it; a side slices
    "completion_truncate_3": (COMPLETION_PATH, text_completion(truncate_prompt_tokens=3), BODY),
    "completion_truncate_right": (COMPLETION_PATH, text_completion(truncate_prompt_tokens=4, truncation_side="right"),
                                  BODY),
    "completion_truncate_left": (COMPLETION_PATH, text_completion(truncate_prompt_tokens=4, truncation_side="left"),
                                 BODY),
    "completion_truncate_no_specials": (COMPLETION_PATH, text_completion(truncate_prompt_tokens=4,
                                                                         add_special_tokens=False), BODY),
    "completion_truncate_token_ids": (COMPLETION_PATH, text_completion(prompt=list(range(100, 120)),
                                                                       truncate_prompt_tokens=6), BODY),
    "completion_truncate_token_ids_right": (COMPLETION_PATH, text_completion(
        prompt=list(range(100, 120)), truncate_prompt_tokens=6, truncation_side="right"), BODY),
    "completion_truncate_minus_one": (COMPLETION_PATH, text_completion(truncate_prompt_tokens=-1), BODY),
    "completion_truncate_two_prompts": (COMPLETION_PATH, text_completion(prompt=[LONG_PROMPT, "Hi there you"],
                                                                         truncate_prompt_tokens=4), BODY),
    "completion_truncate_above_model_len": (COMPLETION_PATH, text_completion(truncate_prompt_tokens=5000),
                                            SAME_ERROR),
    # an image: kept whole, or refused where the cut would go through it
    "image_chat_truncate_keeps_image": (CHAT_PATH, image_chat(truncate_prompt_tokens=300), BODY),
    "image_chat_truncate_right_keeps_image": (CHAT_PATH, image_chat(truncate_prompt_tokens=290,
                                                                    truncation_side="right"), BODY),
    "image_chat_truncate_splits_image": (CHAT_PATH, image_chat(truncate_prompt_tokens=100), SAME_ERROR),
    "image_chat_truncate_right_splits_image": (CHAT_PATH, image_chat(truncate_prompt_tokens=100,
                                                                     truncation_side="right"), SAME_ERROR),
    "chat_truncate_zero": (CHAT_PATH, text_chat(truncate_prompt_tokens=0), SAME_ERROR),
    # add_special_tokens
    "chat_add_special_tokens": (CHAT_PATH, text_chat(add_special_tokens=True), BODY),
    "image_chat_add_special_tokens": (CHAT_PATH, image_chat(add_special_tokens=True), BODY),
    "completion_no_special_tokens": (COMPLETION_PATH, text_completion(add_special_tokens=False), BODY),
    # the rendered prompt, documents, the session
    "chat_return_prompt_text": (CHAT_PATH, text_chat(return_prompt_text=True), BODY),
    "image_chat_return_prompt_text": (CHAT_PATH, image_chat(return_prompt_text=True), BODY),
    "chat_return_prompt_text_stream": (CHAT_PATH, text_chat(return_prompt_text=True, stream=True), STREAM),
    "chat_documents": (CHAT_PATH, text_chat(documents=[{"title": "Cats", "text": "Cats purr."}],
                                            return_prompt_text=True), BODY),
    "chat_session_id": (CHAT_PATH, text_chat(session_id="session-1"), BODY),
    "completion_session_id": (COMPLETION_PATH, text_completion(session_id="session-1"), BODY),
    "chat_session_id_in_xargs": (CHAT_PATH, text_chat(vllm_xargs={"session_id": "session-2"}), BODY),
    # stream_interval: a whole answer is the same; 0 is refused
    "chat_stream_interval_whole": (CHAT_PATH, text_chat(stream_interval=3), BODY),
    "completion_stream_interval_whole": (COMPLETION_PATH, text_completion(stream_interval=2), BODY),
    "chat_stream_interval_zero": (CHAT_PATH, text_chat(stream_interval=0), KIND),
    # return_weight_versions: the stock engine labels its weights "default"
    "chat_weight_versions": (CHAT_PATH, text_chat(return_weight_versions=True), BODY),
    "chat_weight_versions_n2": (CHAT_PATH, text_chat(return_weight_versions=True, n=2), BODY),
    "image_chat_weight_versions": (CHAT_PATH, image_chat(return_weight_versions=True), BODY),
    "completion_weight_versions": (COMPLETION_PATH, text_completion(return_weight_versions=True), BODY),
    "completion_weight_versions_two_prompts": (COMPLETION_PATH, text_completion(
        prompt=["Hello", "there"], return_weight_versions=True), BODY),
    "chat_weight_versions_stop": (CHAT_PATH, text_chat(return_weight_versions=True, max_tokens=8, stop=["In"]), BODY),
}


@pytest.mark.parametrize("case", CASES)
def test_a_prompt_field_gets_vllms_answer(pair: Pair, case: str) -> None:  # noqa: F811
    path, body, compare = CASES[case]
    vllm, mmfront = both(pair, "POST", path, body)
    if compare != STREAM:
        assert_alike(pair, vllm, mmfront, compare)
        return
    want, got = read_stream(vllm), read_stream(mmfront)
    finish = [(c["choices"][0]["finish_reason"], c.get("usage")) for c in (got.finish[0], want.finish[0])]
    assert (got.role, got.text, finish[0]) == (want.role, want.text, finish[1]), explain(pair, vllm, mmfront)


def test_the_session_header_is_taken_by_both(pair: Pair) -> None:  # noqa: F811
    answers = [httpx.post(side.url + CHAT_PATH, json=text_chat(), timeout=REQUEST_S,
                          headers={"X-Session-ID": "session-3"}) for side in (pair.vllm, pair.mmfront)]
    vllm, mmfront = (Answer(a.status_code, a.text) for a in answers)
    assert_alike(pair, vllm, mmfront, BODY)


def test_a_cut_that_drops_an_image_is_a_400_in_mmfront(pair: Pair) -> None:  # noqa: F811
    """A cut so short that the image's placeholder goes before it expands: vLLM's processor then
    fails to place the image (500 ``InternalServerError``); mmfront answers the 400 vLLM gives a
    cut through an expanded image (docs/serving.md, "Differences from vllm serve")."""
    vllm, mmfront = both(pair, "POST", CHAT_PATH, image_chat(truncate_prompt_tokens=10))
    assert (vllm.status, mmfront.status) == (500, 400), explain(pair, vllm, mmfront)
    assert error(vllm)["message"] == "Failed to apply prompt replacement for mm_items['image'][0]"
    got = error(mmfront)
    assert (got["type"], got["param"]) == ("BadRequestError", "truncate_prompt_tokens"), mmfront.text
    assert got["message"].startswith("truncate_prompt_tokens=10 would split or drop a(n) image item, which spans "
                                     "tokens 3 to 263 of the 279-token prompt."), mmfront.text


@pytest.mark.parametrize(("path", "body"), [
    (CHAT_PATH, text_chat(max_tokens=8, stream_interval=3, stream=True)),
    (COMPLETION_PATH, text_completion(max_tokens=8, stream_interval=3, stream=True)),
    (CHAT_PATH, text_chat(max_tokens=8, stream_interval=3, n=2, stream=True)),
], ids=["chat", "completion", "chat_n2"])
def test_a_stream_interval_batches_the_tokens_as_vllms(pair: Pair, path: str, body: dict[str, Any]) -> None:  # noqa: F811
    """The first tokens at once, then at least ``stream_interval`` tokens a chunk, then the end
    (outputs that arrive together are merged too, in both servers: how many chunks there are
    depends on timing)."""
    vllm, mmfront = both(pair, "POST", path, body)
    want, got = read_stream(vllm), read_stream(mmfront)
    assert (got.text, got.role) == (want.text, want.role), explain(pair, vllm, mmfront)
    for answer in (vllm, mmfront):
        per_choice: dict[int, list[list[int]]] = {}
        for event in answer.text.split("\n\n"):
            if event.startswith("data: {"):
                chunk = json.loads(event.removeprefix("data: "))
                for choice in chunk["choices"]:
                    if choice.get("token_ids"):
                        per_choice.setdefault(choice["index"], []).append(choice["token_ids"])
        assert len(per_choice) == (body.get("n") or 1), answer.text
        for chunks in per_choice.values():
            assert sum(map(len, chunks)) == 8, answer.text
            assert all(len(c) >= 3 for c in chunks[1:-1]), answer.text


@pytest.mark.parametrize(("path", "body"), [
    (CHAT_PATH, text_chat(max_tokens=4, return_weight_versions=True, stream=True)),
    (CHAT_PATH, text_chat(max_tokens=4, return_weight_versions=True, n=2, stream=True)),
    (COMPLETION_PATH, text_completion(max_tokens=4, return_weight_versions=True, stream=True)),
], ids=["chat", "chat_n2", "completion"])
def test_a_stream_ends_each_choice_with_its_weight_versions(pair: Pair, path: str, body: dict[str, Any]) -> None:  # noqa: F811
    vllm, mmfront = both(pair, "POST", path, body)
    want, got = read_stream(vllm), read_stream(mmfront)
    assert got.text == want.text, explain(pair, vllm, mmfront)
    spans = {side: {i: c["choices"][0]["weight_versions"] for i, c in stream.finish.items()}
             for side, stream in (("vllm", want), ("mmfront", got))}
    assert spans["mmfront"] == spans["vllm"] == {i: [{"version": "default", "start": 0, "end": 4}]
                                                 for i in range(body.get("n") or 1)}, explain(pair, vllm, mmfront)
