"""What vLLM's own tool and reasoning parsers make of model outputs (runs in the vLLM peer venv).

Reads a JSON list of cases on stdin (``{"kind": "tool"|"reasoning", "parser": NAME, "text": STR,
"tools": [...] | null, "chat_template_kwargs": {...} | null}``) and writes, per case, what the
installed vLLM parser returns: the non-streaming extraction, and the stream of the text's tokens
(``chunks``: each token's text, as an incremental detokenizer gives it) reassembled: the content,
the reasoning, and each tool call's name and concatenated arguments; and, for tool parsers, each
chunk's delta as vLLM's stream sends it (``deltas``: ``null``, or the content and each tool-call
delta as ``[index, has an id, type, name, arguments]``). A parser that raises gives
``{"error": "..."}``.

The tokenizer is the peer's tiny Gemma 3 one with the parsers' markers added as special tokens
(vLLM's parsers look their markers up in the vocabulary).
"""

from __future__ import annotations

import json
import sys
from typing import Any

MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<|python_tag|>", "[TOOL_CALLS]", "[ARGS]",
           "[THINK]", "[/THINK]",
           "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>",
           "<｜tool▁sep｜>", "<|im_end|>", "<|im_start|>"]


def tokenizer(model: str) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tok.add_special_tokens({"additional_special_tokens": MARKERS})
    return tok


def chunks(tok: Any, text: str) -> list[str]:
    ids = tok.encode(text, add_special_tokens=False)
    out, sent = [], ""
    for i in range(1, len(ids) + 1):
        decoded = tok.decode(ids[:i], skip_special_tokens=False)
        if not decoded.endswith("\ufffd"):  # a character still incomplete waits for its bytes
            out.append(decoded[len(sent):])
            sent = decoded
    return out


def request(tools: list[dict[str, Any]] | None) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=tools)


def run_tool(tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    from vllm.tool_parsers import ToolParserManager

    cls = ToolParserManager.get_tool_parser(case["parser"])
    req = request(case.get("tools"))
    tools = req.tools
    parser = cls(tok, tools) if tools else cls(tok)
    info = parser.extract_tool_calls(case["text"], req)
    whole = {"tools_called": info.tools_called, "content": info.content,
             "tool_calls": [[c.function.name, c.function.arguments] for c in info.tool_calls]}
    parser = cls(tok, tools) if tools else cls(tok)
    previous, prev_ids = "", []
    content, calls, deltas = [], {}, []
    for chunk in case["chunks"]:
        ids = tok.encode(chunk, add_special_tokens=False)
        current = previous + chunk
        delta = parser.extract_tool_calls_streaming(previous, current, chunk, prev_ids, prev_ids + ids, ids, req)
        previous, prev_ids = current, prev_ids + ids
        deltas.append(None if delta is None else {"content": delta.content, "tool_calls": [
            [tc.index, tc.id is not None, tc.type, tc.function.name if tc.function else None,
             tc.function.arguments if tc.function else None] for tc in delta.tool_calls or []]})
        if delta is None:
            continue
        if delta.content:
            content.append(delta.content)
        for tc in delta.tool_calls or []:
            entry = calls.setdefault(tc.index, ["", ""])
            if tc.function is not None:
                entry[0] += tc.function.name or ""
                entry[1] += tc.function.arguments or ""
    stream = {"content": "".join(content), "tool_calls": [calls[i] for i in sorted(calls)]}
    return {"whole": whole, "stream": stream, "deltas": deltas}


def run_reasoning(tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    from vllm.reasoning import ReasoningParserManager

    cls = ReasoningParserManager.get_reasoning_parser(case["parser"])
    req = request(None)
    kwargs = {"chat_template_kwargs": case["chat_template_kwargs"]} if case.get("chat_template_kwargs") else {}
    parser = cls(tok, **kwargs)
    reasoning, content = parser.extract_reasoning(case["text"], req)
    whole = {"reasoning": reasoning, "content": content}
    parser = cls(tok, **kwargs)
    previous, prev_ids = "", []
    parts: dict[str, list[str]] = {"reasoning": [], "content": []}
    for chunk in case["chunks"]:
        ids = tok.encode(chunk, add_special_tokens=False)
        current = previous + chunk
        delta = parser.extract_reasoning_streaming(previous, current, chunk, prev_ids, prev_ids + ids, ids)
        previous, prev_ids = current, prev_ids + ids
        if delta is None:
            continue
        if delta.reasoning:
            parts["reasoning"].append(delta.reasoning)
        if delta.content:
            parts["content"].append(delta.content)
    stream = {k: "".join(v) for k, v in parts.items()}
    return {"whole": whole, "stream": stream}


def main() -> None:
    import logging

    logging.disable(logging.CRITICAL)
    tok = tokenizer(sys.argv[1])
    out = []
    for case in json.load(sys.stdin):
        case["chunks"] = chunks(tok, case["text"])
        try:
            out.append(run_tool(tok, case) if case["kind"] == "tool" else run_reasoning(tok, case))
        except Exception as e:
            out.append({"error": f"{type(e).__name__}: {e}"})
        out[-1]["chunks"] = case["chunks"]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
