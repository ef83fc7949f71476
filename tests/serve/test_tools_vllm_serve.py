"""Tools and reasoning through ``mmfront serve`` and ``vllm serve`` side by side (the harness of
test_vllm_serve_parity.py), both started with ``--enable-auto-tool-choice --tool-call-parser
hermes --reasoning-parser deepseek_r1``, each in front of a stock vLLM 0.33 engine whose executor
answers with the text the request scripts (tests/serve/data/script_stub.py: the last
``<<<...>>>`` of the prompt; ``<<<ECHO>>>`` answers with the prompt itself).

The model folder is the peer's tiny Gemma 3 with a chat template that renders tools, tool calls,
tool results and reasoning, and two unused tokens renamed ``<think>`` and ``</think>`` (vLLM's
reasoning parser looks them up in the vocabulary).

Compared: the prompt the template renders from tools and a tool-calling history (echoed back);
calls read by ``tool_choice: "auto"`` whole and streamed, with reasoning and content before
them; ``tool_choice: "none"``; ``parallel_tool_calls: false``; vLLM's 400s for tool fields.
``tool_choice: "required"``, a named tool, ``parallel_tool_calls: false`` and ``strict`` tools:
the structural tag both servers send the engine (the script stub prints what the engine
decoded), and what they make of the answer it admits.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_vllm_serve_parity import MODEL, PEER, PEER_DIR, SERVED, Pair, Side, ask, running_pair

from mmfront.testing.peer import SKIP_REASON

pytestmark = pytest.mark.vllm_side_by_side

DATA = Path(__file__).parent / "data"
FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--reasoning-parser", "deepseek_r1"]
TEMPLATE = """{%- if tools %}<tools>{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>
{% endif %}{%- for m in messages %}<|{{ m.role }}|>
{%- if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}\
{% endif %}{% endfor %}{% endif %}
{%- if m.reasoning_content %}(thought: {{ m.reasoning_content }}){% endif %}
{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function.name }} {{ c.function.arguments | tojson }}\
</tool_call>{% endfor %}{% endif %}
{%- if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}
{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"""
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string"}}, "required": ["city"]}}},
         {"type": "function", "function": {"name": "get_time"}}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def model_folder(folder: Path) -> Path:
    """The peer's tiny Gemma 3 folder with the test's template and the reasoning markers."""
    assert MODEL is not None
    model = folder / "tiny-gemma3-tools"
    shutil.copytree(MODEL, model)
    (model / "chat_template.jinja").write_text(TEMPLATE)
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    vocab = tokenizer["model"]["vocab"]
    for unused, marker in (("<unused0>", "<think>"), ("<unused1>", "</think>")):
        index = vocab.pop(unused)
        vocab[marker] = index
        tokenizer["added_tokens"].append({"id": index, "content": marker, "single_word": False, "lstrip": False,
                                          "rstrip": False, "normalized": False, "special": False})
    (model / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    return model


@contextlib.contextmanager
def scripted_pair(folder: Path) -> Iterator[Pair]:
    """Both servers with the tool and reasoning parsers (:data:`FLAGS`), each in front of a stock
    engine running the scripting stub executor, on :func:`model_folder`'s model."""
    with running_pair(folder, model=model_folder(folder), server_args=FLAGS, engine_path=[PEER_DIR, DATA],
                      engine_args=["--distributed-executor-backend", "script_stub.ScriptStubExecutor"]) as servers:
        yield servers


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    if PEER is None or MODEL is None or not PEER_DIR.is_dir():
        pytest.skip(SKIP_REASON)
    with scripted_pair(tmp_path_factory.mktemp("tools")) as servers:
        yield servers


def chat(script: str, **fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "max_tokens": 200, "messages": [{"role": "user", "content": f"<<<{script}>>>"}],
            "tools": TOOLS, **fields}
"""The stub ends a script with ``<eos>``, which stops both: each sends the engine the tokenizer's EOS
(vLLM's ``SamplingParams._eos_token_id``)."""


def pair_sides(pair: Pair) -> tuple[Side, Side]:
    return pair.vllm, pair.mmfront


def masked(message: dict[str, Any]) -> dict[str, Any]:
    calls = message.get("tool_calls")
    if calls:
        for call in calls:
            assert call["id"].startswith("chatcmpl-tool-")
            call["id"] = "ID"
    return message


def choice(pair: Pair, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    vllm, mmfront = ask(pair.vllm, "POST", "/v1/chat/completions", body), ask(pair.mmfront, "POST",
                                                                              "/v1/chat/completions", body)
    assert (vllm.status, mmfront.status) == (200, 200), (vllm.text, mmfront.text)
    return vllm.json()["choices"][0], mmfront.json()["choices"][0]


def test_the_template_gets_the_tools_and_the_history_as_vllms(pair: Pair) -> None:
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "reasoning_content": "I should call it.", "tool_calls": [
            {"id": "call1", "type": "function", "function": {"name": "get_weather",
                                                             "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call1", "content": [{"type": "text", "text": "sunny"},
                                                              {"type": "text", "text": "20 C"}]},
        {"role": "user", "content": "<<<ECHO>>>"},
    ]
    vllm, mmfront = choice(pair, {"model": SERVED, "max_tokens": 400, "messages": history, "tools": TOOLS})
    assert mmfront["message"]["reasoning"] == vllm["message"]["reasoning"]
    assert mmfront == vllm
    assert vllm["finish_reason"] == "stop" and vllm["stop_reason"] is None  # the tokenizer's EOS
    echoed = mmfront["message"]["reasoning"]
    assert '"name": "get_weather"' in echoed and "[call1]" in echoed and "sunny\n20 C" in echoed


@pytest.mark.parametrize("script", [f"</think>Let me check.{CALL}", f"<think>Paris, then.</think>{CALL}{CALL}",
                                    "</think>No call needed.", "</think>" + CALL.replace("}}<", "}<")])
def test_auto_tool_choice_reads_calls_as_vllm(pair: Pair, script: str) -> None:
    body = chat(script)
    vllm_body, mmfront_body = (ask(side, "POST", "/v1/chat/completions", body).json() for side in pair_sides(pair))
    assert mmfront_body["usage"] == vllm_body["usage"]  # reasoning_tokens counted as vLLM counts them
    vllm, mmfront = choice(pair, body)
    assert masked(mmfront["message"]) == masked(vllm["message"])
    assert mmfront["finish_reason"] == vllm["finish_reason"]


@pytest.mark.parametrize("fields", [{"tool_choice": "none"}, {"include_reasoning": False}, {"tool_choice": None}])
def test_the_tool_fields_as_vllm(pair: Pair, fields: dict[str, Any]) -> None:
    vllm, mmfront = choice(pair, chat(f"<think>x</think>{CALL}{CALL}", **fields))
    assert masked(mmfront["message"]) == masked(vllm["message"])
    assert mmfront["finish_reason"] == vllm["finish_reason"]


def streamed_choices(side: Side, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Each choice of each chunk of the streamed answer to ``body``."""
    import httpx

    with httpx.stream("POST", side.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                yield from json.loads(line[6:])["choices"]


def assembled(side: Side, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"reasoning": "", "content": "", "calls": {}, "finish_reason": None}
    for c in streamed_choices(side, body):
        delta = c["delta"]
        out["reasoning"] += delta.get("reasoning") or ""
        out["content"] += delta.get("content") or ""
        for call in delta.get("tool_calls") or []:
            entry = out["calls"].setdefault(call["index"], {"name": "", "arguments": ""})
            entry["name"] += call.get("function", {}).get("name") or ""
            entry["arguments"] += call.get("function", {}).get("arguments") or ""
        out["finish_reason"] = c.get("finish_reason") or out["finish_reason"]
    for entry in out["calls"].values():
        entry["arguments"] = json.loads(entry["arguments"])
    return out


@pytest.mark.parametrize("script", [f"<think>Paris, then.</think>Let me check.{CALL}{CALL}",
                                    "</think>No call needed.", f"Let me check.{CALL}"])
def test_a_stream_assembles_as_vllms(pair: Pair, script: str) -> None:
    """The script sits in the prompt, so where it holds a ``</think>`` the prompt has closed the
    reasoning and both streams send all as content (vLLM's stream checks the prompt first)."""
    assert assembled(pair.mmfront, chat(script)) == assembled(pair.vllm, chat(script))


@pytest.mark.parametrize("fields", [{"tools": []}, {"tools": None, "tool_choice": "auto"},
                                    {"tool_choice": "sometimes"},
                                    {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
                                    {"tool_choice": {"type": "function", "function": {}}},
                                    {"tool_choice": {"type": "function", "function": {"name": ""}}}])
def test_bad_tool_fields_answer_vllms_400(pair: Pair, fields: dict[str, Any]) -> None:
    body = chat("x", **fields)
    vllm, mmfront = (ask(side, "POST", "/v1/chat/completions", body) for side in (pair.vllm, pair.mmfront))
    assert (mmfront.status, vllm.status) == (400, 400)
    mine, theirs = mmfront.json()["error"], vllm.json()["error"]
    assert (mine["type"], mine["param"]) == (theirs["type"], theirs["param"])
    assert mine["message"].split(" (parameter=")[0] in theirs["message"]


STRICT_TOOLS = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]


def constraints(side: Side) -> list[dict[str, Any]]:
    """The structured-outputs constraints the side's engine received, in order (the script stub
    prints each request's, as decoded from the server's ``EngineCoreRequest``)."""
    marker = "STRUCTURED_OUTPUTS "
    lines = side.logs["engine"].read_text(errors="replace").splitlines()
    return [json.loads(line[line.index(marker) + len(marker):]) for line in lines if marker in line]


@pytest.mark.parametrize(("fields", "script"), [
    ({"tool_choice": "required"}, CALL + CALL),
    ({"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, CALL),
    ({"parallel_tool_calls": False}, f"Let me check.{CALL}"),
    ({"tools": STRICT_TOOLS}, f"Sure.{CALL}"),
    ({"tools": STRICT_TOOLS, "response_format": {"type": "json_object"}}, CALL),
    ({"tools": STRICT_TOOLS, "response_format": {"type": "json_object"}}, '{"answer": 42}'),
], ids=["required", "named", "one_call", "strict", "strict_or_json_calls", "strict_or_json_object"])
def test_the_calls_are_constrained_by_vllms_structural_tag(pair: Pair, fields: dict[str, Any], script: str) -> None:
    """The engine receives the same constraint from both servers (vLLM's hermes structural tag,
    compiled by the stock engine core), and the answer, which the constraint admits, reads alike."""
    before = [len(constraints(side)) for side in pair_sides(pair)]
    body = chat(script, **fields)
    vllm, mmfront = choice(pair, body)
    sent = [constraints(side)[n:] for side, n in zip(pair_sides(pair), before)]
    assert len(sent[0]) == 1 and sent[1] == sent[0]
    assert sent[0][0]["structural_tag"] is not None and sent[0][0]["_backend"] == "xgrammar"
    assert masked(mmfront["message"]) == masked(vllm["message"])
    assert mmfront["finish_reason"] == vllm["finish_reason"]
    assert assembled(pair.mmfront, body) == assembled(pair.vllm, body)


def test_auto_without_strict_tools_sends_no_constraint(pair: Pair) -> None:
    before = [len(constraints(side)) for side in pair_sides(pair)]
    choice(pair, chat(CALL))
    assert [len(constraints(side)) for side in pair_sides(pair)] == before


def tool_call_events(side: Side, body: dict[str, Any]) -> tuple[list[Any], str | None]:
    """A stream's tool-call deltas as they arrive, ids masked, consecutive argument fragments of
    one call joined (where a stream is cut into chunks depends on timing), and its finish reason."""
    events: list[Any] = []
    finish = None
    for c in streamed_choices(side, body):
        finish = c.get("finish_reason") or finish
        for call in c["delta"].get("tool_calls") or []:
            if "id" in call:
                assert call["id"].startswith("chatcmpl-tool-")
                events.append({**call, "id": "ID"})
            elif events and set(events[-1]) == {"index", "function"} and events[-1]["index"] == call["index"]:
                events[-1]["function"]["arguments"] += call["function"]["arguments"]
            else:
                events.append(call)
    return events, finish


@pytest.mark.parametrize(("script", "max_tokens"), [
    (f"</think>Let me check.{CALL}", 200), (f"</think>{CALL}\n{CALL.replace('Paris', 'Rome')}", 200),
    (f"</think>{CALL}", 17)],
    ids=["one_call", "two_calls", "cut_by_max_tokens"])
def test_a_streamed_call_sends_its_name_then_its_arguments_as_vllm(pair: Pair, script: str, max_tokens: int) -> None:
    """The ``</think>`` in the prompt (the script) closes the reasoning, so the answer is read for calls."""
    body = chat(script, max_tokens=max_tokens)
    vllm, finish = tool_call_events(pair.vllm, body)
    assert tool_call_events(pair.mmfront, body) == (vllm, finish)
    assert vllm[0] == {"id": "ID", "type": "function", "index": 0, "function": {"name": "get_weather"}}
    if max_tokens < 200:  # cut inside the arguments: the call so far was sent
        assert finish == "length" and vllm[1]["function"]["arguments"] != '{"city": "Paris"}'
