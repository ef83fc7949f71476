"""The structured-outputs constraint vLLM 0.33 puts on chat requests with tools (runs in the vLLM
peer venv): its ``Parser._apply_structural_tag`` then the tool parser's ``adjust_request``, as its
chat serving runs them.

The tool parsers are made with the peer's tokenizer and their markers
(tests/serve/data/vllm_parser_oracle.py), whose folder is the first argument. Reads a JSON list of
cases on stdin (``{"parser": NAME, "strict_level": "auto"|"function"|
"parameter"|null, "request": {...chat request fields...}}``) and writes, per case, the request's
constraint its ``to_sampling_params`` then sends (``extract_structured_outputs``: every field of
vLLM's ``StructuredOutputsParams``, or ``null``), or ``{"error": "..."}`` where vLLM refuses it.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any


def constraint(tok: Any, case: dict[str, Any]) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.abstract_parser import DelegatingParser
    from vllm.tool_parsers import ToolParserManager
    from vllm.tool_parsers.tool_strict_level import ToolStrictLevel

    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], **case["request"])
    tool_parser = ToolParserManager.get_tool_parser(case["parser"])
    parser = DelegatingParser.__new__(DelegatingParser)
    parser._reasoning_parser = None
    parser._tool_parser = tool_parser(tok, request.tools)
    level = case.get("strict_level")
    parser.tool_strict_level = None if level is None else ToolStrictLevel.from_name(level)
    request = parser.adjust_request(request)
    found = request.extract_structured_outputs()
    if found is None:
        return None
    return {f.name: getattr(found, f.name) for f in dataclasses.fields(found)}


def main() -> None:
    import logging

    from vllm_parser_oracle import tokenizer

    logging.disable(logging.CRITICAL)
    tok = tokenizer(sys.argv[1])
    out = []
    for case in json.load(sys.stdin):
        try:
            out.append(constraint(tok, case))
        except Exception as e:
            out.append({"error": f"{type(e).__name__}: {e}"})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
