"""OpenAI chat messages -> a templated prompt plus the request's multimodal items, in order.

Each media part becomes the model's placeholder string (``<start_of_image>`` for Gemma 3) at its
position, then ``tokenizer.apply_chat_template`` renders the conversation. Templates come in two
shapes, detected once per template: those that walk content parts themselves (``{"type":
"image"}`` entries become placeholders inside the template) and those that expect string content
(mmfront writes the placeholders into the text).

A user who types a placeholder inside a text part does not get an image slot: the request is
refused with :class:`~mmfront.errors.ChatFormatError`, because a silent slot would either fail
the item count or, worse, pair the typed token with another part's image.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mmfront.errors import ChatFormatError, MediaFormatError, ValidationError
from mmfront.hashing import prehash_media
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.media.base import MediaWithBytes

if TYPE_CHECKING:
    from mmfront.processing.processor import BaseMultiModalProcessor

_MEDIA_PARTS = {
    "image_url": ("image", False),
    "image_pil": ("image", False),
    "image_embeds": ("image", True),
    "input_audio": ("audio", False),
    "audio_url": ("audio", False),
    "audio_embeds": ("audio", True),
}
PART_TYPES = ("text", *_MEDIA_PARTS)


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
    openai_format: Mapping[str, bool]
    items: dict[str, list[Any]] = field(default_factory=dict)
    uuids: dict[str, list[str | None]] = field(default_factory=dict)
    embeds: dict[str, bool] = field(default_factory=dict)

    def check(self, modality: str, is_embed: bool) -> None:
        """Refuse an item before its media is loaded or fetched."""
        if self.embeds.setdefault(modality, is_embed) != is_embed:
            raise ChatFormatError(f"Mixing raw {modality} and embedding inputs is not allowed in one request.",
                                  parameter="messages")
        index = len(self.items.get(modality, ()))
        limit = self.processor.info.allowed_mm_limits.get(modality)
        if limit is None:
            raise ValidationError(f"This model does not support {modality} inputs.", parameter=modality)
        if index + 1 > limit and not (is_embed and self.processor.info.config.get_limit_per_prompt(modality) == 0):
            raise ValidationError(
                f"At most {limit} {modality}(s) may be provided in one prompt. Set `--limit-mm-per-prompt` "
                "(MultiModalConfig.limit_mm_per_prompt) to increase this limit.", parameter=modality,
            )

    def add(self, modality: str, load: Callable[[], Any], uuid: str | None) -> str:
        index = len(self.items.get(modality, ()))
        self.items.setdefault(modality, []).append(load)
        self.uuids.setdefault(modality, []).append(uuid)
        return self.processor.get_placeholder_str(modality, index)

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
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
) -> ChatRequestInputs:
    """Load every media part, place the placeholders and render the chat template."""
    if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)) or not messages:
        raise ChatFormatError("`messages` must be a non-empty list of chat messages.", parameter="messages")
    reserved = processor.get_mm_special_tokens()
    tokenizer = processor.info.tokenizer
    template = chat_template or getattr(processor.info.hf_processor, "chat_template", None) or tokenizer.chat_template
    if not template:
        raise ChatFormatError("The model has no chat template; send a prompt string instead of messages.",
                              parameter="messages")
    openai_format = {m: _template_walks_parts(tokenizer, template, m, processor) for m in ("image", "audio")}
    tracker = _Tracker(processor, connector, budget, media_io_kwargs, reserved, openai_format)

    conversation = []
    for n, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ChatFormatError(f"messages[{n}] must be an object with a string `role`.", parameter="messages")
        content = message.get("content")
        rendered = dict(message)
        if isinstance(content, str):
            _check_text(content, reserved, n)
        elif isinstance(content, Sequence) and not isinstance(content, (str, bytes)):
            rendered["content"] = _render_parts(content, n, tracker)
        elif content is not None:
            raise ChatFormatError(f"messages[{n}].content must be a string or a list of content parts.",
                                  parameter="messages")
        conversation.append(rendered)

    try:
        prompt = tokenizer.apply_chat_template(
            conversation, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt,
            **dict(chat_template_kwargs or {}),
        )
    except Exception as exc:
        raise ChatFormatError(f"The chat template failed to render these messages: {exc}",
                              parameter="messages") from exc
    return ChatRequestInputs(prompt=str(prompt), mm_data=tracker.load_all(), mm_uuids=tracker.uuids)


def _render_parts(parts: Sequence[Any], n: int, tracker: _Tracker) -> list[dict[str, Any]] | str:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    modalities: set[str] = set()
    for k, part in enumerate(parts):
        where = f"messages[{n}].content[{k}]"
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise ChatFormatError(f"{where} must be an object with a string `type`.", parameter="messages")
        kind = part["type"]
        if kind == "text":
            text = part.get("text")
            if not isinstance(text, str):
                raise ChatFormatError(f"{where} is a text part without a string `text`.", parameter="messages")
            _check_text(text, tracker.reserved, n)
            out.append({"type": "text", "text": text})
            texts.append(text)
            continue
        if kind not in _MEDIA_PARTS:
            raise ChatFormatError(f"{where} has unknown type {kind!r}. Supported: {', '.join(PART_TYPES)}.",
                                  parameter="messages")
        modality, is_embed = _MEDIA_PARTS[kind]
        uuid = part.get("uuid")
        if uuid is not None and not isinstance(uuid, str):
            raise ChatFormatError(f"{where}.uuid must be a string.", parameter="messages")
        tracker.check(modality, is_embed)
        load = _part_loader(part, kind, where, uuid, tracker)
        placeholder = tracker.add(modality, _prehashing(load, modality, uuid, tracker), uuid)
        modalities.add(modality)
        out.append({"type": modality})
        texts.append(placeholder)
    formats = tracker.openai_format
    walks_parts = all(formats[m] for m in modalities) if modalities else any(formats.values())
    return out if walks_parts else "\n".join(texts)


def _prehashing(load: Callable[[], Any], modality: str, uuid: str | None, tracker: _Tracker) -> Callable[[], Any]:
    """Hash a loaded item's bytes right after loading it, when its content will be its key: on
    the loading threads rather than in the processing lane (see ``prehash_media``)."""
    config = tracker.processor.info.config
    if uuid is not None or not (config.mm_processor_cache_gb > 0 or config.enable_prefix_caching):
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
    if payload is None:
        if uuid is None:
            raise ChatFormatError(f"{where} has no `{kind}` data and no `uuid`: send the media, or the `uuid` of an "
                                  "item sent before.", parameter="messages")
        return lambda: None
    if kind in ("image_embeds", "audio_embeds", "image_pil"):
        return lambda: payload
    if kind == "input_audio":
        if not isinstance(payload, Mapping) or not isinstance(payload.get("data"), str):
            raise ChatFormatError(f"{where}.input_audio must be an object with base64 `data` and a `format`.",
                                  parameter="messages")
        fmt = str(payload.get("format", "wav")).lower()
        if fmt != "wav":
            raise MediaFormatError(f"{where}: audio format {fmt!r} is not supported; send WAV audio.",
                                   parameter="messages")
        data = payload["data"]
        return lambda: connector.load_audio(data, budget=budget, media_io_kwargs=media_io_kwargs)
    url = payload.get("url") if isinstance(payload, Mapping) else payload
    if url is None and uuid is not None:
        return lambda: None
    if not isinstance(url, str):
        raise ChatFormatError(f"{where}.{kind} must be a URL string or an object with a `url`.", parameter="messages")
    if kind == "image_url":
        return lambda: connector.load_image(url, budget=budget, media_io_kwargs=media_io_kwargs)
    return lambda: connector.load_audio(url, budget=budget, media_io_kwargs=media_io_kwargs)


def _check_text(text: str, reserved: set[str], n: int) -> None:
    for token in reserved:
        if token and token in text:
            raise ChatFormatError(
                f"messages[{n}] contains {token!r} in its text. That token is reserved for multimodal items, so it "
                "cannot be typed: send media as content parts (image_url, input_audio) and mmfront places it.",
                parameter="messages",
            )


_FORMAT_MEMO: dict[tuple[int, str, str], bool] = {}


def _template_walks_parts(tokenizer: Any, template: str, modality: str, processor: BaseMultiModalProcessor) -> bool:
    """Whether ``template`` turns a ``{"type": modality}`` part into the model's placeholder."""
    key = (id(tokenizer), template, modality)
    if key not in _FORMAT_MEMO:
        try:
            placeholder = processor.get_placeholder_str(modality, 0)
        except ValidationError:
            _FORMAT_MEMO[key] = False
            return False
        probe = [{"role": "user", "content": [{"type": modality}, {"type": "text", "text": "x"}]}]
        try:
            text = tokenizer.apply_chat_template(probe, chat_template=template, tokenize=False)
        except Exception:
            text = ""
        _FORMAT_MEMO[key] = placeholder in str(text)
    return _FORMAT_MEMO[key]
