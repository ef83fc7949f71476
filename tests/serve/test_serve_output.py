"""Output processing on constructed engine outputs: the streaming decoder equals a whole decode
and never splits a character, stop strings cut and end a choice as vLLM's detokenizer does
(held-back text, ``include_stop_str_in_output``, the token that completed the match), the
finishing token of ``FinishReason.STOP`` is counted but not shown, engine errors map to request
or server errors, and ``new_logprobs`` become OpenAI's two logprob shapes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from transformers import AutoTokenizer

from mmfront.errors import GenerationError, MediaFetchError, PromptUpdateError, RetryableRequestError, ValidationError
from mmfront.serve.output import (
    ChoiceOutput,
    IncrementalDetokenizer,
    LogprobTokens,
    WindowDetokenizer,
    make_detokenizer,
)
from mmfront.serve.responses import LogprobFormat, chat_logprobs, completion_logprobs
from mmfront.wire import SamplingParams
from mmfront.wire.structs import EngineCoreOutput, FinishReason, LogprobsLists, RequestError

TEXT = "Hello wörld ☃ 日本 — ok, done. Zürich; naïve café 🎉 end"


@pytest.fixture(scope="module")
def tokenizer(gemma3_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(gemma3_dir)


def ids_of(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def choice(tokenizer: Any, **params: Any) -> ChoiceOutput:
    return ChoiceOutput(make_detokenizer(tokenizer, ids_of(tokenizer, "Say:"), skip_special_tokens=True),
                        SamplingParams(**params))


def feed(out: ChoiceOutput, ids: list[int], *, per_step: int = 1, last: FinishReason = FinishReason.LENGTH,
         ) -> list[str]:
    deltas = []
    for start in range(0, len(ids), per_step):
        chunk = ids[start:start + per_step]
        finish = last if start + per_step >= len(ids) else None
        delta = out.process(EngineCoreOutput("r", chunk, finish_reason=finish))
        deltas.append(delta.text)
        if out.finished:
            break
    return deltas


@pytest.mark.parametrize("cls", [IncrementalDetokenizer, WindowDetokenizer])
def test_streamed_text_equals_the_whole_decode_and_never_splits_a_character(tokenizer: Any, cls: type) -> None:
    ids = ids_of(tokenizer, TEXT)
    backend = tokenizer.backend_tokenizer if cls is IncrementalDetokenizer else tokenizer
    detokenizer = cls(backend, ids_of(tokenizer, "Say:"), skip_special_tokens=True)
    pieces = [detokenizer.step(t) for t in ids]
    assert "".join(pieces) == tokenizer.decode(ids) == TEXT
    assert not any("\ufffd" in p for p in pieces)
    assert any(p == "" for p in pieces)  # multi-byte characters span tokens here: held until complete


def test_make_detokenizer_prefers_the_tokenizers_stream(tokenizer: Any) -> None:
    assert isinstance(make_detokenizer(tokenizer, [], skip_special_tokens=True), IncrementalDetokenizer)

    class Slow:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    assert isinstance(make_detokenizer(Slow(), [], skip_special_tokens=True), WindowDetokenizer)


@pytest.mark.parametrize("per_step", [1, 3])
def test_stop_string_cuts_before_it_and_holds_back_what_could_start_it(tokenizer: Any, per_step: int) -> None:
    out = choice(tokenizer, stop=["日本"])
    deltas = feed(out, ids_of(tokenizer, TEXT), per_step=per_step)
    assert out.text == "".join(deltas) == TEXT[:TEXT.index("日本")]
    assert (out.finish_reason, out.stop_reason) == ("stop", "日本")
    assert len(out.token_ids) <= len(ids_of(tokenizer, TEXT[:TEXT.index("日本") + 2]))


def test_stop_string_included_keeps_it_and_drops_tokens_after_it(tokenizer: Any) -> None:
    out = choice(tokenizer, stop=["wörld"], include_stop_str_in_output=True)
    ids = ids_of(tokenizer, TEXT)
    delta = out.process(EngineCoreOutput("r", ids))  # every token in one step: the ones after the match drop
    assert delta.text == out.text == "Hello wörld" and delta.stopped
    assert tokenizer.decode(out.token_ids) == "Hello wörld"


def test_stop_string_is_found_across_outputs_and_asks_for_an_abort(tokenizer: Any) -> None:
    out = choice(tokenizer, stop=["ok, done"])
    stopped = []
    for token in ids_of(tokenizer, TEXT):
        delta = out.process(EngineCoreOutput("r", [token]))
        stopped.append(delta.stopped)
        if out.finished:
            break
    assert stopped[-1] and not any(stopped[:-1])
    assert out.text == TEXT[:TEXT.index("ok, done")]


def test_min_tokens_delays_the_stop_string_search(tokenizer: Any) -> None:
    ids = ids_of(tokenizer, "ab ab ab ab")
    early = choice(tokenizer, stop=["ab"])
    feed(early, ids)
    late = choice(tokenizer, stop=["ab"], min_tokens=len(ids_of(tokenizer, "ab ab")))
    feed(late, ids)
    assert early.text == "" and late.text.startswith("ab ab") and late.stop_reason == "ab"


def test_a_stop_token_is_counted_but_not_shown(tokenizer: Any) -> None:
    ids = ids_of(tokenizer, "Hello")
    stop_id = ids_of(tokenizer, " wörld")[0]
    out = choice(tokenizer, stop_token_ids=[stop_id], skip_special_tokens=False)
    delta = out.process(EngineCoreOutput("r", [*ids, stop_id], finish_reason=FinishReason.STOP, stop_reason=stop_id))
    assert (delta.text, len(out.token_ids), out.finish_reason, out.stop_reason) == ("Hello", len(ids) + 1, "stop",
                                                                                    stop_id)
    shown = choice(tokenizer, stop_token_ids=[stop_id], include_stop_str_in_output=True)
    shown.process(EngineCoreOutput("r", [*ids, stop_id], finish_reason=FinishReason.STOP, stop_reason=stop_id))
    assert shown.text == tokenizer.decode([*ids, stop_id])


@pytest.mark.parametrize(("reason", "name"), [(FinishReason.LENGTH, "length"), (FinishReason.ABORT, "abort"),
                                              (FinishReason.REPETITION, "repetition")])
def test_finish_reasons_are_vllms_names(tokenizer: Any, reason: FinishReason, name: str) -> None:
    out = choice(tokenizer)
    delta = out.process(EngineCoreOutput("r", ids_of(tokenizer, "Hi"), finish_reason=reason))
    assert (delta.finish_reason, delta.text) == (name, "Hi")


def failed(error: RequestError | None) -> EngineCoreOutput:
    return EngineCoreOutput("r", [], finish_reason=FinishReason.ERROR, error=error)


@pytest.mark.parametrize(("error", "raised", "message"), [
    # a request error mmfront's engine names keeps its class, so it answers as that class
    (RequestError("PromptUpdateError", "placeholders do not match"), PromptUpdateError, "placeholders do not match"),
    (RequestError("MediaFetchError", "HTTP 404"), MediaFetchError, "HTTP 404"),
    # vLLM's engine calls a request it refused a validation_error
    (RequestError("validation_error", "bad uuid"), ValidationError, "bad uuid"),
    # anything else is the engine's: retryable when it says so or names a retryable error
    (RequestError("RuntimeError", "boom"), GenerationError, "The engine failed the request: boom"),
    (RequestError("engine_paused", "Generation is paused.", retryable=True), RetryableRequestError,
     "The engine failed the request: Generation is paused."),
    (RequestError("ResourceError", "out of memory"), RetryableRequestError, "The engine failed the request: out of memory"),
    (RequestError("DecodeError", "truncated"), GenerationError, "The engine failed the request: truncated"),
    (None, GenerationError, "The engine failed the request: Internal server error"),
])
def test_engine_errors_are_the_requests_or_the_engines(tokenizer: Any, error: RequestError | None, raised: type,
                                                       message: str) -> None:
    with pytest.raises(raised) as info:
        choice(tokenizer).process(failed(error))
    assert type(info.value) is raised and str(info.value) == message


def test_logprobs_in_openai_shapes(tokenizer: Any) -> None:
    def whole(text: str) -> list[int]:  # tokens that are whole characters: their texts are their decodes
        return [t for t in ids_of(tokenizer, text) if not tokenizer.decode([t]).endswith("\ufffd")][:2]

    ids, alt = whole("Hello there"), whole("wörld")
    # vLLM's LogprobsLists: per token the sampled id then the top-2, and their logprobs
    rows = np.array([[ids[0], ids[0], alt[0]], [ids[1], alt[1], ids[1]]], dtype=np.int32)
    logprobs = np.array([[-0.1, -0.1, -2.0], [-float("inf"), -0.5, -float("inf")]])
    out = ChoiceOutput(make_detokenizer(tokenizer, ids_of(tokenizer, "Say:"), skip_special_tokens=True),
                       SamplingParams(logprobs=2), LogprobTokens(tokenizer))
    delta = out.process(EngineCoreOutput("r", ids, new_logprobs=LogprobsLists(rows, logprobs, np.array([1, 2]))))
    assert delta.logprobs is not None and [next(iter(p)) for p in delta.logprobs] == ids

    def decode(t: int) -> str:
        return str(tokenizer.decode([t]))

    content = chat_logprobs(ids, delta.logprobs, 2, LogprobFormat(decode)).content
    assert content is not None and [c.token for c in content] == [decode(t) for t in ids]
    assert content[0].logprob == -0.1 and content[1].logprob == -9999.0
    assert content[0].bytes == list(decode(ids[0]).encode())
    assert [t.token for t in content[0].top_logprobs] == [decode(ids[0]), decode(alt[0])]
    assert [t.token for t in content[1].top_logprobs] == [decode(ids[1]), decode(alt[1])]
    legacy = completion_logprobs(ids, delta.logprobs, 0, LogprobFormat(decode))
    assert legacy.tokens == [decode(t) for t in ids]
    assert legacy.text_offset == [0, len(decode(ids[0]))]
    assert legacy.token_logprobs == [-0.1, -9999.0]
    assert legacy.top_logprobs == [{decode(ids[0]): -0.1}, {decode(ids[1]): -9999.0}]
    plain = choice(tokenizer)  # logprobs not asked for: none reported, even when the engine sends some
    assert plain.process(EngineCoreOutput("r", ids, new_logprobs=LogprobsLists(rows, logprobs, np.array([1, 2])))
                         ).logprobs is None
