"""Structured outputs as ``vllm serve`` takes them: ``response_format`` and ``structured_outputs``
made into the one :class:`~mmfront.wire.StructuredOutputsParams` a request sends, checked as
vLLM's API server checks it, and its grammar backend chosen as vLLM chooses it.

The engine core compiles the grammar, but only after the API server has validated the
constraint with the backend's own parser and written the backend into the parameters (an engine
refuses a constraint without one): so mmfront runs the same libraries vLLM 0.33 runs here,
xgrammar and llguidance, at the versions vLLM pins, and a constraint they refuse is a 400 before
anything is sent. With the default backend ``auto`` xgrammar is tried first, then llguidance,
as vLLM does; xgrammar turns a ``choice`` into an EBNF ``grammar`` on the way, and that rewritten
constraint is what the engine receives, as from vLLM.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from mmfront.errors import ValidationError
from mmfront.wire.params import StructuredOutputsFields, StructuredOutputsParams

MAX_JSON_NESTING = 64
"""Deepest nesting of objects and arrays in a JSON schema (vLLM's
``MAX_STRUCTURED_OUTPUT_JSON_NESTING``): converting a schema to a grammar costs steeply with depth."""
STRUCTURAL_TAG_WRAPPER_NESTING = 16
"""Extra nesting a structural tag may add around its schemas (vLLM's limit)."""
REGEX_COMPILATION_TIMEOUT_S = 5.0
"""How long a regex may take to become a grammar (vLLM's ``VLLM_REGEX_COMPILATION_TIMEOUT_S``):
nested quantifiers can blow up a regex's state space."""
BACKENDS = ("auto", "xgrammar", "guidance")
"""The backends mmfront validates for (vLLM's ``--structured-outputs-config.backend``, less
``outlines`` and ``lm-format-enforcer``, which mmfront does not ship)."""

_XGRAMMAR_STRING_FORMATS = frozenset({
    "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid", "uri", "uri-reference",
    "uri-template", "json-pointer", "relative-json-pointer"})


PUBLIC_FIELDS = StructuredOutputsFields.__struct_fields__
"""The fields a request may set (the two backend fields are the server's)."""


def check_structural_tag(payload: Any, parameter: str) -> None:
    """vLLM's ``validate_structural_tag_payload``: a structural tag xgrammar cannot read is the
    request's fault, named ``parameter``."""
    if isinstance(payload, str) and not payload:
        raise ValidationError(f"Invalid {parameter} structural_tag specification.", parameter=parameter)
    if isinstance(payload, str):
        check_json_nesting(payload, structural_tag=True)
    try:
        _xgrammar_structural_tag(payload)
    except (TypeError, ValueError) as e:
        raise ValidationError(f"Invalid {parameter} structural_tag specification.", parameter=parameter) from e


def check_json_nesting(spec: str | dict[str, Any] | None, *, structural_tag: bool = False) -> None:
    """Refuse a schema (or structural tag) nested deeper than :data:`MAX_JSON_NESTING` levels."""
    limit = MAX_JSON_NESTING + (STRUCTURAL_TAG_WRAPPER_NESTING if structural_tag else 0)
    if spec and _exceeds_nesting(spec, limit):
        raise ValidationError("The JSON schema is nested too deeply: objects and arrays may nest at most "
                              f"{MAX_JSON_NESTING} levels")


def _exceeds_nesting(spec: str | dict[str, Any], limit: int) -> bool:
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except RecursionError:
            return True
        except ValueError:  # malformed JSON is the backend's to report
            return False
    level: list[Any] = [spec]
    for _ in range(limit):
        level = [child for node in level if isinstance(node, (dict, list))
                 for child in (node.values() if isinstance(node, dict) else node) if isinstance(child, (dict, list))]
        if not level:
            return False
    return True


def resolve_backend(params: StructuredOutputsParams, backend: str, *, fast_tokenizer: bool) -> None:
    """vLLM's ``SamplingParams._validate_structured_outputs``: refuse what the engine could not
    compile, then set ``params._backend`` (and ``_backend_was_auto``) as vLLM's API server does.
    ``fast_tokenizer``: whether llguidance can read the tokenizer (a Rust-backed HF tokenizer)."""
    if backend not in BACKENDS:
        raise ValidationError(f"The structured outputs backend {backend!r} is not one mmfront validates for; use one "
                              f"of {', '.join(BACKENDS)}.")
    params._backend = backend
    _check_content(params)
    if backend == "xgrammar":
        validate_xgrammar(params)
    elif backend == "guidance":
        if not fast_tokenizer:
            raise ValidationError(
                "The 'guidance' structured output backend only supports fast Hugging Face tokenizers and "
                "Tekken-based Mistral tokenizers. Please use the 'xgrammar' backend or configure a fast tokenizer "
                "instead.")
        validate_guidance(params)
    else:
        try:
            validate_xgrammar(params)
            params._backend = "xgrammar"
        except ValidationError:
            schema = _schema(params.json) if params.json else None
            if schema is not None and _has_guidance_unsupported_features(schema):
                raise ValidationError(
                    "This JSON schema needs the 'outlines' structured output backend (xgrammar and llguidance do "
                    "not support it), which mmfront does not ship.", parameter="structured_outputs") from None
            if not fast_tokenizer:
                raise ValidationError(
                    "No compatible structured output backend was found for this request. XGrammar rejected the "
                    "constraint, and Guidance does not support this tokenizer. Configure a fast tokenizer or select "
                    "a compatible backend explicitly.") from None
            validate_guidance(params)
            params._backend = "guidance"
        params._backend_was_auto = True
    params.__post_init__()


def _check_content(params: StructuredOutputsParams) -> None:
    """The checks vLLM makes before any backend sees the constraint."""
    if isinstance(params.choice, list) and not params.choice:
        raise ValidationError(f"Choice '{params.choice}' cannot be an empty list")
    if isinstance(params.grammar, str) and not params.grammar.strip():
        raise ValidationError("structured_outputs.grammar cannot be an empty string")
    if isinstance(params.json, str) and not params.json.strip():
        raise ValidationError("structured_outputs.json cannot be an empty string")
    check_json_nesting(params.json)
    check_json_nesting(params.structural_tag, structural_tag=True)
    if params.json_object is False:
        raise ValidationError("structured_outputs.json_object must be True if set; omit structured_outputs to "
                              "disable structured outputs")
    if params.regex and "\x00" in params.regex:
        raise ValidationError("structured_outputs.regex must not contain a NUL character ('\\x00')")
    if isinstance(params.structural_tag, str) and not params.structural_tag.strip():
        raise ValidationError("structured_outputs.structural_tag cannot be an empty string")


def _schema(spec: str | dict[str, Any]) -> Any:
    if not isinstance(spec, str):
        return spec
    try:
        return json.loads(spec)
    except json.JSONDecodeError as e:
        raise ValidationError("Invalid JSON grammar specification.") from e


def validate_xgrammar(params: StructuredOutputsParams) -> None:
    """vLLM's ``validate_xgrammar_grammar``: parse the constraint with xgrammar (no compiling);
    a ``choice`` becomes the EBNF ``grammar`` xgrammar will compile."""
    import xgrammar as xgr

    if params.regex is not None:
        try:
            _with_timeout(xgr.Grammar.from_regex, params.regex)
        except Exception as e:
            raise ValidationError(f"Failed to transform regex into a grammar: {e}") from e
        return
    if params.choice:
        grammar = choice_as_grammar(params.choice)
        try:
            xgr.Grammar.from_ebnf(grammar)
        except Exception as e:
            raise ValidationError(f"Failed to transform choices into a grammar: {e}") from e
        params.choice, params.grammar = None, grammar
        return
    if params.json is not None:
        check_json_nesting(params.json)
        schema = _schema(params.json)
        if _has_xgrammar_unsupported_features(schema):
            raise ValidationError("The provided JSON schema contains features not supported by xgrammar.")
        try:
            xgr.Grammar.from_json_schema(schema)
        except Exception as e:
            raise ValidationError(f"Failed to transform json schema into a grammar: {e}") from e
        return
    if params.json_object:
        return
    if params.grammar:
        try:
            if grammar_is_likely_lark(params.grammar):
                xgr.Grammar.from_lark(params.grammar)
            else:
                xgr.Grammar.from_ebnf(params.grammar)
        except Exception as e:
            raise ValidationError("Invalid grammar specification.") from e
        return
    if params.structural_tag:
        check_json_nesting(params.structural_tag, structural_tag=True)
        try:
            _xgrammar_structural_tag(params.structural_tag)
        except Exception as e:
            raise ValidationError("Invalid structural tag specification.") from e
        return
    raise ValidationError("XGrammar structured outputs backend does not support this structured outputs "
                          "specification")


def _xgrammar_structural_tag(payload: Any) -> None:
    """xgrammar's reading of a structural tag, the legacy ``structures``/``triggers`` form too."""
    import xgrammar as xgr

    try:
        tag = json.loads(payload)
        if "structures" in tag:
            items = [xgr.StructuralTagItem(begin=s["begin"], schema=json.dumps(s["schema"]), end=s["end"])
                     for s in tag["structures"]]
            xgr.Grammar.from_structural_tag(items, tag["triggers"])
        else:
            xgr.Grammar.from_structural_tag(payload)
    except (ValueError, TypeError):
        raise
    except Exception as e:  # xgrammar's own errors (RuntimeError, KeyError): the tag is malformed
        raise ValueError(str(e)) from e


def validate_guidance(params: StructuredOutputsParams) -> None:
    """vLLM's ``validate_guidance_grammar``: llguidance's own check of the grammar it would build."""
    import llguidance

    try:
        grammar = _guidance_grammar(params, llguidance)
    except (ValueError, KeyError, TypeError) as e:
        raise ValidationError(f"Invalid grammar specification: {e}") from e
    error = llguidance.LLMatcher.validate_grammar(grammar, None)
    if error:  # stripped, as vLLM's error response strips every message
        raise ValidationError(f"Grammar error: {error}".strip())


def _guidance_grammar(params: StructuredOutputsParams, llguidance: Any) -> str:
    """vLLM's ``serialize_guidance_grammar`` for the constraint's key (``get_structured_output_key``)."""
    flexible = {"whitespace_flexible": not params.disable_any_whitespace}
    if params.json is not None:
        spec = params.json if isinstance(params.json, str) else json.dumps(params.json)
        return str(llguidance.LLMatcher.grammar_from_json_schema(spec, defaults=flexible))
    if params.json_object:
        return str(llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}', defaults=flexible))
    if params.regex is not None:
        return str(llguidance.grammar_from("regex", params.regex))
    if params.choice is not None:
        return str(llguidance.grammar_from("choice", json.dumps(params.choice)))
    if params.grammar is not None:
        return str(llguidance.grammar_from("grammar", params.grammar))
    if params.structural_tag is not None:
        tag = json.loads(params.structural_tag)
        triggers: list[str] = tag["triggers"]
        tags = []
        for s in tag["structures"]:
            trigger = next((t for t in triggers if s["begin"].startswith(t)), None)
            if trigger is None:
                raise ValidationError(f"Trigger {s['begin']} not found in triggers {triggers}")
            schema = llguidance.LLMatcher.grammar_from_json_schema(s["schema"], defaults=flexible)
            tags.append(llguidance.StructTag(trigger=trigger, begin=s["begin"], grammar=schema, end=s["end"]))
        if not tags:
            raise ValidationError("No structural tags found in the grammar spec.")
        return str(llguidance.StructTag.to_grammar(tags))
    raise ValueError("No valid structured output parameter found")


def _with_timeout(compile_regex: Any, pattern: str) -> Any:
    """``compile_regex(pattern)``, given up after :data:`REGEX_COMPILATION_TIMEOUT_S` (the
    thread is left to finish; the request is refused)."""
    executor = ThreadPoolExecutor(max_workers=1)
    future = executor.submit(compile_regex, pattern)
    try:
        return future.result(timeout=REGEX_COMPILATION_TIMEOUT_S)
    except FutureTimeout:
        raise ValueError(
            f"Regex compilation timed out after {REGEX_COMPILATION_TIMEOUT_S:g}s. The pattern may be too complex or "
            f"contain constructs that cause exponential state-space explosion (e.g. nested quantifiers). Pattern: "
            f"{pattern[:200]}") from None
    finally:
        executor.shutdown(wait=False, cancel_futures=True)


def choice_as_grammar(choice: list[str]) -> str:
    """vLLM's EBNF for "one of these strings"."""
    escapes = {"\\": r"\\", '"': r"\"", "\n": r"\n", "\r": r"\r", "\t": r"\t"}

    def escape(ch: str) -> str:
        if ch in escapes:
            return escapes[ch]
        return f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch

    return "root ::= " + " | ".join('"' + "".join(escape(ch) for ch in c) + '"' for c in choice)


def grammar_is_likely_lark(grammar: str) -> bool:
    """vLLM's guess: a grammar with no ``::=`` rule is Lark, else EBNF."""
    if not grammar or not isinstance(grammar, str):
        return False
    return not any("::=" in re.sub(r"(#|//).*$", "", line).strip() for line in grammar.split("\n"))


def _schema_types(schema: dict[str, Any]) -> set[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    return {k for k in kind if isinstance(k, str)} if isinstance(kind, list) else set()


def _pattern_and_length(schema: dict[str, Any]) -> bool:
    return ("pattern" in schema or "format" in schema) and ("minLength" in schema or "maxLength" in schema)


def _walk(schema: Any) -> list[dict[str, Any]]:
    """Every object in a JSON document, depth first (iterative)."""
    found, pending = [], [schema]
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            found.append(node)
            pending.extend(v for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            pending.extend(v for v in node if isinstance(v, dict))
    return found


def _has_xgrammar_unsupported_features(schema: Any) -> bool:
    """vLLM's list of schema features xgrammar 0.2.8 would silently ignore or get wrong."""
    for obj in _walk(schema):
        types = _schema_types(obj)
        if (types & {"integer", "number"}) and "multipleOf" in obj:
            return True
        if "array" in types and any(k in obj for k in ("uniqueItems", "contains", "minContains", "maxContains")):
            return True
        if "string" in types and "format" in obj and obj["format"] not in _XGRAMMAR_STRING_FORMATS:
            return True
        if "string" in types and _pattern_and_length(obj):
            return True
        if "object" in types and "propertyNames" in obj:
            names = obj.get("propertyNames")
            if isinstance(names, dict) and _pattern_and_length(names):
                return True
            if "patternProperties" in obj or "properties" in obj or obj.get("unevaluatedProperties", True) is not True:
                return True
        if "object" in types and isinstance(obj.get("patternProperties"), dict) and (
                "properties" in obj or len(obj["patternProperties"]) > 1):
            return True
        all_of = obj.get("allOf")
        if isinstance(all_of, list) and len(all_of) >= 2:
            return True
    return False


def _has_guidance_unsupported_features(schema: Any) -> bool:
    return any("patternProperties" in obj for obj in _walk(schema))


__all__ = [
    "BACKENDS",
    "MAX_JSON_NESTING",
    "PUBLIC_FIELDS",
    "REGEX_COMPILATION_TIMEOUT_S",
    "check_json_nesting",
    "check_structural_tag",
    "choice_as_grammar",
    "grammar_is_likely_lark",
    "resolve_backend",
    "validate_guidance",
    "validate_xgrammar",
]
