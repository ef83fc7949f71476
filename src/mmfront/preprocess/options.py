"""One request's options besides its prompt and sampling parameters, and the prompt forms that
carry some of them (vLLM's prompt dicts, chat messages).

:class:`RequestOptions` is the one home of the per-request options that ``preprocess``,
``process_inputs`` and the engine client all take, so a new option is one field here. The checks
in this module refuse an option that would be silently ignored (given twice, or a chat option on a
prompt nothing renders) instead of dropping it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from mmfront.errors import InputTypeError, ValidationError
from mmfront.preprocess.truncation import PromptTruncation
from mmfront.processing.processor import MultiModalUUIDs
from mmfront.wire import LoRARequest

PromptInput = str | Sequence[int] | Sequence[Mapping[str, Any]] | Mapping[str, Any]
"""A prompt string, token ids, a list of OpenAI chat messages, or a vLLM prompt dict
(``{"prompt" | "prompt_token_ids", "multi_modal_data", "mm_processor_kwargs", "multi_modal_uuids"}``)."""

_PROMPT_DICT_KEYS = frozenset({"prompt", "prompt_token_ids", "multi_modal_data", "mm_processor_kwargs",
                               "multi_modal_uuids", "cache_salt"})


@dataclass(frozen=True)
class RequestOptions:
    """Everything about one request besides its prompt and sampling parameters: the one home of
    the per-request options that ``preprocess``, ``process_inputs`` and the client all take
    (as keyword arguments, or as one ``options=`` value)."""

    mm_data: Mapping[str, Any] | None = None
    mm_uuids: MultiModalUUIDs | None = None
    hf_processor_mm_kwargs: Mapping[str, Any] | None = None
    media_io_kwargs: Mapping[str, Mapping[str, Any]] | None = None
    arrival_time: float | None = None
    lora_request: LoRARequest | None = None
    cache_salt: str | None = None
    priority: int = 0
    data_parallel_rank: int | None = None
    chat_template: str | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: Sequence[Mapping[str, Any]] | None = None
    add_special_tokens: bool | None = None
    """Whether the tokenizer adds its special tokens to a text prompt; ``None``: yes for a prompt
    string, no for rendered chat messages (the template writes them), as vLLM's defaults."""
    truncation: PromptTruncation | None = None
    """Cut the prompt to its last (or first) tokens (vLLM's ``truncate_prompt_tokens``)."""
    session_id: str | None = None
    """Sent to the engine in ``EngineCoreRequest.session_id`` (vLLM's: related requests' identity)."""

    @classmethod
    def of(cls, options: RequestOptions | None, kwargs: Mapping[str, Any]) -> RequestOptions:
        """``options`` updated with keyword arguments; an unknown keyword is refused by name."""
        unknown = set(kwargs) - _OPTION_NAMES
        if unknown:
            raise InputTypeError(f"Unknown request option(s) {sorted(unknown)}; the options are "
                                 f"{sorted(_OPTION_NAMES)}.", parameter=sorted(unknown)[0])
        base = options or _DEFAULT_OPTIONS
        return replace(base, **kwargs) if kwargs else base

    def chat_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"add_generation_prompt": self.add_generation_prompt,
                               "chat_template": self.chat_template, "chat_template_kwargs": self.chat_template_kwargs}
        if self.continue_final_message:
            out["continue_final_message"] = True
        if self.tools is not None:
            out["tools"] = self.tools
        return out


_OPTION_NAMES = frozenset(f.name for f in fields(RequestOptions))
_DEFAULT_OPTIONS = RequestOptions()


def is_chat(prompt: object) -> bool:
    """A non-empty list of mappings: OpenAI chat messages (a token-id list holds ints)."""
    return isinstance(prompt, Sequence) and not isinstance(prompt, (str, bytes)) and len(prompt) > 0 \
        and all(isinstance(m, Mapping) for m in prompt)


def from_prompt_dict(prompt: Mapping[str, Any], options: RequestOptions) -> tuple[Any, RequestOptions]:
    """vLLM's ``TextPrompt``/``TokensPrompt`` dicts: the prompt and the options they carry."""
    unknown = set(prompt) - _PROMPT_DICT_KEYS
    if unknown:
        raise InputTypeError(f"Unknown prompt key(s) {sorted(unknown)}; a prompt dict takes "
                             f"{sorted(_PROMPT_DICT_KEYS)}.", parameter="prompt")
    if ("prompt" in prompt) == ("prompt_token_ids" in prompt):
        raise ValidationError("A prompt dict needs exactly one of `prompt` and `prompt_token_ids`.", parameter="prompt")
    text = prompt["prompt"] if "prompt" in prompt else prompt["prompt_token_ids"]
    updates: dict[str, Any] = {}
    for key, option in (("multi_modal_data", "mm_data"), ("mm_processor_kwargs", "hf_processor_mm_kwargs"),
                        ("multi_modal_uuids", "mm_uuids"), ("cache_salt", "cache_salt")):
        if prompt.get(key) is not None:
            if getattr(options, option) not in (None, {}):
                raise InputTypeError(f"`{key}` is given both in the prompt dict and as the `{option}` option; give it "
                                     "once.", parameter=key)
            updates[option] = prompt[key]
    return text, replace(options, **updates) if updates else options


_CHAT_DEFAULTS = {"chat_template": None, "chat_template_kwargs": None, "add_generation_prompt": True,
                  "continue_final_message": False, "tools": None}


def refuse_chat_options(opts: RequestOptions) -> None:
    """Chat options on a prompt string or token ids would be ignored: refuse them by name."""
    for name, default in _CHAT_DEFAULTS.items():
        value = getattr(opts, name)
        if value != default and not (default is None and not value):
            raise ValidationError(f"`{name}` applies to chat messages only; this prompt is a string or token ids, "
                                  "so nothing would render it. Send the prompt as messages, or drop the option.",
                                  parameter=name)
