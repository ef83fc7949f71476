"""The OpenAI request bodies ``vllm serve`` takes, decoded with msgspec, and the responses it
writes, field for field.

Bodies are decoded straight into typed structs (msgspec: one pass, no intermediate dicts);
fields a client sends that vLLM does not know are ignored, as vLLM ignores them. A body that
does not fit raises :class:`~mmfront.errors.ValidationError` naming ``body.<field>`` (vLLM's
``param`` for request-shape errors). Responses are plain dicts in vLLM's key order with the
keys vLLM's pydantic models write: the whole model for a response (``null`` included), only the
fields it sets for a stream chunk, so a client that compares them with ``vllm serve``'s sees
the same fields.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from mmfront.errors import ValidationError
from mmfront.serve.output import LOGPROB_FLOOR, TokenLogprob
from mmfront.wire import RequestOutputKind, SamplingParams


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = True
    continuous_usage_stats: bool | None = False


class _SamplingFields(msgspec.Struct, kw_only=True):
    """The sampling fields chat and completion requests share (vLLM's defaults)."""

    model: str | None = None
    n: int | None = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    mm_processor_kwargs: dict[str, Any] | None = None
    cache_salt: str | None = None
    request_id: str | None = None
    priority: int = 0
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/completions`` (text or token-id prompts)."""

    prompt: str | list[Any] | None = None
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None


_DECODERS = {cls: msgspec.json.Decoder(cls) for cls in (ChatCompletionRequest, CompletionRequest)}
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`")


BODY_PARAM = "body"
"""The ``param`` of an error in the body's shape (JSON, a missing field, a wrong type), or its
prefix (``body.messages``): vLLM answers these with type ``Bad Request``."""


def decode_request(body: bytes, cls: type[Any]) -> Any:
    """``body`` as a ``cls`` request; a body that does not fit raises
    :class:`~mmfront.errors.ValidationError` whose ``parameter`` is :data:`BODY_PARAM` or
    ``body.<field>``."""
    try:
        request = _DECODERS[cls].decode(body)
    except msgspec.ValidationError as e:
        message = str(e)
        missing, at = _MISSING.search(message), _AT.search(message)
        if missing:
            param = f"{BODY_PARAM}.{missing['field']}"
        elif at:
            param = BODY_PARAM + re.sub(r"\[(\d+)\]", r".\1", at["path"])
        else:
            param = BODY_PARAM
        raise ValidationError(message, parameter=param) from e
    except msgspec.DecodeError as e:
        raise ValidationError(f"JSON decode error: {e}", parameter=BODY_PARAM) from e
    if request.stream_options is not None and not request.stream:
        raise ValidationError("Stream options can only be defined when `stream=True`.", parameter="stream_options")
    if isinstance(request, CompletionRequest):
        _check_completion(request)
    elif isinstance(request, ChatCompletionRequest) and request.top_logprobs is not None:
        if request.top_logprobs < 0 and request.top_logprobs != -1:
            raise ValidationError("`top_logprobs` must be a positive value or -1.", parameter="top_logprobs")
        if request.top_logprobs != 0 and not request.logprobs:
            raise ValidationError("when using `top_logprobs`, `logprobs` must be set to true.",
                                  parameter="top_logprobs")
    return request


def _check_completion(request: CompletionRequest) -> None:
    if request.echo or request.suffix is not None:
        raise ValidationError("`echo` and `suffix` are not supported by mmfront serve yet.",
                              parameter="echo" if request.echo else "suffix")
    if not prompts(request):
        raise ValidationError("Either prompt or prompt_embeds must be provided and non-empty.", parameter="prompt")


def prompts(request: CompletionRequest) -> list[str | list[int]]:
    """The completion's prompts: a string, a list of strings, token ids, or lists of token ids."""
    prompt = request.prompt
    if not prompt:
        return []
    if isinstance(prompt, str):
        return [prompt]
    if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
        return [list(prompt)]
    out: list[str | list[int]] = []
    for p in prompt:
        token_ids = isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p)
        if p and (isinstance(p, str) or token_ids):
            out.append(p)
        else:
            raise ValidationError("prompt must be a string, a list of strings, a list of token ids, or a list of "
                                  "lists of token ids, none empty.", parameter="prompt")
    return out


def include_usage(request: _SamplingFields) -> bool:
    """Whether a stream ends with a usage chunk (vLLM's ``stream_options`` rules)."""
    return bool(request.stream_options is not None and request.stream_options.include_usage)


def continuous_usage(request: _SamplingFields) -> bool:
    """Whether every chunk carries the usage so far (``stream_options.continuous_usage_stats``)."""
    options = request.stream_options
    return bool(options is not None and options.include_usage and options.continuous_usage_stats)


def sampling_params(request: ChatCompletionRequest | CompletionRequest, max_tokens: int | None) -> SamplingParams:
    """vLLM's ``to_sampling_params``: unset fields take vLLM's defaults; a value out of range raises
    :class:`~mmfront.errors.ValidationError` naming it."""
    if isinstance(request, ChatCompletionRequest):
        logprobs = request.top_logprobs if request.logprobs else None
    else:
        logprobs = request.logprobs
    try:
        return _sampling_params(request, max_tokens, logprobs)
    except ValidationError as e:
        if e.value is None:  # vLLM's message shows the value the request sent
            e.value = msgspec.structs.asdict(request).get(e.parameter or "")
        raise


def check_logprobs(params: SamplingParams, max_logprobs: int, vocab_size: int) -> None:
    """vLLM's ``--max-logprobs`` limit, which its API server applies before anything runs."""
    limit = vocab_size if max_logprobs == -1 else max_logprobs
    for asked, field, what in ((params.logprobs, "logprobs", "sample"),
                               (params.prompt_logprobs, "prompt_logprobs", "prompt")):
        if asked:
            asked = vocab_size if asked == -1 else asked
            if asked > limit:
                raise ValidationError(f"Requested {what} logprobs of {asked}, which is greater than max allowed: "
                                      f"{limit}", parameter=field, value=asked)


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value


def _sampling_params(request: ChatCompletionRequest | CompletionRequest, max_tokens: int | None,
                     logprobs: int | None) -> SamplingParams:
    return SamplingParams(
        n=_pick(request.n, 1),
        presence_penalty=_pick(request.presence_penalty, 0.0),
        frequency_penalty=_pick(request.frequency_penalty, 0.0),
        repetition_penalty=_pick(request.repetition_penalty, 1.0),
        temperature=_pick(request.temperature, 1.0),
        top_p=_pick(request.top_p, 1.0),
        top_k=_pick(request.top_k, 0),
        min_p=_pick(request.min_p, 0.0),
        seed=request.seed,
        stop=request.stop,
        stop_token_ids=request.stop_token_ids,
        ignore_eos=request.ignore_eos,
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        logprobs=logprobs,
        skip_special_tokens=_pick(request.skip_special_tokens, True),
        spaces_between_special_tokens=request.spaces_between_special_tokens,
        include_stop_str_in_output=request.include_stop_str_in_output,
        output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
        skip_clone=True,
    )


def child_params(params: SamplingParams, index: int) -> SamplingParams:
    """The parameters of choice ``index`` of an ``n``-choice request, sent as its own engine
    request (vLLM's ``ParentRequest``): ``n`` 1, and a seed of its own when one is set."""
    seed = None if params.seed is None else params.seed + index
    return msgspec.structs.replace(params, n=1, seed=seed)


# --- responses ------------------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int, *, details: bool = True, completion_details: bool = False,
          ) -> dict[str, Any]:
    """vLLM's ``UsageInfo`` as its responses write it: ``details`` (a whole response) adds both
    ``*_details`` as ``null``; ``completion_details`` (a chat chunk's running usage) only the one
    vLLM sets."""
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                           "completion_tokens": completion_tokens}
    if details:
        out.update(prompt_tokens_details=None, completion_tokens_details=None)
    elif completion_details:
        out["completion_tokens_details"] = None
    return out


def chat_logprobs(entries: Sequence[TokenLogprob], top_logprobs: int, decode: Any) -> dict[str, Any]:
    """OpenAI's chat ``logprobs``: per token its text, logprob, UTF-8 bytes and the top ones."""

    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        token = decode(token_id)
        return {"token": token, "logprob": max(logprob, LOGPROB_FLOOR), "bytes": list(token.encode("utf-8", "replace"))}

    limit = max(top_logprobs, 0)
    return {"content": [{**entry(e.token_id, e.logprob), "top_logprobs": [entry(t, lp) for t, lp in e.top[:limit]]}
                        for e in entries]}


def completion_logprobs(entries: Sequence[TokenLogprob], top_logprobs: int, decode: Any,
                        text_offset: int) -> dict[str, Any]:
    """OpenAI's legacy completion ``logprobs`` (tokens, token_logprobs, top_logprobs, text_offset)."""
    tokens, offsets = [], []
    for e in entries:
        offsets.append(text_offset)
        token = decode(e.token_id)
        tokens.append(token)
        text_offset += len(token)
    return {"text_offset": offsets, "token_logprobs": [max(e.logprob, LOGPROB_FLOOR) for e in entries],
            "tokens": tokens,
            "top_logprobs": [{decode(t): max(lp, LOGPROB_FLOOR) for t, lp in e.top[:max(top_logprobs, 0)]}
                             for e in entries]}


def chat_choice(index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None,
                stop_reason: int | str | None) -> dict[str, Any]:
    return {"index": index,
            "message": {"role": "assistant", "content": text, "refusal": None, "annotations": None, "audio": None,
                        "function_call": None, "reasoning": None},
            "logprobs": logprobs, "finish_reason": finish_reason, "stop_reason": stop_reason, "token_ids": None,
            "routed_experts": None, "weight_versions": None}


def completion_choice(index: int, text: str, logprobs: dict[str, Any] | None, finish_reason: str | None,
                      stop_reason: int | str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
            "stop_reason": stop_reason, "token_ids": None, "prompt_logprobs": None, "prompt_token_ids": None,
            "routed_experts": None, "weight_versions": None}


@dataclass(frozen=True)
class ResponseHead:
    """What every response and chunk of one request starts with."""

    id: str
    created: int
    model: str
    fingerprint: str


def chat_response(head: ResponseHead, choices: list[dict[str, Any]], usage_info: dict[str, Any]) -> dict[str, Any]:
    return {"id": head.id, "object": "chat.completion", "created": head.created, "model": head.model,
            "choices": choices, "service_tier": None, "system_fingerprint": head.fingerprint, "usage": usage_info,
            "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None,
            "ec_transfer_params": None, "metrics": None}


def completion_response(head: ResponseHead, choices: list[dict[str, Any]], usage_info: dict[str, Any],
                        ) -> dict[str, Any]:
    return {"id": head.id, "object": "text_completion", "created": head.created, "model": head.model,
            "choices": choices, "service_tier": None, "system_fingerprint": head.fingerprint, "usage": usage_info,
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None}


def chat_role_chunk(head: ResponseHead, index: int, usage_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """A stream's first chunk per choice: the role, and empty content."""
    chunk = {"id": head.id, "object": "chat.completion.chunk", "created": head.created, "model": head.model,
             "choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}]}
    if usage_info is not None:
        chunk["usage"] = usage_info
    return {**chunk, "prompt_token_ids": None, "prompt_text": None}


def _chunk_end(chunk: dict[str, Any], head: ResponseHead, finish_reason: str | None, fingerprint: bool,
               usage_info: dict[str, Any] | None) -> dict[str, Any]:
    if usage_info is not None:
        chunk["usage"] = usage_info
    if fingerprint and finish_reason is not None:
        chunk["system_fingerprint"] = head.fingerprint
    chunk["kv_transfer_params"] = None
    return chunk


def chat_chunk(head: ResponseHead, index: int, text: str | None, *, logprobs: dict[str, Any] | None,
               finish_reason: str | None, stop_reason: int | str | None, fingerprint: bool,
               usage_info: dict[str, Any] | None = None) -> dict[str, Any]:
    """A content chunk; the finishing one carries ``finish_reason`` and ``stop_reason`` (and, with
    ``fingerprint``, when no usage chunk follows, the fingerprint). ``text`` None: a choice that
    ended with no output. ``usage_info``: the usage so far (``continuous_usage_stats``)."""
    choice: dict[str, Any] = {"index": index, "delta": {} if text is None else {"content": text},
                              "logprobs": logprobs, "finish_reason": finish_reason}
    if finish_reason is None:
        choice["token_ids"] = None
    else:
        choice.update(stop_reason=stop_reason, token_ids=None, weight_versions=None)
    chunk = {"id": head.id, "object": "chat.completion.chunk", "created": head.created, "model": head.model,
             "choices": [choice]}
    return _chunk_end(chunk, head, finish_reason, fingerprint, usage_info)


def completion_chunk(head: ResponseHead, index: int, text: str, *, logprobs: dict[str, Any] | None,
                     finish_reason: str | None, stop_reason: int | str | None, fingerprint: bool,
                     usage_info: dict[str, Any] | None = None) -> dict[str, Any]:
    chunk = {"id": head.id, "object": "text_completion", "created": head.created, "model": head.model,
             "choices": [{"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason,
                          "stop_reason": stop_reason, "prompt_token_ids": None, "token_ids": None,
                          "weight_versions": None}]}
    return _chunk_end(chunk, head, finish_reason, fingerprint, usage_info)


def usage_chunk(head: ResponseHead, obj: str, usage_info: dict[str, Any]) -> dict[str, Any]:
    """The last chunk with ``stream_options.include_usage``: no choices, the usage."""
    return {"id": head.id, "object": obj, "created": head.created, "model": head.model, "choices": [],
            "usage": usage_info, "system_fingerprint": head.fingerprint}


def model_card(name: str, root: str, created: int, max_model_len: int | None, permission_id: str) -> dict[str, Any]:
    """One ``/v1/models`` entry, as vLLM lists it."""
    return {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": root, "parent": None,
            "max_model_len": max_model_len,
            "permission": [{"id": permission_id, "object": "model_permission", "created": created,
                            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                            "organization": "*", "group": None, "is_blocking": False}]}


def error_body(message: str, error_type: str, param: str | None, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


__all__ = [
    "BODY_PARAM",
    "ChatCompletionRequest",
    "CompletionRequest",
    "ResponseHead",
    "StreamOptions",
    "chat_choice",
    "chat_chunk",
    "chat_logprobs",
    "chat_response",
    "chat_role_chunk",
    "check_logprobs",
    "child_params",
    "completion_choice",
    "completion_chunk",
    "completion_logprobs",
    "completion_response",
    "continuous_usage",
    "decode_request",
    "error_body",
    "include_usage",
    "model_card",
    "prompts",
    "sampling_params",
    "usage",
    "usage_chunk",
]
