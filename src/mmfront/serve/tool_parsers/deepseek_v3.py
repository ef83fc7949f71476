"""``deepseek_v3``: DeepSeek V3 and R1's calls, ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME``,
a fenced JSON block of arguments and ``<｜tool▁call▁end｜>``, inside
``<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>``. The arguments are passed on as written."""

from __future__ import annotations

import re

from mmfront.serve.tool_parsers.base import (
    ExtractedToolCalls,
    PartialCall,
    StreamView,
    ToolCall,
    ToolParser,
    no_tool_calls,
    partial_overlap,
)

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_NAME = re.compile(rf"(?P<type>.*){SEP}(?P<name>.*)\n")
FENCE = "```json\n"
_CALL = re.compile(rf"{CALL_BEGIN}(?P<type>.*){SEP}(?P<name>.*)\n```json\n(?P<arguments>[\s\S]*?)\n```{CALL_END}")


class DeepSeekV3ToolParser(ToolParser):
    name = "deepseek_v3"
    structural_tag_model = "deepseek_r1"
    start_markers = (CALLS_BEGIN,)
    call_end = CALL_END

    def extract(self, text: str) -> ExtractedToolCalls:
        if CALLS_BEGIN not in text:
            return no_tool_calls(text)
        calls = [ToolCall(m["name"], m["arguments"], type=m["type"]) for m in _CALL.finditer(text)]
        content = text[:text.find(CALLS_BEGIN)]
        end = text.rfind(CALLS_END)
        if end != -1:
            content += text[end + len(CALLS_END):]
        return ExtractedToolCalls(True, calls, content or None)

    def stream_view(self, text: str, final: bool) -> StreamView:
        """vLLM's stream: the text outside the calls as content (the section's markers left
        out), a call's name once its line is whole, then its fenced JSON as written, short of
        the newlines and backticks that may be the fence's end."""
        begin = text.find(CALLS_BEGIN)
        if begin == -1:
            return StreamView(text if final else text[:self.content_end(text)], [])
        content, calls = [text[:begin]], []
        rest, pos = text[begin + len(CALLS_BEGIN):], 0
        while True:
            start = rest.find(CALL_BEGIN, pos)
            outside = rest[pos:] if start == -1 else rest[pos:start]
            if start == -1 and not final:
                outside = outside[:len(outside) - max(partial_overlap(outside, m) for m in (CALL_BEGIN, CALLS_END))]
            content.append(outside.replace(CALLS_END, ""))
            if start == -1:
                break
            body_start = start + len(CALL_BEGIN)
            end = rest.find(CALL_END, body_start)
            body = rest[body_start:] if end == -1 else rest[body_start:end]
            if end == -1 and not final:
                body = body[:len(body) - partial_overlap(body, CALL_END)]
            call = _partial_call(body)
            if call is None:
                break
            calls.append(call)
            if end == -1:
                break
            pos = end + len(CALL_END)
        return StreamView("".join(content), calls)

    def answers_step(self, before: str, now: str) -> bool:
        """vLLM's parser answers a step outside any call, once the section has begun, with the
        text the step added less the section's markers: empty where the step was a marker."""
        ends = now.count(CALL_END)
        return (CALLS_BEGIN in now and now.count(CALL_BEGIN) == ends == before.count(CALL_END)
                and CALL_END not in now[len(before):])


def _partial_call(body: str) -> PartialCall | None:
    name = _NAME.match(body)
    if name is None:
        return None
    fenced = body[name.end():]
    if not fenced.startswith(FENCE):
        return PartialCall(name["name"])
    return PartialCall(name["name"], fenced[len(FENCE):].rstrip("\n`"))
