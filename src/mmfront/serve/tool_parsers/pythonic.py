"""``pythonic``: a Python list of calls with keyword arguments, ``[f(a=1), g(b="x")]``
(Llama 3.2 and 4, ToolACE), read with :mod:`ast` (nothing is evaluated)."""

from __future__ import annotations

import ast
import re
from typing import Any

from mmfront.serve.tool_parsers.base import (
    ExtractedToolCalls,
    PartialCall,
    StreamView,
    ToolCall,
    ToolParser,
    json_arguments,
    no_tool_calls,
)

_NAME = r"[a-zA-Z]+\w*"
_ARG = rf"{_NAME}=.*"
_CALLS = re.compile(
    rf"\[({_NAME}\(({_ARG},\s*)*({_ARG}\s)?\),\s*)*({_NAME}\(({_ARG},\s*)*({_ARG}\s*)?\)\s*)+\]", re.DOTALL)
"""The shape vLLM accepts as a list of calls (what does not match is content)."""
_JSON_NAMES = {"null": None, "true": True, "false": False}
_CLOSING = {"[": "]", "(": ")", "{": "}", "'": "'", '"': '"'}
_OPENING = {"]": "[", ")": "(", "}": "{"}


class PythonicToolParser(ToolParser):
    name = "pythonic"
    name_with_arguments = True

    def extract(self, text: str) -> ExtractedToolCalls:
        if _CALLS.match(text) is None:
            return no_tool_calls(text)
        try:
            body = ast.parse(text).body
            node = getattr(body[0], "value", None) if body else None
            if not isinstance(node, ast.List) or not all(isinstance(e, ast.Call) for e in node.elts):
                return no_tool_calls(text)
            calls = [_call(e) for e in node.elts if isinstance(e, ast.Call)]
        except (SyntaxError, ValueError, TypeError):
            return no_tool_calls(text)
        return ExtractedToolCalls(True, calls, None)

    def stream_view(self, text: str, final: bool) -> StreamView:
        """vLLM's stream: an output that does not open with ``[`` is content; else the list so
        far, closed as Python and read, gives each call's arguments as JSON, short of what the
        closing added (the unfinished call's ``}``, an open string's quote). The end of the
        answer releases nothing: vLLM's does not."""
        if not text.startswith("["):
            return StreamView(text, [])
        try:
            completed = _close(text)
            if completed is None:
                return StreamView("", [])
            candidate, added = completed
            node = getattr(ast.parse(candidate).body[0], "value", None)
            if not isinstance(node, ast.List) or not all(isinstance(e, ast.Call) for e in node.elts):
                return StreamView("", [])
            calls = [_call(e) for e in node.elts if isinstance(e, ast.Call)]
        except (SyntaxError, ValueError, TypeError):
            return StreamView("", [])
        partial = []
        for index, call in enumerate(calls):
            arguments = call.arguments
            if index == len(calls) - 1 and ")]" in added:  # the call still being written
                held = (added[:-2] + "}").replace("'", '"')
                if not arguments.endswith(held):
                    return StreamView("", [])
                arguments = arguments[:-len(held)]
            partial.append(PartialCall(call.name, arguments))
        return StreamView("", partial)

    def answers_step(self, before: str, now: str) -> bool:
        """vLLM's parser answers with an empty delta a step after which the list holds calls and
        is whole (nothing to close), having sent them all."""
        if not now.startswith("["):
            return False
        try:
            completed = _close(now)
            if completed is None or completed[1]:
                return False
            node = getattr(ast.parse(completed[0]).body[0], "value", None)
            if not isinstance(node, ast.List) or not all(isinstance(e, ast.Call) for e in node.elts):
                return False
            return bool([_call(e) for e in node.elts if isinstance(e, ast.Call)])
        except (SyntaxError, ValueError, TypeError):
            return False


def _escaped(text: str, index: int) -> bool:
    """Whether an odd run of backslashes precedes ``text[index]``."""
    run = len(text[:index]) - len(text[:index].rstrip("\\"))
    return run % 2 == 1


def _close(text: str) -> tuple[str, str] | None:
    """``text`` with its open strings and brackets closed, and what was added; ``None`` where
    vLLM's stream waits for more (a name, key or value being written). Mismatched brackets raise
    :class:`ValueError`."""
    stack: list[str] = []
    for index, char in enumerate(text):
        if stack and stack[-1] in "'\"":
            if char == stack[-1] and not _escaped(text, index):
                stack.pop()
        elif char in "[({'\"":
            stack.append(char)
        elif char in _OPENING and (not stack or stack.pop() != _OPENING[char]):
            raise ValueError("mismatched brackets")
    text = text.rstrip()
    if text.endswith(("=", ":")):
        return None
    top = stack[-1] if stack else None
    if top in ("{", "("):
        before = text[:text.rfind(top)]
        names, values = (before.count(":"), before.count(",")) if top == "{" else (before.count("="), before.count(","))
        if names <= values:
            return None
    text = text.removesuffix(",")
    if top == "[" and not text.endswith(("[", ")")):
        return None
    added = "".join(_CLOSING[c] for c in reversed(stack))
    module = ast.parse(text + added)
    if not module.body or ("}" in added and any(isinstance(n, ast.Set) for n in ast.walk(module))):
        return None
    return text + added, added


def _call(call: ast.Call) -> ToolCall:
    name = _dotted(call.func)
    arguments = {kw.arg: _value(kw.value) for kw in call.keywords}
    return ToolCall(name, json_arguments(arguments))


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise ValueError("a tool call's name must be a name or a dotted name")


def _value(node: ast.expr) -> Any:
    """A literal argument: constants, lists, dicts, and JSON's ``null``/``true``/``false``."""
    if isinstance(node, ast.Constant):
        if node.value is None or isinstance(node.value, (str, int, float)):
            return node.value
        raise ValueError("tool call arguments must be JSON values")
    if isinstance(node, ast.Dict):
        if not all(isinstance(k, ast.Constant) for k in node.keys):
            raise ValueError("dict arguments must have literal keys")
        return {k.value: _value(v) for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)}
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):  # JSON has only lists
        return [_value(v) for v in node.elts]
    if isinstance(node, ast.JoinedStr) and all(isinstance(p, ast.Constant) for p in node.values):
        return "".join(str(p.value) for p in node.values if isinstance(p, ast.Constant))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _value(node.operand)
        if isinstance(operand, (int, float)) and not isinstance(operand, bool):
            return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    raise ValueError("tool call arguments must be literals")
