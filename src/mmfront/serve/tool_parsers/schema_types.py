"""Parameter values that a model writes as text, turned into the JSON type their tool's schema
gives them (the XML formats carry no types); vLLM's rules: ``null`` > integer > number >
boolean > object > array > string, the first that fits."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

_ALIASES = {"str": "string", "text": "string", "varchar": "string", "char": "string", "enum": "string",
            "int": "integer", "int32": "integer", "int64": "integer", "uint": "integer", "uint32": "integer",
            "uint64": "integer", "long": "integer", "short": "integer", "unsigned": "integer",
            "float": "number", "float32": "number", "float64": "number", "double": "number", "bool": "boolean",
            "dict": "object", "arr": "array", "list": "array", "sequence": "array"}
_ENUM_TYPES: tuple[tuple[type, str], ...] = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                                             (list, "array"), (dict, "object"))


def schema_types(schema: Any) -> list[str]:
    """The JSON types a schema allows (``type``, the types of an ``enum``, ``anyOf``/``oneOf``/
    ``allOf``); ``["string"]`` when it names none."""
    if not isinstance(schema, Mapping):
        return ["string"]
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(t for t in declared if isinstance(t, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        for value in enum:
            if value is None:
                types.add("null")
            for cls, name in _ENUM_TYPES:
                if isinstance(value, cls):
                    types.add(name)
                    break
    for key in ("anyOf", "oneOf", "allOf"):
        choices = schema.get(key)
        if isinstance(choices, list):
            for choice in choices:
                types.update(schema_types(choice))
    return sorted(types) if types else ["string"]


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def coerce(value: str, types: list[str]) -> Any:
    """``value`` as the first of ``types`` it reads as; else JSON, else the text."""
    wanted = {_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in types}
    for kind in ("null", "integer", "number", "boolean", "object", "array", "string"):
        if kind not in wanted:
            continue
        if kind == "null" and value.lower() == "null":
            return None
        if kind == "string":
            return value
        if kind in ("integer", "number"):
            try:
                return int(value)
            except ValueError:
                pass
        if kind == "number":
            try:
                number = float(value)
            except ValueError:
                continue
            if math.isfinite(number):
                return number if number != int(number) else int(number)
        if kind == "boolean":
            lowered = value.lower().strip()
            if lowered in ("true", "1"):
                return True
            if lowered in ("false", "0"):
                return False
        if kind in ("object", "array"):
            try:
                parsed = json.loads(value)
            except ValueError:
                continue
            if _finite(parsed):
                return parsed
    try:
        parsed = json.loads(value)
    except ValueError:
        return value
    return parsed if _finite(parsed) else value
