"""mmfront's parsers and the installed vLLM 0.33 parsers, side by side, on the model outputs of
vLLM's own parser tests (tests/serve/parser_cases.py): the same whole answer, and, when both are
fed the text token by token (vLLM's chat server's parser, ``parse_delta`` with the last token
``finished``, on the peer's tokenizer with the markers added: tests/serve/data/vllm_parser_oracle.py),
the same deltas token by token (mmfront's last delta is its last feed and its finish together,
as vLLM flushes its parser on the last token).

Skipped where the peer venv or its model folder is absent."""

from __future__ import annotations

import itertools
import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
from parser_cases import (
    FORCED_JSON_CASES,
    FORCED_JSON_TOOLS,
    FORCED_MISTRAL_CASES,
    FORCED_TOOLS,
    REASONING_CASES,
    STREAMED_PREFIX,
    TOOL_CASES,
    stream_tools,
)

from mmfront.serve.reasoning import REASONING_PARSERS, ReasoningStream
from mmfront.serve.tool_parsers import StreamDelta, ToolCallStream, join_call_deltas, make_tool_parser
from mmfront.serve.tool_parsers.forced_stream import ForcedCallStream
from mmfront.testing.peer import SKIP_REASON, vllm_peer_model_dir, vllm_peer_python

PEER = vllm_peer_python()
MODEL = None if PEER is None else vllm_peer_model_dir(PEER)
ORACLE = Path(__file__).parent / "data" / "vllm_parser_oracle.py"
pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side, pytest.mark.skipif(PEER is None or MODEL is None, reason=SKIP_REASON)]


@pytest.fixture(scope="module")
def vllm() -> dict[str, Any]:
    cases = [{"kind": "tool", "parser": p, "text": t, "tools": tools, "stream_tools": stream_tools(case)}
             for case, (p, t, tools, _) in TOOL_CASES.items()]
    cases += [{"kind": "reasoning", "parser": p, "text": t, "chat_template_kwargs": kw}
              for p, t, kw, _, _ in REASONING_CASES.values()]
    cases += [{"kind": "tool", "parser": "mistral", "text": t, "tools": FORCED_TOOLS, "tool_choice": choice,
               "without_markers": [] if args else ["[ARGS]"]} for t, choice, args, _ in FORCED_MISTRAL_CASES.values()]
    cases += [{"kind": "tool", "parser": TOOL_CASES[c][0], "text": TOOL_CASES[c][1], "tools": TOOL_CASES[c][2],
               "stream_tools": stream_tools(c), "chunk_texts": chunks} for c, chunks in SPLITS]
    cases += [{"kind": "tool", "parser": "pythonic", "text": FORCED_JSON_CASES[c][0], "tools": FORCED_JSON_TOOLS,
               "tool_choice": FORCED_JSON_CASES[c][1], "chunk_texts": chunks} for c, chunks in FORCED_SPLITS]
    done = subprocess.run([str(PEER), str(ORACLE), str(MODEL)], input=json.dumps(cases), capture_output=True,
                          text=True, timeout=600, check=True)
    answers = json.loads(done.stdout)
    keys = [*TOOL_CASES, *REASONING_CASES, *(f"forced-{c}" for c in FORCED_MISTRAL_CASES),
            *(f"{c}/split{n}" for n, (c, _) in enumerate(SPLITS)),
            *(f"forced-json-{c}/split{n}" for n, (c, _) in enumerate(FORCED_SPLITS))]
    return dict(zip(keys, answers, strict=True))


def random_splits(text: str, seed: int, count: int) -> list[list[str]]:
    """``count`` ways to cut ``text`` into chunks (as an engine step of several tokens, or a
    client's network, would), ``<|python_tag|>`` kept whole (it is one token), and the text in
    one chunk."""
    rng = random.Random(seed)
    tag = "<|python_tag|>"
    inside = {i for s in range(len(text)) if text.startswith(tag, s) for i in range(s + 1, s + len(tag))}
    places = [i for i in range(1, len(text)) if i not in inside]
    splits = [[text]]
    for _ in range(count):
        cuts = sorted(rng.sample(places, rng.randint(1, min(len(places), 30))))
        splits.append([text[a:b] for a, b in itertools.pairwise([0, *cuts, len(text)])])
    return splits


SPLITS = [(case, chunks) for case in sorted(c for c in TOOL_CASES if TOOL_CASES[c][0] in {*STREAMED_PREFIX, "pythonic"})
          for chunks in random_splits(TOOL_CASES[case][1], seed=len(case), count=4)]
"""Chunkings of the cases whose stream depends on how the text arrives (llama3_json's: its
fragments are cut where one step's reading differs from the last one's; pythonic's: the empty
delta of a step after which the list is whole)."""

FORCED_SPLITS = [(case, chunks) for case in sorted(FORCED_JSON_CASES)
                 for chunks in [None, *random_splits(FORCED_JSON_CASES[case][0], seed=len(case), count=3)]]
"""The forced-JSON cases token by token (``None``), in one chunk, and cut at random places."""


@pytest.mark.parametrize("case", sorted(TOOL_CASES))
def test_tool_calls_as_vllm(vllm: dict[str, Any], case: str) -> None:
    name, text, tools, _ = TOOL_CASES[case]
    answer = vllm[case]
    assert "error" not in answer, answer
    result = make_tool_parser(name, tools).extract(text)
    mine = {"tools_called": result.tools_called, "content": result.content,
            "tool_calls": [[c.name, c.arguments] for c in result.tool_calls]}
    assert mine == answer["whole"]

    stream = ToolCallStream(make_tool_parser(name, stream_tools(case)))
    assert token_by_token(stream, answer["chunks"]) == answer["deltas"]


@pytest.mark.parametrize("case", sorted({c for c, _ in SPLITS}))
def test_any_chunking_streams_as_vllm(vllm: dict[str, Any], case: str) -> None:
    """The text in one chunk and cut at random places: the same deltas, chunk by chunk."""
    for n, (name, chunks) in enumerate(SPLITS):
        if name == case:
            answer = vllm[f"{case}/split{n}"]
            stream = ToolCallStream(make_tool_parser(TOOL_CASES[case][0], stream_tools(case)))
            assert token_by_token(stream, chunks) == answer["deltas"], chunks


@pytest.mark.parametrize("case", sorted(FORCED_MISTRAL_CASES))
def test_mistral_forced_calls_as_vllm(vllm: dict[str, Any], case: str) -> None:
    """The bare JSON array vLLM constrains ``required`` and named calls to, read as vLLM reads it:
    calls where the vocabulary predates ``[ARGS]``, content after it; a stream with ``[ARGS]``
    sends vLLM's deltas (one without streams each call whole: docs/serving.md)."""
    text, choice, has_args, expected = FORCED_MISTRAL_CASES[case]
    answer = vllm[f"forced-{case}"]
    vocab = {"[TOOL_CALLS]": 1, **({"[ARGS]": 2} if has_args else {})}
    forced = choice != "auto"
    result = make_tool_parser("mistral", FORCED_TOOLS, vocab, forced=forced).extract(text)
    mine = (result.tools_called, [(c.name, c.arguments) for c in result.tool_calls], result.content)
    theirs = answer["whole"]
    assert mine == (theirs["tools_called"], [tuple(c) for c in theirs["tool_calls"]], theirs["content"]) == expected
    if has_args:
        stream = ToolCallStream(make_tool_parser("mistral", FORCED_TOOLS, vocab, forced=forced))
        assert token_by_token(stream, answer["chunks"]) == answer["deltas"]


@pytest.mark.parametrize("case", sorted(FORCED_JSON_CASES))
def test_forced_json_calls_stream_as_vllm(vllm: dict[str, Any], case: str) -> None:
    """``tool_choice: "required"`` and a named tool with ``pythonic`` (vLLM's chat server streams
    the JSON they constrain to with its shared code): the same deltas, token by token and
    chunked at random; a named tool's every step sends a fragment, even an empty one."""
    text, choice, calls = FORCED_JSON_CASES[case]
    named = None if choice == "required" else choice["function"]["name"]
    for n, (name, _) in enumerate(FORCED_SPLITS):
        if name != case:
            continue
        answer = vllm[f"forced-json-{case}/split{n}"]
        assert "error" not in answer and "".join(answer["chunks"]) == text, answer
        stream = ForcedCallStream(named)
        mine = [wire(StreamDelta(tool_calls=stream.feed(c))) for c in answer["chunks"]]
        assert mine == answer["deltas"], answer["chunks"]
        assert answer["stream"]["tool_calls"] == [list(c) for c in calls]


def token_by_token(stream: ToolCallStream, chunks: list[str]) -> list[dict[str, Any] | None]:
    """The deltas of a stream fed ``chunks``, its end flushed into the last one's delta."""
    *first, last = chunks
    deltas = [wire(stream.feed(c)) for c in first]
    final = stream.feed(last)
    rest = stream.finish()
    if rest.content is not None:
        final.content = (final.content or "") + rest.content
    final.tool_calls = join_call_deltas(final.tool_calls, rest.tool_calls)
    return [*deltas, wire(final)]


def wire(delta: StreamDelta) -> dict[str, Any] | None:
    """A delta as the oracle writes vLLM's (``None``: nothing sent; ``"content": ""``: an empty
    delta, which vLLM's server sends as a chunk of its own)."""
    if delta.content is None and not delta.tool_calls:
        return None
    return {"content": delta.content, "tool_calls": [[c.index, c.id is not None, c.type, c.name, c.arguments]
                                                     for c in delta.tool_calls]}


@pytest.mark.parametrize("case", sorted(REASONING_CASES))
def test_reasoning_as_vllm(vllm: dict[str, Any], case: str) -> None:
    name, text, kwargs, _, _ = REASONING_CASES[case]
    answer = vllm[case]
    assert "error" not in answer, answer
    reasoning, content = REASONING_PARSERS[name](kwargs).extract(text)
    assert {"reasoning": reasoning, "content": content} == answer["whole"]
    stream = ReasoningStream(REASONING_PARSERS[name](kwargs))
    parts = {"reasoning": "", "content": ""}
    for delta in [*(stream.feed(c) for c in answer["chunks"]), stream.finish()]:
        parts["reasoning"] += delta.reasoning or ""
        parts["content"] += delta.content or ""
    assert parts == answer["stream"]
