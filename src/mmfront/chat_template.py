"""Which chat template renders a request, which content shape it reads, and rendering it safely.

Templates read message content in one of two shapes (vLLM's "content formats"): ``"openai"``
templates walk a list of parts (``{"type": "text"}``, ``{"type": "image"}``); ``"string"``
templates print ``message['content']`` as text. Giving a template the other shape loses text
silently: Idefics3's template walks parts, so a system prompt sent as a string vanishes. The
format is found by rendering probes rather than by reading the template's source, because
templates hide their loop over parts in macros (GLM-ASR's ``to_text``), where a syntax check
misses it. The probes also record, per modality, whether a ``{"type": modality}`` part becomes
the model's placeholder and which reserved tokens one such part writes: the chat layer uses
that count to check the rendered prompt.

Probe results are memoized per processor (a weak key, so a processor that goes away takes its
entries along) in a small LRU; a probe that raises is never memoized. A template sent with a
request is refused unless ``MultiModalConfig.trust_request_chat_template`` is set (vLLM's rule),
and a trusted one is bounded in size and in render time.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, Literal

from mmfront.errors import ChatFormatError, ValidationError, resource_error

if TYPE_CHECKING:
    from mmfront.processing.processor import BaseMultiModalProcessor

ContentFormat = Literal["string", "openai"]

REQUEST_TEMPLATE_MAX_CHARS = 64 * 1024
"""Longest chat template a request may carry (when request templates are trusted)."""
REQUEST_TEMPLATE_SECONDS = 1.0
"""Longest a request's own template may take to render (each probe and the prompt)."""
MEMO_SIZE = 16
"""Templates whose format is remembered, per processor."""

_PROBE_TEXT = "mmfront-probe-3f9c"
#: apply_chat_template arguments that are not template variables: a request cannot set them
#: through chat_template_kwargs (``chat_template`` there would bypass the trust check).
_NOT_TEMPLATE_VARIABLES = frozenset({
    "chat_template", "conversation", "messages", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "sanitize_control_tokens",
})


@dataclass(frozen=True)
class TemplateFormat:
    """How one template reads content. ``parts[m]`` counts the reserved tokens one rendered
    ``{"type": m}`` part writes; a modality absent from ``parts`` is not rendered from a part, so
    mmfront writes its placeholder as text."""

    content: ContentFormat
    parts: Mapping[str, Mapping[str, int]]


@dataclass(frozen=True)
class ChatTemplate:
    """The template one request renders with."""

    text: str
    from_request: bool
    format: TemplateFormat


class _TemplateTimeout(BaseException):
    """Raised from the trace hook; a BaseException so a template's own error handling cannot
    swallow it."""


_memo: weakref.WeakKeyDictionary[Any, OrderedDict[str, TemplateFormat]] = weakref.WeakKeyDictionary()
_memo_lock = threading.Lock()


def resolve_chat_template(processor: BaseMultiModalProcessor, request_template: str | None) -> ChatTemplate:
    """The request's template when trusted, else the deployment's, else the model's; with its format."""
    config = processor.info.config
    if request_template is not None:
        if not config.trust_request_chat_template:
            raise ChatFormatError(
                "Chat template is passed with request, but trust_request_chat_template is not set. Refused request "
                "with untrusted chat template: set MultiModalConfig(chat_template=...) for the deployment, or "
                "trust_request_chat_template=True if every client may run its own template.",
                parameter="chat_template")
        if not isinstance(request_template, str) or not request_template.strip():
            raise ChatFormatError("chat_template must be a non-empty string.", parameter="chat_template")
        if len(request_template) > REQUEST_TEMPLATE_MAX_CHARS:
            raise ChatFormatError(
                f"chat_template is {len(request_template)} characters; a request's template may have at most "
                f"{REQUEST_TEMPLATE_MAX_CHARS}. Configure a long template for the deployment instead.",
                parameter="chat_template")
        return ChatTemplate(request_template, True, _template_format(processor, request_template, True))
    hf_processor = processor.info.hf_processor
    text = config.chat_template or getattr(hf_processor, "chat_template", None) or getattr(
        processor.info.tokenizer, "chat_template", None)
    if not isinstance(text, str) or not text:
        raise ChatFormatError(
            "The model has no chat template: set MultiModalConfig(chat_template=...) to the model's template, or "
            "send a prompt string instead of messages.", parameter="messages")
    return ChatTemplate(text, False, _template_format(processor, text, False))


def render_chat(
    processor: BaseMultiModalProcessor, template: ChatTemplate, conversation: Sequence[Mapping[str, Any]], *,
    add_generation_prompt: bool, continue_final_message: bool, tools: Sequence[Mapping[str, Any]] | None,
    chat_template_kwargs: Mapping[str, Any] | None,
) -> str:
    """Render ``conversation``; vLLM's rules for the options (``chat_template_kwargs`` may set the
    generation flags and ``tools``, and wins over the arguments)."""
    if chat_template_kwargs is not None and not (
            isinstance(chat_template_kwargs, Mapping) and all(isinstance(k, str) for k in chat_template_kwargs)):
        raise ChatFormatError("chat_template_kwargs must be an object with string keys.",
                              parameter="chat_template_kwargs")
    extra = dict(chat_template_kwargs or {})
    refused = sorted(_NOT_TEMPLATE_VARIABLES & extra.keys())
    if refused:
        raise ChatFormatError(
            f"chat_template_kwargs may not set {refused}: they are not template variables (send a template as "
            "`chat_template`).", parameter="chat_template_kwargs")
    options: dict[str, Any] = {"add_generation_prompt": add_generation_prompt,
                               "continue_final_message": continue_final_message, "tools": tools}
    options.update((k, extra.pop(k)) for k in list(options) if k in extra)
    if options["add_generation_prompt"] and options["continue_final_message"]:
        raise ChatFormatError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                              parameter="continue_final_message")
    tools = options["tools"]
    if tools is not None and not (isinstance(tools, Sequence) and not isinstance(tools, (str, bytes))
                                  and all(isinstance(t, Mapping) for t in tools)):
        raise ChatFormatError("tools must be a list of tool objects (JSON schemas).", parameter="tools")
    conversation = _developer_as_system(conversation, template.text)
    try:
        return _render(processor, template.text, conversation, bounded=template.from_request,
                       add_generation_prompt=bool(options["add_generation_prompt"]),
                       continue_final_message=bool(options["continue_final_message"]), tools=tools, **extra)
    except ValidationError:
        raise
    except Exception as exc:
        raise resource_error(exc, doing="Rendering the chat template") or ChatFormatError(
            f"The chat template failed to render these messages: {exc}", parameter="messages") from exc


def _developer_as_system(conversation: Sequence[Mapping[str, Any]], template: str) -> Sequence[Mapping[str, Any]]:
    """vLLM's handling of the ``developer`` role for a template that never names it: each
    developer message becomes a system message (without its ``tools``), and the system messages
    are then merged into one, first, where one is not first or there are several (their texts
    joined by a blank line), as templates that take one leading system message need."""
    if '"developer"' in template or "'developer'" in template or all(
            message.get("role") != "developer" for message in conversation):
        return conversation
    converted = [{**{k: v for k, v in message.items() if k != "tools"}, "role": "system"}
                 if message.get("role") == "developer" else message for message in conversation]
    texts: list[str] = []
    others: list[Mapping[str, Any]] = []
    merge = False
    for n, message in enumerate(converted):
        if message.get("role") != "system":
            others.append(message)
            continue
        merge = merge or n > 0 or bool(texts)
        content = message.get("content") or ""
        if not isinstance(content, str):
            content = "\n".join(part if isinstance(part, str) else str(part["text"]) for part in content
                                if isinstance(part, str) or (isinstance(part, Mapping) and "text" in part))
        if content:
            texts.append(content)
    return [{"role": "system", "content": "\n\n".join(texts)}, *others] if merge else converted


def _render(processor: BaseMultiModalProcessor, text: str, conversation: Sequence[Mapping[str, Any]], *,
            bounded: bool, **kwargs: Any) -> str:
    tokenizer = processor.info.tokenizer
    with _time_limit(REQUEST_TEMPLATE_SECONDS if bounded else None):
        out = tokenizer.apply_chat_template(list(conversation), chat_template=text, tokenize=False, **kwargs)
    return str(out)


@contextmanager
def _time_limit(seconds: float | None) -> Iterator[None]:
    """Abort the enclosed Python code once ``seconds`` have passed (checked on every line it
    runs); a template loop that never ends becomes a ChatFormatError."""
    if seconds is None:
        yield
        return
    deadline = time.monotonic() + seconds

    def trace(frame: FrameType, event: str, arg: Any) -> Callable[..., Any]:
        if time.monotonic() > deadline:
            raise _TemplateTimeout
        return trace

    previous = sys.gettrace()
    sys.settrace(trace)
    try:
        yield
    except _TemplateTimeout:
        raise ChatFormatError(
            f"The request's chat template took longer than {seconds:g} s to render; simplify it.",
            parameter="chat_template") from None
    finally:
        sys.settrace(previous)


def _template_format(processor: BaseMultiModalProcessor, text: str, bounded: bool) -> TemplateFormat:
    with _memo_lock:
        entries = _memo.get(processor)
        found = entries.get(text) if entries is not None else None
        if found is not None:
            entries.move_to_end(text)  # type: ignore[union-attr]
            return found
    detected, complete = _detect(processor, text, bounded)
    if complete:
        with _memo_lock:
            entries = _memo.setdefault(processor, OrderedDict())
            entries[text] = detected
            while len(entries) > MEMO_SIZE:
                entries.popitem(last=False)
    return detected


def counted_tokens(processor: BaseMultiModalProcessor) -> set[str]:
    """The strings whose count in a rendered prompt must match what mmfront placed: the
    reserved multimodal tokens and every placeholder."""
    tokens = {t for t in processor.get_mm_special_tokens() if t}
    for modality in processor.info.allowed_mm_limits:
        try:
            placeholder = processor.get_placeholder_str(modality, 0)
        except ValidationError:
            continue
        if placeholder:  # empty where the model places its items itself (PaliGemma's native class)
            tokens.add(placeholder)
    return tokens


def _detect(processor: BaseMultiModalProcessor, text: str, bounded: bool) -> tuple[TemplateFormat, bool]:
    """The format, and whether every probe rendered (only then is it memoized)."""
    complete = True

    def probe(content: Any) -> str | None:
        nonlocal complete
        try:
            return _render(processor, text, [{"role": "user", "content": content}], bounded=bounded)
        except ChatFormatError:
            raise
        except Exception as exc:
            found = resource_error(exc, doing="Detecting the chat template's content format")
            if found is not None:
                raise found from exc
            complete = False
            return None

    as_parts = probe([{"type": "text", "text": _PROBE_TEXT}])
    as_string = probe(_PROBE_TEXT)
    forced = processor.info.config.chat_template_content_format
    if forced != "auto":
        content: ContentFormat = forced
    elif as_parts is not None and _PROBE_TEXT in as_parts and (
            as_string is None or _PROBE_TEXT not in as_string or as_parts == as_string):
        content = "openai"  # it reads parts, and strings are either lost or rendered the same way
    else:
        content = "string"
    parts: dict[str, dict[str, int]] = {}
    if content == "openai" and as_parts is not None:
        tokens = counted_tokens(processor)
        for modality in processor.info.allowed_mm_limits:
            try:
                placeholder = processor.get_placeholder_str(modality, 0)
            except ValidationError:
                continue
            if not placeholder:
                continue
            with_part = probe([{"type": modality}, {"type": "text", "text": _PROBE_TEXT}])
            if with_part is not None and with_part.count(placeholder) - as_parts.count(placeholder) == 1:
                added = {t: with_part.count(t) - as_parts.count(t) for t in tokens}
                parts[modality] = {t: n for t, n in added.items() if n}
    return TemplateFormat(content, parts), complete
