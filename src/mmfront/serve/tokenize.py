"""``vllm serve``'s tokenizer routes: ``/tokenize`` (a prompt, or chat messages rendered and
processed as ``/v1/chat/completions`` would, media placeholders expanded), ``/detokenize`` and
``/tokenizer_info``, with vLLM's request and response shapes.

A chat is prepared by the same preprocessor as a chat completion (``skip_mm_cache``: a request
that is never sent to an engine leaves the engines' processor-cache mirror alone), so the token
ids are exactly those a completion of it would send.
"""

from __future__ import annotations

from typing import Any

import msgspec

from mmfront.errors import ValidationError
from mmfront.preprocess import InputPreprocessor, RequestOptions
from mmfront.preprocess.truncation import DEFAULT_TRUNCATION_SIDE
from mmfront.serve.request_checks import check_message_content
from mmfront.serve.request_decoding import decode_body


class TokenizeCompletionRequest(msgspec.Struct, kw_only=True):
    """``POST /tokenize`` with a ``prompt``."""

    prompt: str
    model: str | None = None
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(msgspec.Struct, kw_only=True):
    """``POST /tokenize`` with ``messages``: the prompt a chat completion of them would send."""

    messages: list[dict[str, Any]]
    model: str | None = None
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    mm_processor_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True):
    tokens: list[int]
    model: str | None = None


class TokenizeResponse(msgspec.Struct, kw_only=True):
    count: int
    max_model_len: int | None
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(msgspec.Struct):
    prompt: str


_COMPLETION = msgspec.json.Decoder(TokenizeCompletionRequest, strict=False)
_CHAT = msgspec.json.Decoder(TokenizeChatRequest, strict=False)
_DETOKENIZE = msgspec.json.Decoder(DetokenizeRequest, strict=False)
"""Lax, as vLLM's pydantic request models are (``"tokens": ["1000"]`` is token 1000)."""
_KEYS = msgspec.json.Decoder(dict[str, msgspec.Raw])
_INT64_MAX = 2**63 - 1


def decode_tokenize(body: bytes) -> TokenizeCompletionRequest | TokenizeChatRequest:
    """A ``/tokenize`` body: the chat form when it has ``messages``, else the prompt form (vLLM's union)."""
    keys = decode_body(body, _KEYS)
    request: TokenizeCompletionRequest | TokenizeChatRequest = decode_body(body, _CHAT if "messages" in keys
                                                                          else _COMPLETION)
    if isinstance(request, TokenizeChatRequest):
        check_message_content(request.messages)
    return request


def decode_detokenize(body: bytes) -> DetokenizeRequest:
    request: DetokenizeRequest = decode_body(body, _DETOKENIZE)
    for n, token in enumerate(request.tokens):
        if not 0 <= token <= _INT64_MAX:
            raise ValidationError(f"tokens.{n}: Input should be greater than or equal to 0 and at most {_INT64_MAX}",
                                  parameter=f"tokens.{n}", value=token)
    return request


def chat_options(request: TokenizeChatRequest) -> RequestOptions:
    """The preprocessing options of a chat ``/tokenize`` request, as its chat completion would take them."""
    if request.add_generation_prompt and request.continue_final_message:
        raise ValidationError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                              parameter="continue_final_message")
    return RequestOptions(
        hf_processor_mm_kwargs=request.mm_processor_kwargs, media_io_kwargs=request.media_io_kwargs,
        chat_template=request.chat_template, chat_template_kwargs=request.chat_template_kwargs,
        add_generation_prompt=request.add_generation_prompt, continue_final_message=request.continue_final_message,
        tools=request.tools or None)


def tokenize(preprocessor: InputPreprocessor, request: TokenizeCompletionRequest | TokenizeChatRequest,
             max_model_len: int | None, request_id: str) -> TokenizeResponse:
    """The answer to ``request`` (run on a preprocessor worker thread: a chat may load media)."""
    tokenizer = preprocessor.tokenizer
    if isinstance(request, TokenizeChatRequest):
        inputs = preprocessor.preprocess(request.messages, request_id=request_id, skip_mm_cache=True,
                                         options=chat_options(request))
        tokens = list(inputs["prompt_token_ids"])
        if request.add_special_tokens:  # vLLM tokenizes the rendered text with the tokenizer's special tokens
            prefix, suffix = special_tokens_around(tokenizer)
            tokens = prefix + tokens + suffix
    else:
        tokens = list(tokenizer.encode(request.prompt, add_special_tokens=request.add_special_tokens))
    strs = list(tokenizer.convert_ids_to_tokens(tokens)) if request.return_token_strs else None
    return TokenizeResponse(count=len(tokens), max_model_len=max_model_len, tokens=tokens, token_strs=strs)


def special_tokens_around(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer adds before and after a text when asked for special tokens (BOS, EOS...)."""
    plain = list(tokenizer.encode("a", add_special_tokens=False))
    full = list(tokenizer.encode("a", add_special_tokens=True))
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            return full[:start], full[start + len(plain):]
    return [], []


def detokenize(tokenizer: Any, request: DetokenizeRequest) -> DetokenizeResponse:
    return DetokenizeResponse(str(tokenizer.decode(request.tokens)))


def tokenizer_info(tokenizer: Any, chat_template: str | None) -> dict[str, Any]:
    """``/tokenizer_info``: the tokenizer's ``init_kwargs`` (file paths left out), the side prompts
    are truncated from, its class and the chat template, as vLLM's ``TokenizerInfo`` writes them."""
    config = {k: _serializable(v) for k, v in dict(getattr(tokenizer, "init_kwargs", None) or {}).items()
              if k not in ("vocab_file", "merges_file")}
    config["truncation_side"] = DEFAULT_TRUNCATION_SIDE  # vLLM loads every tokenizer with it; mmfront cuts so
    config["tokenizer_class"] = type(tokenizer).__name__
    if chat_template:
        config["chat_template"] = chat_template
    return config


def _serializable(value: Any) -> Any:
    if hasattr(value, "content"):  # an AddedToken
        return value.content
    if isinstance(value, dict):
        return {k: _serializable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_serializable(v) for v in value]
    return value


__all__ = ["DetokenizeRequest", "DetokenizeResponse", "TokenizeChatRequest", "TokenizeCompletionRequest",
           "TokenizeResponse", "chat_options", "decode_detokenize", "decode_tokenize", "detokenize",
           "special_tokens_around", "tokenize", "tokenizer_info"]
