"""The context-length rule: a request's prompt and output must fit the model's context
(``max_model_len``), said the way vLLM 0.33's API server says it.

One home, so the three places that know a request's length refuse it alike: the
``InputProcessor`` (with ``MultiModalConfig.max_model_len``), the engine client (with the
engines' context length, before anything is committed or sent) and ``mmfront serve`` (which also
takes the output budget this rule gives). vLLM's server answers in three places too, each with
its own words, and this rule keeps each of them for its case (recorded from ``vllm serve``
0.33, ``tests/serve/test_context_length.py``):

* ``max_tokens`` (or ``max_completion_tokens``) above the context: ``TokenizeParams``'
  "``max_tokens=X cannot be greater than max_model_len=M``", before the prompt is looked at;
* a prompt longer than the context: the renderer's "This model's maximum context length is M
  tokens. However, your prompt contains N input tokens, ..." (``parameter`` ``input_tokens``).
  mmfront counts the prompt once its multimodal placeholders are expanded, and says this for
  every prompt over the context; vLLM says it for the text tokens, and words a prompt that only
  its images push over the context its own way (``get_max_tokens``' "Input length (N) exceeds
  model's maximum context length (M).", no ``parameter``);
* a prompt exactly as long as the context: no output token fits, so the budget
  ``get_max_tokens`` computes is 0 and vLLM's ``SamplingParams`` refuses it ("max_tokens must be
  at least 1, got 0.").

A prompt and ``max_tokens`` that fit alone but not together are not refused: vLLM's server cuts
``max_tokens`` to what the prompt leaves (:func:`get_max_tokens` returns that), and an engine stops
a request when it reaches the context (``finish_reason`` ``"length"``).
"""

from __future__ import annotations

from mmfront.errors import ValidationError


def get_max_tokens(
    max_model_len: int | None, max_tokens: int | None, input_length: int, *, max_tokens_param: str = "max_tokens",
) -> int | None:
    """The output budget of a request with ``input_length`` prompt tokens (vLLM's
    ``get_max_tokens``): ``max_tokens`` cut to the room the prompt leaves in ``max_model_len``, or
    all of that room when ``max_tokens`` is ``None``. ``max_model_len`` ``None`` (unknown) checks
    nothing and returns ``max_tokens``. Raises :class:`~mmfront.errors.ValidationError` where the
    request cannot fit (see the module docstring); ``max_tokens_param`` is the request field that
    asked for ``max_tokens`` (``max_completion_tokens`` for a chat request that used it)."""
    if max_model_len is None:
        return max_tokens
    if max_tokens is not None and max_tokens > max_model_len:
        raise ValidationError(f"{max_tokens_param}={max_tokens} cannot be greater than max_model_len={max_model_len}. "
                              "Please request fewer output tokens.", parameter=max_tokens_param, value=max_tokens)
    if input_length > max_model_len:
        raise ValidationError(f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
                              f"contains {input_length} input tokens, which exceeds this limit even without any output "
                              "tokens. Please reduce the length of the input prompt.",
                              parameter="input_tokens", value=input_length)
    room = max_model_len - input_length
    if room == 0:
        raise ValidationError("max_tokens must be at least 1, got 0.", parameter="max_tokens", value=0)
    return room if max_tokens is None else min(max_tokens, room)


def check_context_length(max_model_len: int | None, max_tokens: int | None, input_length: int) -> None:
    """Refuse a request that :func:`get_max_tokens` refuses; one whose ``max_tokens`` only
    overruns the room its prompt leaves is left to the engine, which stops it at the context."""
    get_max_tokens(max_model_len, max_tokens, input_length)
