"""What vLLM's own tool and reasoning parsers make of model outputs (runs in the vLLM peer venv).

Reads a JSON list of cases on stdin (``{"kind": "tool"|"reasoning", "parser": NAME, "text": STR,
"tools": [...] | null, "stream_tools": [...] | null (the request's tools for the stream, which
vLLM reads only with tools), "tool_choice": ... | null, "without_markers": [...] | null (markers the
tokenizer lacks), "chat_template_kwargs": {...} | null, "chunk_texts": [...] | null (the stream's chunks, instead
of the text's tokens)}``) and writes, per case, what the
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


def tokenizer(model: str, without: tuple[str, ...] = ()) -> Any:
    """``without``: markers left out (``[ARGS]``: a Mistral vocabulary before v11)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    tok.add_special_tokens({"additional_special_tokens": [m for m in MARKERS if m not in without]})
    return tok


def decode(tok: Any, ids: list[int]) -> str:
    """The text of ``ids`` with each added marker as it is written (the tiny tokenizer's decoder
    would turn the ``▁`` of DeepSeek's markers into spaces, which the model's own does not)."""
    added = {i: t.content for i, t in tok.added_tokens_decoder.items() if t.content in MARKERS}
    out, run = [], []
    for i in [*ids, None]:
        if i is None or i in added:
            if run:
                out.append(tok.decode(run, skip_special_tokens=False))
                run = []
            if i is not None:
                out.append(added[i])
        else:
            run.append(i)
    return "".join(out)


def chunks(tok: Any, text: str) -> list[tuple[str, list[int]]]:
    """The text token by token as an incremental detokenizer gives it: each chunk's text and ids
    (a token that leaves a character incomplete waits for the next)."""
    ids = tok.encode(text, add_special_tokens=False)
    out, sent, start = [], "", 0
    for i in range(1, len(ids) + 1):
        decoded = decode(tok, ids[:i])
        if not decoded.endswith("\ufffd"):
            out.append((decoded[len(sent):], ids[start:i]))
            sent, start = decoded, i
    assert sent == text, (sent, text)
    return out


def request(tools: list[dict[str, Any]] | None, tool_choice: Any = None) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    extra = {} if tool_choice is None else {"tool_choice": tool_choice}
    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], tools=tools, **extra)


def run_tool(tok: Any, case: dict[str, Any]) -> dict[str, Any]:
    """The whole answer from the tool parser; the stream as vLLM's chat server makes it: the
    parser ``--tool-call-parser NAME --enable-auto-tool-choice`` composes, fed chunk by chunk
    through ``parse_delta`` (the last chunk with ``finished``, which flushes what the parser
    held back)."""
    from vllm.parser.parser_manager import ParserManager
    from vllm.tool_parsers import ToolParserManager

    cls = ToolParserManager.get_tool_parser(case["parser"])
    req = request(case.get("tools"), case.get("tool_choice"))
    tools = req.tools
    parser = cls(tok, tools) if tools else cls(tok)
    info = parser.extract_tool_calls(case["text"], req)
    whole = {"tools_called": info.tools_called, "content": info.content,
             "tool_calls": [[c.function.name, c.function.arguments] for c in info.tool_calls]}
    req = request(case.get("stream_tools") or case.get("tools"), case.get("tool_choice"))
    composed = ParserManager.get_parser(tool_parser_name=case["parser"], enable_auto_tools=True)(tok, req.tools)
    content, calls, deltas = [], {}, []
    for n, (chunk, ids) in enumerate(case["chunks"]):
        delta = composed.parse_delta(delta_text=chunk, delta_token_ids=list(ids), request=req, prompt_token_ids=[],
                                     finished=n == len(case["chunks"]) - 1)
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
    for chunk, ids in case["chunks"]:
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
    tokenizers = {(): tokenizer(sys.argv[1])}
    out = []
    for case in json.load(sys.stdin):
        without = tuple(case.get("without_markers") or ())
        if without not in tokenizers:
            tokenizers[without] = tokenizer(sys.argv[1], without)
        tok = tokenizers[without]
        given = case.get("chunk_texts")
        case["chunks"] = chunks(tok, case["text"]) if given is None else [(c, []) for c in given]
        try:
            out.append(run_tool(tok, case) if case["kind"] == "tool" else run_reasoning(tok, case))
        except Exception as e:
            out.append({"error": f"{type(e).__name__}: {e}"})
        out[-1]["chunks"] = [text for text, _ in case["chunks"]]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
