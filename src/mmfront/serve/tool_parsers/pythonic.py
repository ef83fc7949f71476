"""``pythonic``: a Python list of calls with keyword arguments, ``[f(a=1), g(b="x")]``
(Llama 3.2 and 4, ToolACE), read with :mod:`ast` (nothing is evaluated)."""

from __future__ import annotations

import ast
import re
from typing import Any

from mmfront.serve.tool_parsers.base import ExtractedToolCalls, ToolCall, ToolParser, json_arguments, no_tool_calls

_NAME = r"[a-zA-Z]+\w*"
_ARG = rf"{_NAME}=.*"
_CALLS = re.compile(
    rf"\[({_NAME}\(({_ARG},\s*)*({_ARG}\s)?\),\s*)*({_NAME}\(({_ARG},\s*)*({_ARG}\s*)?\)\s*)+\]", re.DOTALL)
"""The shape vLLM accepts as a list of calls (what does not match is content)."""
_JSON_NAMES = {"null": None, "true": True, "false": False}


class PythonicToolParser(ToolParser):
    name = "pythonic"
    start_markers = ("[",)

    def content_end(self, text: str) -> int:
        """A list of calls opens the output: until the output shows it is not one, hold it."""
        stripped = text.lstrip()
        return len(text) if stripped and not stripped.startswith("[") else 0

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
