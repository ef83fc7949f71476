"""OpenAI chat messages -> a templated prompt plus the request's multimodal items, in order.

Each media part becomes the model's placeholder at its position, then the chat template renders
the conversation. Content is converted to the shape the template reads (see
:mod:`mmfront.chat_template`): list templates get every message as parts, string content
included, so nothing is lost; string templates get the parts joined into text.

Only placeholders mmfront placed may reach the processor. A typed one in a text part is refused
early with a clear message; the rendered prompt is then checked as a whole, because a placeholder
split across two parts (the template joins them) or carried in another field passes any per-part
check, and with an item present it would take that item's slot.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mmfront._text import check_text
from mmfront.chat_template import TemplateFormat, counted_tokens, render_chat, resolve_chat_template
from mmfront.errors import ChatFormatError, ValidationError
from mmfront.hashing import prehash_media
from mmfront.media import DecodeBudget, DecodedDataURL, MediaConnector
from mmfront.media.base import MediaWithBytes

if TYPE_CHECKING:
    from mmfront.processing.processor import BaseMultiModalProcessor

_MEDIA_PARTS = {
    "image_url": ("image", False),
    "input_image": ("image", False),
    "image_pil": ("image", False),
    "image_embeds": ("image", True),
    "input_audio": ("audio", False),
    "audio_url": ("audio", False),
    "audio_embeds": ("audio", True),
    "video_url": ("video", False),
    "video_embeds": ("video", True),
}
_TEXT_PARTS = {"text": "text", "refusal": "refusal", "thinking": "thinking"}
"""The parts vLLM reads as text, and the field that holds it."""
PART_TYPES = (*_TEXT_PARTS, "tool_reference", *_MEDIA_PARTS)
URL_PARTS = frozenset({"image_url", "audio_url", "video_url"})
"""The media parts whose item the connector loads from their ``{"url": ...}`` field."""
_KEYED_PARTS = ("image_url", "image_pil", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds",
                "audio_url", "input_audio", "video_url", "tool_reference")
"""vLLM's order of the fields that say what a part without a ``type``, or with a ``uuid``, is."""
_PART_FIELDS = frozenset({"type", "uuid", "text", "refusal", "thinking", "closed", "name", "data", "file",
                          "prompt_cache_breakpoint", "image_url", "image_pil", "image_embeds", "input_audio",
                          "audio_url", "audio_embeds", "video_url", "video_embeds"})
"""The fields of vLLM's content parts; any other field of a part reaches the template with it."""
_IMAGE_DETAILS = ("auto", "low", "high", "original")
"""The values vLLM takes for an image part's ``detail``; none changes how the image is processed."""
_ROLE = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")


@dataclass
class ChatRequestInputs:
    """What the chat layer hands to the processor."""

    prompt: str
    mm_data: dict[str, list[Any]] = field(default_factory=dict)
    mm_uuids: dict[str, list[str | None]] = field(default_factory=dict)


@dataclass
class _Tracker:
    """One request's parsing state: the items so far and how to load more."""

    processor: BaseMultiModalProcessor
    connector: MediaConnector
    budget: DecodeBudget
    media_io_kwargs: Mapping[str, Mapping[str, Any]] | None
    reserved: set[str]
    format: TemplateFormat
    counted: set[str]
    items: dict[str, list[Any]] = field(default_factory=dict)
    uuids: dict[str, list[str | None]] = field(default_factory=dict)
    embeds: dict[str, bool] = field(default_factory=dict)
    expected: Counter[str] = field(default_factory=Counter)
    """How often each counted token must occur in the rendered prompt."""

    def __post_init__(self) -> None:
        for token in self.counted:
            self.expected[token] = 0

    def check(self, modality: str, is_embed: bool) -> None:
        """Refuse an item before its media is loaded or fetched."""
        if self.embeds.setdefault(modality, is_embed) != is_embed:
            raise ChatFormatError(f"Mixing raw {modality} and embedding inputs is not allowed in one request.",
                                  parameter="messages")
        self.processor.info.check_item_count(modality, len(self.items.get(modality, ())) + 1, is_embed=is_embed)

    def add(self, modality: str, load: Callable[[], Any], uuid: str | None, *, as_part: bool) -> str:
        """Record an item; its placeholder text. ``as_part``: the template renders the item from
        a ``{"type": modality}`` part, writing what the format probe counted."""
        index = len(self.items.get(modality, ()))
        self.items.setdefault(modality, []).append(load)
        self.uuids.setdefault(modality, []).append(uuid)
        placeholder = self.processor.get_placeholder_str(modality, index)
        if as_part:
            self.expected.update(self.format.parts[modality])
        else:
            self.expected.update({t: placeholder.count(t) for t in self.counted})
        return placeholder

    def load_all(self) -> dict[str, list[Any]]:
        """Run every media part's load, concurrently (fetches, and the prehashing, overlap)."""
        keys = [(modality, i) for modality, loads in self.items.items() for i in range(len(loads))]
        results = self.connector.load_all([self.items[m][i] for m, i in keys])
        out: dict[str, list[Any]] = {m: [None] * len(loads) for m, loads in self.items.items()}
        for (modality, i), item in zip(keys, results):
            out[modality][i] = item
        return out


def parse_chat_messages(
    messages: Sequence[Mapping[str, Any]],
    processor: BaseMultiModalProcessor,
    connector: MediaConnector,
    *,
    budget: DecodeBudget,
    media_io_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> ChatRequestInputs:
    """Place the placeholders, render the chat template, check the rendered prompt, then load
    every media part (nothing is fetched for a request that is refused)."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise ChatFormatError("`messages` must be a non-empty list of chat messages.", parameter="messages")
    template = resolve_chat_template(processor, chat_template)
    tracker = _Tracker(processor, connector, budget, media_io_kwargs, processor.get_mm_special_tokens(),
                       template.format, counted_tokens(processor))

    conversation = []
    for n, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatFormatError(f"messages[{n}] must be an object with a string `role`.", parameter="messages")
        _check_role(message.get("role"), n)
        content = message.get("content")
        rendered = dict(message)
        if isinstance(content, str):
            _check_text(content, tracker.reserved, n)
            if template.format.content == "openai":
                rendered["content"] = [{"type": "text", "text": content}]
        elif isinstance(content, Sequence) and not isinstance(content, (str, bytes)):
            rendered["content"] = _render_parts(content, n, tracker)
        elif content is not None:
            raise ChatFormatError(f"messages[{n}].content must be a string or a list of content parts.",
                                  parameter="messages")
        else:  # vLLM renders no content as none of it
            rendered["content"] = [] if template.format.content == "openai" else ""
        _tool_fields(rendered, message)
        conversation.append(rendered)

    prompt = render_chat(processor, template, conversation, add_generation_prompt=add_generation_prompt,
                         continue_final_message=continue_final_message, tools=tools,
                         chat_template_kwargs=chat_template_kwargs)
    _check_rendered(prompt, tracker.expected)
    return ChatRequestInputs(prompt=prompt, mm_data=tracker.load_all(), mm_uuids=tracker.uuids)


def _tool_fields(rendered: dict[str, Any], message: Mapping[str, Any]) -> None:
    """The tool parts of a message as vLLM hands them to the template: an assistant's
    ``tool_calls`` with their ``arguments`` as objects (JSON that does not decode to one becomes
    ``{}``) and its ``reasoning`` under both its names; a developer message's ``tools`` (None
    where it has none); a tool result's text parts as one string."""
    role = message.get("role")
    if role == "assistant":
        reasoning = message.get("reasoning", message.get("reasoning_content"))
        rendered.pop("reasoning_content", None)
        if reasoning is not None:
            rendered["reasoning"] = rendered["reasoning_content"] = reasoning
        calls = message.get("tool_calls")
        if isinstance(calls, list) and not calls:
            rendered.pop("tool_calls")
        elif isinstance(calls, list):
            rendered["tool_calls"] = [_tool_call(call) for call in calls]
    elif role == "developer":
        rendered["tools"] = message.get("tools")
    elif role == "tool" and isinstance(rendered.get("content"), list):
        parts = rendered["content"]
        if all(isinstance(p, Mapping) and p.get("type") == "text" for p in parts):
            rendered["content"] = "\n".join(str(p.get("text", "")) for p in parts)


def _tool_call(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(call, Mapping):
        raise ChatFormatError("assistant tool_calls entries must be objects.", parameter="tool_calls")
    if call.get("type", "function") != "function" or not isinstance(function, Mapping):
        raise ChatFormatError("chat completions only support assistant tool_calls of type 'function'.",
                              parameter="tool_calls")
    arguments = function.get("arguments")
    if arguments and not isinstance(arguments, dict):
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            arguments = None
    return {**call, "function": {**function, "arguments": arguments if isinstance(arguments, dict) else {}}}


def _render_parts(parts: Sequence[Any], n: int, tracker: _Tracker) -> list[dict[str, Any]] | str:
    """The parts in the template's shape: a list where media parts the template renders stay
    parts (the rest become placeholder text parts), or one string joined with newlines. Each
    part keeps its fields that are not a content part's own, as vLLM hands them on."""
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    as_parts = tracker.format.content == "openai"
    for k, part in enumerate(parts):
        where = f"messages[{n}].content[{k}]"
        kind = _part_kind(part, where)
        extra = {key: value for key, value in part.items() if key not in _PART_FIELDS}
        if kind in _TEXT_PARTS:
            text = part.get(_TEXT_PARTS[kind])
            if text is None and kind == "refusal":  # vLLM skips a refusal without text
                continue
            if not isinstance(text, str):
                raise ChatFormatError(f"{where} is a {kind} part without a string `{_TEXT_PARTS[kind]}`.",
                                      parameter=None)
            _check_text(text, tracker.reserved, n)
            out.append({"type": "text", "text": text, **extra})
            texts.append(text)
            continue
        if kind == "tool_reference":  # a deferred tool's name, for the template to expand
            name = part.get("name")
            if name is not None and not isinstance(name, str):
                raise ChatFormatError(f"{where}.name must be a string.", parameter="messages")
            if as_parts:
                out.append({"type": "tool_reference", "name": name})
            elif name is None:
                raise ChatFormatError(f"{where} is a tool_reference part without a `name`.", parameter="messages")
            else:
                _check_text(name, tracker.reserved, n)
                texts.append(name)
            continue
        if kind == "prompt_embeds":
            raise ChatFormatError(f"{where} is a prompt_embeds part: prompt embeddings are not supported by mmfront "
                                  "serve. Send the prompt as text.", parameter="prompt_embeds")
        modality, is_embed = _MEDIA_PARTS[kind]
        uuid = part.get("uuid")
        if uuid is not None:
            if not isinstance(uuid, str):
                raise ChatFormatError(f"{where}.uuid must be a string.", parameter="messages")
            check_text(uuid, parameter="messages", where=f"{where}.uuid")
        if is_embed and not tracker.processor.info.config.enable_mm_embeds:
            raise ValidationError(f"You must set `--enable-mm-embeds` to input `{kind}`", parameter=kind)
        tracker.check(modality, is_embed)
        load = _part_loader(part, kind, where, uuid, tracker)
        placeholder = tracker.add(modality, _prehashing(load, modality, uuid, tracker), uuid,
                                  as_part=as_parts and modality in tracker.format.parts)
        if as_parts and modality in tracker.format.parts:
            out.append({"type": modality, **extra})
        elif placeholder:  # none where the model places its items itself (vLLM's placeholder None: PaliGemma)
            out.append({"type": "text", "text": placeholder})
        if placeholder:
            texts.append(placeholder)
    return out if as_parts else "\n".join(texts)


def _part_kind(part: Any, where: str) -> str:
    """What a content part is, as vLLM reads it: its ``type``; or, for a part without one or with
    a ``uuid``, the first of :data:`_KEYED_PARTS` among its fields (so a text part with a
    ``uuid`` is refused, as vLLM refuses it)."""
    if not isinstance(part, Mapping):
        raise ChatFormatError(f"{where} must be an object with a string `type`.", parameter=None)
    kind = part.get("type")
    if part.get("uuid") is None and isinstance(kind, str) and (kind in PART_TYPES or kind == "prompt_embeds"):
        return kind
    if kind is None or part.get("uuid") is not None:
        for key in _KEYED_PARTS:
            if key in part and not (key == "audio_embeds" and kind == "video_embeds"):
                return key
        # vLLM's request model refuses a part with neither (no parameter); its parser, one with a uuid
        raise ChatFormatError(f"{where}: missing 'type' field in multimodal part.",
                              parameter=None if kind is None else "type")
    if not isinstance(kind, str):
        raise ChatFormatError(f"{where}: invalid 'type' field in multimodal part.", parameter="type")
    raise ChatFormatError(f"{where} has unsupported type {kind!r}. Supported types: {', '.join(sorted(PART_TYPES))}.",
                          parameter="type")


def _prehashing(load: Callable[[], Any], modality: str, uuid: str | None, tracker: _Tracker) -> Callable[[], Any]:
    """Hash a loaded item's bytes right after loading it, when its content will be its key: on
    the loading threads rather than in the processing lane (see ``prehash_media``)."""
    config = tracker.processor.info.config
    if uuid is not None or not config.needs_content_hashes or modality == "video":
        # A video's key also holds its metadata, and "video" sorts after "model_id" among the hash
        # inputs, so there is no prefix to absorb ahead of time.
        return load

    def load_and_hash() -> Any:
        item = load()
        if isinstance(item, MediaWithBytes):
            prehash_media(item, modality, config.mm_hasher_algorithm)
        return item

    return load_and_hash


def _part_loader(part: Mapping[str, Any], kind: str, where: str, uuid: str | None,
                 tracker: _Tracker) -> Callable[[], Any]:
    """Validate a media part now; return the function that loads its item."""
    payload = part.get(kind)
    connector, budget, media_io_kwargs = tracker.connector, tracker.budget, tracker.media_io_kwargs
    if kind == "input_image":  # the Responses API's image part: its URL a string, its detail required
        _check_detail(part.get("detail"), f"{where}.detail")
        url = part.get("image_url")
        kind, payload = "image_url", None if url is None else {"url": url}
    elif kind in URL_PARTS and isinstance(payload, str) and (part.get("type") is None or uuid is not None):
        payload = {"url": payload}  # vLLM takes a part named by its field with its URL as a string
    if payload is None:
        if uuid is None:
            raise ChatFormatError(f"{where} has no `{kind}` data and no `uuid`: send the media, or the `uuid` of an "
                                  "item sent before.", parameter=None)
        return lambda: None
    if kind in ("image_embeds", "audio_embeds", "image_pil"):
        return lambda: payload
    if kind == "input_audio":
        # vLLM reads the container from the bytes and `format` only names a data URL's media type
        # it never looks at, so any format (or none) is taken; empty data is an item sent before.
        data = payload.get("data") if isinstance(payload, Mapping) else None
        if not isinstance(payload, Mapping) or not isinstance(data, (str, type(None))):
            raise ChatFormatError(f"{where}.input_audio must be an object with base64 `data` and a `format`.",
                                  parameter="messages")
        if not data:
            if uuid is None:
                raise ChatFormatError(f"{where}.input_audio has no `data` and the part no `uuid`: send the audio, "
                                      "or the `uuid` of an audio sent before.", parameter="multi_modal_uuids")
            return lambda: None
        return lambda: connector.load_audio(data, budget=budget, media_io_kwargs=media_io_kwargs)
    if not isinstance(payload, Mapping):  # vLLM's content-part schema refuses a bare string (param null) too
        raise ChatFormatError(f"{where}.{kind} must be an object with a `url`, as {{\"{kind}\": {{\"url\": ...}}}}; "
                              f"got a {type(payload).__name__}.", parameter=None)
    if kind == "image_url" and "detail" in payload:
        _check_detail(payload["detail"], f"{where}.image_url.detail")
    url = payload.get("url")
    if url is None and uuid is not None:
        return lambda: None
    if not isinstance(url, (str, DecodedDataURL)):  # decoded: lifted out of a server's body
        raise ChatFormatError(f"{where}.{kind}.url must be a URL string.", parameter=None)
    if kind == "image_url":
        return lambda: connector.load_image(url, budget=budget, media_io_kwargs=media_io_kwargs)
    if kind == "video_url":
        video_processor = _video_processor_name(tracker.processor)
        return lambda: connector.load_video(url, budget=budget, media_io_kwargs=media_io_kwargs,
                                            video_processor=video_processor)
    return lambda: connector.load_audio(url, budget=budget, media_io_kwargs=media_io_kwargs)


def _check_detail(detail: Any, where: str) -> None:
    """vLLM's request model refuses any other value (no parameter named)."""
    if detail not in _IMAGE_DETAILS:
        raise ChatFormatError(f"{where} must be one of {', '.join(map(repr, _IMAGE_DETAILS))}.", parameter=None)


def _video_processor_name(processor: BaseMultiModalProcessor) -> str | None:
    """The class name of the model's HF video processor, which picks vLLM's frame sampler."""
    video_processor = getattr(processor.info.hf_processor, "video_processor", None)
    return None if video_processor is None else type(video_processor).__name__


def _check_text(text: str, reserved: set[str], n: int) -> None:
    check_text(text, parameter="messages", where=f"messages[{n}].content")
    for token in reserved:
        if token and token in text:
            raise ChatFormatError(
                f"messages[{n}] contains {token!r} in its text. That token is reserved for multimodal items, so it "
                "cannot be typed: send media as content parts (image_url, input_audio, video_url) and mmfront places "
                "it.",
                parameter="messages",
            )


def _check_role(role: object, n: int) -> None:
    """Roles are names (vLLM accepts custom ones): anything else could carry a token into the
    template's turn header."""
    if not isinstance(role, str) or not _ROLE.fullmatch(role):
        raise ChatFormatError(
            f"messages[{n}].role must be a name such as 'system', 'user', 'assistant', 'tool' or 'developer' "
            f"(letters, digits, '_' or '-', at most 64), got {role!r}.", parameter="messages")


def _check_rendered(prompt: str, expected: Mapping[str, int]) -> None:
    """Only placeholders mmfront placed may reach the processor. Checking the rendered prompt, not
    the parts, also catches a placeholder split across parts that the template joins, or carried
    in a field such as ``name`` or ``tools``: with an item present, that one would take its slot."""
    for token, count in expected.items():
        found = prompt.count(token)
        if found != count:
            raise ChatFormatError(
                f"The rendered prompt contains {found} {token!r} but mmfront placed {count}: the messages write "
                "that multimodal token outside a media part (split across text parts, or in another field). "
                "Send media as content parts and keep the model's multimodal tokens out of the text.",
                parameter="messages")
