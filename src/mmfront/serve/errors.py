"""Errors as ``vllm serve`` answers them: ``{"error": {message, type, param, code}}``.

An error's status and ``type`` are its class's (``http_status`` and ``error_type`` in
:mod:`mmfront.errors`, found along the class's bases); ``param`` is its ``parameter``. The same
classes answer the errors an engine reports for one request (:func:`engine_error`), so a status
has one home whichever side raised. An exception that is no :class:`~mmfront.errors.MMFrontError`
is a bug: it is logged and answered 500, as vLLM answers what it did not expect.
"""

from __future__ import annotations

import logging

import msgspec

from mmfront.errors import GenerationError, MMFrontError, RetryableRequestError, ValidationError
from mmfront.wire.structs import EngineCoreOutput

logger = logging.getLogger(__name__)


class ErrorInfo(msgspec.Struct):
    message: str
    type: str
    param: str | None
    code: int


class ErrorResponse(msgspec.Struct):
    """vLLM's error body."""

    error: ErrorInfo

VLLM_VALIDATION_CODE = "validation_error"
"""The ``code`` vLLM's engine gives a request it refused as invalid (``RequestError``)."""
BODY_PARAM = "body"
"""The ``param`` of an error in the body's shape (JSON, a missing field, a wrong type), or its
prefix (``body.messages``): a :class:`~mmfront.errors.RequestBodyError`, type ``Bad Request``."""


MAX_ERROR_MESSAGE_CHARS = 1024
"""Longest error ``message`` an answer carries: a message that quotes a request's input (an
unknown model name, out-of-vocabulary ids, a bad word list) keeps its head and its tail (where
vLLM's ``(parameter=..., value=...)`` and the valid choices are), and says how much it left out."""
MAX_ERROR_PARAM_CHARS = 256
"""Longest ``param``: a field path may hold a request's own keys (``body.logit_bias.<key>``)."""


def shortened(text: str, limit: int) -> str:
    """``text`` if it fits ``limit``, else its head and tail around a note of what was left out."""
    if len(text) <= limit:
        return text
    note = f" ...[{len(text) - limit} characters omitted]... "
    head = (limit - len(note)) * 3 // 4
    return text[:head] + note + text[len(text) - (limit - len(note) - head):]


def error_info(exc: BaseException) -> ErrorInfo:
    """``exc`` as vLLM's ``ErrorInfo``: the status and ``type`` of its class, its ``parameter``;
    message and parameter bounded (:data:`MAX_ERROR_MESSAGE_CHARS`), whatever input they quote."""
    if not isinstance(exc, MMFrontError):
        logger.exception("Unexpected error while serving a request", exc_info=exc)
        return ErrorInfo(shortened(str(exc) or "Internal server error", MAX_ERROR_MESSAGE_CHARS),
                         MMFrontError.error_type, None, MMFrontError.http_status)
    message = exc.vllm_message() if isinstance(exc, ValidationError) else str(exc) or "Internal server error"
    param = None if exc.parameter is None else shortened(exc.parameter, MAX_ERROR_PARAM_CHARS)
    return ErrorInfo(shortened(message, MAX_ERROR_MESSAGE_CHARS), exc.error_type, param, exc.http_status)


def error_body(exc: BaseException) -> ErrorResponse:
    return ErrorResponse(error_info(exc))


def _error_classes(root: type[MMFrontError] = MMFrontError) -> dict[str, type[MMFrontError]]:
    found = {root.__name__: root}
    for sub in root.__subclasses__():
        found.update(_error_classes(sub))
    return found


def engine_error(output: EngineCoreOutput) -> MMFrontError:
    """The error an engine's ``FinishReason.ERROR`` output stands for. mmfront's engine names the
    class of what it raised and vLLM's names ``validation_error`` for an invalid request: those
    are the request's fault, raised as that class (mmfront's with the field its message names,
    :meth:`~mmfront.errors.ValidationError.from_vllm_message`; vLLM's API server reads no field
    from its engine's, and neither does this one). Anything else is the engine's: a
    :class:`~mmfront.errors.RetryableRequestError` where the engine says a retry may pass (or
    names a retryable class), else a :class:`~mmfront.errors.GenerationError`, as vLLM's
    ``RequestError.to_exception`` does."""
    error = output.error
    if error is None:
        return GenerationError("The engine failed the request: Internal server error")
    if error.code == VLLM_VALIDATION_CODE:
        return ValidationError(error.message)
    named = _error_classes().get(error.code)
    if named is not None and issubclass(named, ValidationError):
        return named.from_vllm_message(error.message)
    retryable = error.retryable or bool(getattr(named, "retryable", False))
    return (RetryableRequestError if retryable else GenerationError)(f"The engine failed the request: {error.message}")


__all__ = ["BODY_PARAM", "MAX_ERROR_MESSAGE_CHARS", "MAX_ERROR_PARAM_CHARS", "VLLM_VALIDATION_CODE", "ErrorInfo",
           "ErrorResponse", "engine_error", "error_body", "error_info", "shortened"]
