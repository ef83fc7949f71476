"""The OpenAI request bodies ``vllm serve`` takes, as typed msgspec structs, and what their fields
mean to the server: the completion's prompts, the chat template's variables and tools, a stream's
usage chunks.

A request's stages each have a module: a body decoded into these structs,
:mod:`mmfront.serve.request_decoding`; vLLM's checks of a decoded request,
:mod:`mmfront.serve.request_checks`; the engine's ``SamplingParams`` made from it,
:mod:`mmfront.serve.sampling`; the responses, :mod:`mmfront.serve.responses`. Fields a client
sends that vLLM does not know are ignored, as vLLM ignores them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from mmfront.errors import RequestBodyError
from mmfront.wire.params import RepetitionDetectionParams, StructuredOutputsFields

# --- request bounds (issue 36: wire ints, list caps; docs/security.md) ----------------------------

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
"""An int a request may send where vLLM's field is bounded to 64 bits (``seed``, ``priority``), or
one no other rule bounds before it reaches the engine (``top_k``: a 400 naming it rather than a
send that cannot encode it)."""
MAX_STOP_STRINGS = int(os.environ.get("VLLM_MAX_STOP_STRINGS", "4"))
"""Most ``stop`` strings a request may give (vLLM's ``VLLM_MAX_STOP_STRINGS``, read as the server
starts): each is searched for in every output step's new text."""
StopList = Annotated[list[str], msgspec.Meta(max_length=MAX_STOP_STRINGS)]


class StreamOptions(msgspec.Struct):
    """Unset fields stay :data:`~msgspec.UNSET`, so ``{}`` is told from ``{"include_usage": false}``
    (vLLM refuses only a non-empty ``stream_options`` without ``stream``)."""

    include_usage: bool | UnsetType | None = UNSET
    continuous_usage_stats: bool | UnsetType | None = UNSET


# --- structured outputs --------------------------------------------------------------------------


class JsonSchemaResponseFormat(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class LegacyStructuralTag(msgspec.Struct, kw_only=True):
    begin: str
    schema: dict[str, Any] | None = None
    end: str


class ResponseFormat(msgspec.Struct, kw_only=True):
    """OpenAI's ``response_format`` and vLLM's two ``structural_tag`` forms (``format``, or the
    legacy ``structures`` with ``triggers``) in one struct."""

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaResponseFormat | None = None
    format: Any = UNSET
    structures: list[LegacyStructuralTag] | UnsetType = UNSET
    triggers: list[str] | UnsetType = UNSET

    def structural_tag(self) -> str:
        """The tag as vLLM passes it on: its JSON, fields in vLLM's order."""
        if self.format is not UNSET:
            return json.dumps({"type": self.type, "format": self.format})
        structures = [{"begin": s.begin, "schema": s.schema, "end": s.end} for s in self.structures or ()]
        return json.dumps({"type": self.type, "structures": structures, "triggers": self.triggers})


class FunctionDefinition(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | UnsetType | None = UNSET
    defer_loading: bool | UnsetType | None = UNSET


class ChatCompletionToolsParam(msgspec.Struct, kw_only=True):
    """A tool as the chat template gets it (vLLM's ``model_dump``: ``strict`` and ``defer_loading``
    only when sent)."""

    type: Literal["function"] = "function"
    function: FunctionDefinition
    defer_loading: bool | UnsetType | None = UNSET


class ChatCompletionNamedFunction(msgspec.Struct):
    name: Any = None


class ChatCompletionNamedToolChoiceParam(msgspec.Struct, kw_only=True):
    function: Any = None
    type: Literal["function"] = "function"


class _SamplingFields(msgspec.Struct, kw_only=True):
    """The sampling fields chat and completion requests share (vLLM's defaults)."""

    model: str | None = None
    n: int | None = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: Int64 | None = None
    min_p: float | None = None
    seed: Int64 | None = None
    stop: str | StopList | None = None
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
    priority: Int64 = 0
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # logprobs and token ids (chat's and completions' own logprobs fields are theirs)
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    return_tokens_as_token_ids: bool | None = None
    return_token_ids: bool | None = None
    # structured outputs, the token-id fields vLLM checks against the vocabulary, the engine's extras
    logit_bias: dict[str, Any] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsFields | None = None
    repetition_detection: RepetitionDetectionParams | None = None
    routed_experts_prompt_start: Annotated[int, msgspec.Meta(ge=0)] = 0
    vllm_xargs: dict[str, str | int | float | list[str | int | float]] | None = None
    kv_transfer_params: dict[str, Any] | None = None
    ec_transfer_params: dict[str, Any] | None = None
    watermarking: bool | None = None
    # beam search, run by the API server as vLLM's runs it (serve/beam_search.py): ``n`` beams
    use_beam_search: bool = False
    length_penalty: float = 1.0
    # taken and ignored, as vLLM ignores them here (the /render endpoints only)
    return_token_offsets: bool | None = False
    mm_payload: Literal["tensors", "none"] = "tensors"
    return_mm_kwargs: bool | None = None
    # the prompt's tokens, the engine request's session, a stream's chunks, the weights' versions (vLLM's
    # renderer, engine and output-processor fields)
    truncate_prompt_tokens: Annotated[int, msgspec.Meta(ge=-1, le=2**63 - 1)] | None = None
    truncation_side: Literal["left", "right"] | None = None
    session_id: str | None = None
    stream_interval: Annotated[int, msgspec.Meta(ge=1)] | None = None
    return_weight_versions: bool = False
    # per-request media loading options (only with --trust-request-mm-kwargs); a thinking budget,
    # refused as vLLM refuses it without a reasoning parser
    media_io_kwargs: dict[str, dict[str, Any]] | None = None
    thinking_token_budget: Any = None


class ChatCompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/chat/completions``."""

    messages: list[dict[str, Any]]
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    echo: bool = False
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # the rendered prompt: special tokens added on top of the template's, RAG documents, the text returned
    add_special_tokens: bool = False
    documents: list[dict[str, str]] | None = None
    return_prompt_text: bool | None = None
    # tools and reasoning (serve/tool_parsers, serve/reasoning)
    tools: list[ChatCompletionToolsParam] | None = None
    tool_choice: str | ChatCompletionNamedToolChoiceParam | UnsetType | None = UNSET
    parallel_tool_calls: bool | None = True
    include_reasoning: bool = True
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"] | None = None


COMPLETION_MAX_TOKENS = 16
"""A completion's ``max_tokens`` when the request leaves it out or sends null, as in vLLM."""


class CompletionRequest(_SamplingFields, kw_only=True):
    """``POST /v1/completions`` (text or token-id prompts)."""

    prompt: str | list[Any] | None = None
    max_tokens: int | None = COMPLETION_MAX_TOKENS
    logprobs: int | None = None
    echo: bool | None = False
    suffix: str | None = None
    add_special_tokens: bool = True
    # refused while not set to vLLM's default (NOT_SUPPORTED says why)
    prompt_embeds: Any = None

    def __post_init__(self) -> None:
        if self.max_tokens is None:  # vLLM's model reads a null max_tokens as its default
            self.max_tokens = COMPLETION_MAX_TOKENS


def named_tool(request: ChatCompletionRequest) -> str | None:
    """The function a named ``tool_choice`` forces, if it names one."""
    choice = request.tool_choice
    return choice.function["name"] if isinstance(choice, ChatCompletionNamedToolChoiceParam) else None


def template_kwargs(request: ChatCompletionRequest,
                    effort_map: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The chat template's variables (and the reasoning parser's view of them): the request's
    ``chat_template_kwargs``, with ``reasoning_effort`` (rewritten by ``--reasoning-effort-map``)
    and, unless the request set it, ``enable_thinking`` (off for effort ``"none"``), as vLLM's
    ``build_chat_params`` adds them."""
    given = request.chat_template_kwargs
    if request.documents is not None:  # vLLM's: the request's documents win over chat_template_kwargs'
        given = {**(given or {}), "documents": request.documents}
    effort: str | None = request.reasoning_effort
    if effort is not None and effort_map:
        effort = effort_map.get(effort, effort)
    if effort is None:
        return given
    merged = {**(given or {}), "reasoning_effort": effort}
    if "enable_thinking" not in (given or {}):
        merged["enable_thinking"] = effort != "none"
    return merged


def template_tools(request: ChatCompletionRequest, exclude_when_none: bool) -> list[dict[str, Any]] | None:
    """The tools as the chat template gets them (``--exclude-tools-when-tool-choice-none``)."""
    if request.tools is None or (request.tool_choice == "none" and exclude_when_none):
        return None
    return [msgspec.to_builtins(tool) for tool in request.tools]


def prompts(request: CompletionRequest) -> list[str | list[int]]:
    """The completion's prompts: a string, a list of strings (empty ones too), token ids, or lists
    of token ids; a list of one kind, as vLLM's request model takes them."""
    prompt = request.prompt
    if not prompt:
        return []
    if isinstance(prompt, str):
        return [prompt]
    if all(_token_id(p) for p in prompt):
        return [list(prompt)]
    if all(isinstance(p, str) for p in prompt):
        return list(prompt)
    if all(isinstance(p, list) and all(_token_id(t) for t in p) for p in prompt):
        return [list(p) for p in prompt]  # an empty one is refused as an empty prompt, later
    raise RequestBodyError("prompt must be a string, a list of strings, a list of token ids, or a list of lists of "
                           "token ids, one kind in a list.", parameter="body.prompt")


def _token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def echoes_prompt_only(request: CompletionRequest) -> bool:
    """``echo`` with ``max_tokens`` 0: the answer is the prompt (the engine still makes one token)."""
    return bool(request.echo) and request.max_tokens == 0


def include_usage(request: _SamplingFields) -> bool:
    """Whether a stream ends with a usage chunk (vLLM's ``stream_options`` rules)."""
    return bool(request.stream_options is not None and request.stream_options.include_usage)


def continuous_usage(request: _SamplingFields) -> bool:
    """Whether every chunk carries the usage so far (``stream_options.continuous_usage_stats``)."""
    options = request.stream_options
    return bool(options is not None and options.include_usage and options.continuous_usage_stats)


__all__ = [
    "MAX_STOP_STRINGS",
    "ChatCompletionNamedToolChoiceParam",
    "ChatCompletionRequest",
    "ChatCompletionToolsParam",
    "CompletionRequest",
    "Int64",
    "JsonSchemaResponseFormat",
    "LegacyStructuralTag",
    "ResponseFormat",
    "StreamOptions",
    "continuous_usage",
    "echoes_prompt_only",
    "include_usage",
    "named_tool",
    "prompts",
    "template_kwargs",
    "template_tools",
]
