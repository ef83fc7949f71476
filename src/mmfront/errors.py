"""Every error mmfront raises on purpose, as one tree.

Serving code catches :class:`MMFrontError` for "mmfront said no", and :class:`ValidationError`
for "the request is at fault" (HTTP 4xx): that one root holds every request error and each
carries ``parameter``, the request field at fault (``None`` where no single field is), like
vLLM's ``VLLMValidationError``. Errors also derive from the builtin a vLLM user would catch for
the same situation, drawn in brackets, so code written against vLLM keeps working; a request
error about a Python type is therefore both a ``ValueError`` and a ``TypeError``. Each message
says what to do about it. This module imports nothing from mmfront, so every layer may raise.

Each class also carries how an OpenAI API server answers it, ``http_status`` and ``error_type``
(vLLM's status and error ``type`` for the same situation), set only where it differs from its
base's: an error's answer is found along its class's bases, as Python finds any class
attribute, and ``mmfront serve`` reads nothing else, for the request's errors and for those an
engine reports alike. docs/troubleshooting.md is the table of them; ``tests/test_errors.py``
checks it against the classes.

The tree (``tests/test_errors.py`` checks it against the classes)::

    MMFrontError
    ├── ConfigError [ValueError]
    │   └── ModelFilesNotFoundError
    ├── UnsupportedModelError [ValueError]
    │   └── MissingOffsetsError
    ├── FieldConfigError [ValueError]
    ├── ValidationError [ValueError]
    │   ├── RequestBodyError
    │   │   └── BodyTooLargeError
    │   ├── ModelNotFoundError
    │   ├── InputTypeError [TypeError]
    │   │   └── HashingTypeError
    │   ├── UnsupportedModalityError
    │   ├── ChatFormatError
    │   ├── PromptUpdateError
    │   ├── ProcessorError
    │   └── MediaError
    │       ├── MediaDecodeError
    │       │   └── MediaEncodingNotSupportedError
    │       ├── MediaFormatError
    │       ├── MediaTooLargeError
    │       ├── MediaPathError
    │       └── MediaFetchError
    │           └── MediaURLNotAllowedError
    ├── ModalityNotFoundError [KeyError]
    ├── MultiModalCacheMissError [RuntimeError]
    ├── CacheError [RuntimeError]
    ├── ResourceError [OSError]
    ├── AddressInUseError [OSError]
    ├── ShmHandleError [ValueError]
    ├── DecodeError [ValueError]
    │   └── UnknownUtilityError
    ├── EncodeError [TypeError]
    ├── TransportError [RuntimeError]
    │   ├── EngineDeadError
    │   └── HandshakeError
    ├── UtilityCallError [RuntimeError]
    ├── LaneError [RuntimeError]
    └── GenerationError [RuntimeError]
        └── RetryableRequestError

Above :class:`ValidationError` sit the deployment's faults (configuration, a model mmfront
cannot serve, a processor whose outputs break its own layout); below it, the request's; after
it, a lookup the calling code got wrong, the process running out of a resource, the cache
and wire errors between P0 and P1, and the failures an engine reports for one request.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Sequence


class MMFrontError(Exception):
    """Base class of every mmfront error: by default the server's fault, answered 500 as vLLM
    answers an error it did not expect."""

    http_status: int = 500
    """The HTTP status an API server answers with (vLLM's for the same situation)."""
    error_type: str = "InternalServerError"
    """The OpenAI error ``type`` of that answer."""
    parameter: str | None = None
    """The request field at fault (the answer's ``param``); only request errors name one."""


# --- the deployment's faults -------------------------------------------------------------------


class ConfigError(MMFrontError, ValueError):
    """A configuration value is invalid."""


class ModelFilesNotFoundError(ConfigError):
    """``MODEL`` (or ``--tokenizer``) is neither a local folder nor a hub repository found in the
    Hugging Face cache or, where the network is allowed, on the hub."""


class UnsupportedModelError(MMFrontError, ValueError):
    """No mmfront processor serves this HF processor or model type."""


class MissingOffsetsError(UnsupportedModelError):
    """A transformers >= 5.15 processor reported no ``text_replacement_offsets``."""


class FieldConfigError(MMFrontError, ValueError):
    """HF processor outputs do not fit the declared field layout (e.g. inconsistent batch sizes)."""


# --- the request's faults ----------------------------------------------------------------------


class ValidationError(MMFrontError, ValueError):
    """The root of every request error: the request is invalid. ``parameter`` names the request
    field at fault (as vLLM's ``VLLMValidationError`` does), so an API server can point the user
    at it; ``value`` is the offending value where it helps."""

    http_status = 400
    error_type = "BadRequestError"
    message_names_parameter: bool = True
    """Whether an API server's message ends with ``(parameter=..., value=...)``, as
    ``str(VLLMValidationError)`` does."""

    def __init__(self, message: str, *, parameter: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value

    def vllm_message(self) -> str:
        """The message as ``str(VLLMValidationError)`` writes it (with ``(parameter=..., value=...)``
        where :attr:`message_names_parameter`): what an API server answers, and what an mmfront
        engine sends in its ``RequestError``, so that the field travels with it."""
        message = str(self) or "Internal server error"
        if not self.message_names_parameter or self.parameter is None:
            return message
        return message + (f" (parameter={self.parameter})" if self.value is None
                          else f" (parameter={self.parameter}, value={self.value})")

    @classmethod
    def from_vllm_message(cls, message: str) -> ValidationError:
        """The error :meth:`vllm_message` wrote ``message`` for, its field and value read back
        (the value as text); a message without them is the error's message alone."""
        found = _NAMED_PARAMETER.fullmatch(message) if cls.message_names_parameter else None
        if found is None:
            return cls(message)
        error = cls(found["message"])
        error.parameter, error.value = found["parameter"], found["value"]
        return error


_NAMED_PARAMETER = re.compile(r"(?P<message>.*) \(parameter=(?P<parameter>[A-Za-z_][\w.\[\]]*)"
                              r"(?:, value=(?P<value>.*))?\)", re.DOTALL)


class RequestBodyError(ValidationError):
    """The body is not JSON, not sent as ``application/json``, or does not fit the request's
    schema (a required field missing, a wrong type): what FastAPI's ``RequestValidationError``
    is in vLLM, answered with type ``Bad Request`` and ``parameter`` ``body`` or
    ``body.<field>``."""

    error_type = "Bad Request"
    message_names_parameter = False


class BodyTooLargeError(RequestBodyError):
    """The body is larger than the server's ``max_body_bytes``; refused before it is read whole."""

    http_status = 413
    error_type = "Request Entity Too Large"


class ModelNotFoundError(ValidationError):
    """The request's ``model`` names no model the server serves (vLLM's ``VLLMNotFoundError``)."""

    http_status = 404
    error_type = "NotFoundError"
    message_names_parameter = False


class InputTypeError(ValidationError, TypeError):
    """An input has a Python type mmfront does not accept (still a ``TypeError``, as in vLLM)."""


class HashingTypeError(InputTypeError):
    """A value cannot be hashed deterministically (vLLM would fall back to pickle here)."""


class UnsupportedModalityError(ValidationError):
    """A multimodal data key is not a modality mmfront knows."""


class ChatFormatError(ValidationError):
    """A chat message or content part is malformed."""


class PromptUpdateError(ValidationError):
    """The prompt does not hold the placeholders the multimodal items need."""

    def __init__(
        self, message: str, *, modality: str | None = None, expected: int | None = None, found: int | None = None
    ) -> None:
        super().__init__(message, parameter=modality)
        self.modality = modality
        self.expected = expected
        self.found = found


class ProcessorError(ValidationError):
    """The HF processor raised while processing a request's items: the items or the processor
    kwargs of the request are what it could not handle."""


class MediaError(ValidationError):
    """Loading a media item failed. The request is at fault (HTTP 400, as vLLM answers media it
    cannot load; a failed fetch is 422)."""


class MediaDecodeError(MediaError):
    """The media bytes are not valid (bad base64, truncated or corrupt file)."""


class MediaEncodingNotSupportedError(MediaDecodeError):
    """A data URL whose payload is not base64 (percent-encoded text): vLLM answers it 501, as a
    feature it does not implement."""

    http_status = 501
    error_type = "NotImplementedError"


class MediaFormatError(MediaError):
    """The media format is not in the allowlist."""


class MediaTooLargeError(MediaError):
    """The media exceeds a size limit (bytes, pixels or the per-request decode budget)."""


class MediaPathError(MediaError):
    """A local file path is not allowed (outside the allowed root, or no root configured)."""


class MediaFetchError(MediaError):
    """Fetching media over http(s) failed or is not allowed: HTTP 422, vLLM's
    ``VLLMUnprocessableEntityError`` for a URL it cannot fetch.

    ``retryable`` is true for failures a client may retry (HTTP 5xx, 408, 429, timeouts); those
    are answered 500, as vLLM's server answers the transient fetch errors it passes through
    untyped (and as the ``openai`` client retries)."""

    http_status = 422
    error_type = "UnprocessableEntityError"

    def __init__(self, message: str, *, parameter: str | None = None, retryable: bool = False) -> None:
        super().__init__(message, parameter=parameter)
        self.retryable = retryable
        if retryable:
            self.http_status, self.error_type = MMFrontError.http_status, MMFrontError.error_type


class MediaURLNotAllowedError(MediaFetchError):
    """A media URL mmfront does not fetch: its host is not in ``--allowed-media-domains``, it is
    at a loopback, private, link-local or this server's own address that the flag does not name,
    or its scheme is none mmfront fetches. Refused before anything is sent, with HTTP 400, as
    vLLM answers a URL outside its allowed domains or schemes."""

    http_status = ValidationError.http_status
    error_type = ValidationError.error_type


# --- the calling code's lookups ----------------------------------------------------------------


class ModalityNotFoundError(MMFrontError, KeyError):
    """Code asked a per-modality container for a modality it does not hold. A ``KeyError``, so
    the container keeps the mapping protocol (``in``, ``.get``), as vLLM's does."""

    def __str__(self) -> str:
        # KeyError would print the message in quotes, as if it were the missing key itself.
        return str(self.args[0]) if self.args else ""


# --- caches and the wire between P0 and P1 -----------------------------------------------------


class MultiModalCacheMissError(MMFrontError, RuntimeError):
    """P1 has no entry for items P0 sent without data (P0/P1 cache drift).

    Carries *every* missing hash of the request, so P0 can invalidate all of them at once and
    resend the request with its data. ``retryable`` is true (answered 503, as vLLM answers its
    retryable cache miss)."""

    retryable = True
    http_status = 503
    error_type = "ServiceUnavailableError"

    def __init__(self, mm_hashes: Sequence[str], message: str | None = None) -> None:
        self.mm_hashes = list(mm_hashes)
        super().__init__(
            message
            or (
                f"Multi-modal processor cache miss for {len(self.mm_hashes)} item(s) "
                f"(P0/P1 cache drift): {self.mm_hashes}. The frontend invalidates these hashes "
                "and resends the request with its data."
            )
        )


class CacheError(MMFrontError, RuntimeError):
    """A processor-cache operation failed for a reason other than drift."""


class ResourceError(MMFrontError, OSError):
    """The process ran out of a resource (open files, memory, shared memory) while serving a
    request that is not at fault, so it is never typed as a request error. ``resource`` names
    what ran out, ``setting`` the limit to raise or the setting to lower. ``retryable`` is true:
    the same request may pass once the resource is free again (HTTP 503 in an API server).
    :func:`resource_error` makes one from the ``OSError`` or ``MemoryError`` behind a failure."""

    retryable = True
    http_status = 503
    error_type = "ServiceUnavailableError"

    def __init__(self, message: str, *, resource: str = "", setting: str = "") -> None:
        super().__init__(message)
        self.resource = resource
        self.setting = setting


_OPEN_FILES = ("open files", "the process's open-file limit (ulimit -n, RLIMIT_NOFILE)")
_MEMORY = ("memory", "the memory the process may use (its container's limit), or lower "
           "max_media_request_decode_bytes and mm_processor_cache_gb")
_RESOURCES = {
    errno.EMFILE: _OPEN_FILES,
    errno.ENFILE: ("open files", "the system's open-file limit (sysctl fs.file-max)"),
    errno.ENOMEM: _MEMORY,
    errno.ENOSPC: ("shared memory", "the size of /dev/shm (docker run --shm-size) and the memory limit, or lower "
                                    "mm_processor_cache_gb"),
}


def resource_error(exc: BaseException, *, doing: str) -> ResourceError | None:
    """``exc`` as a :class:`ResourceError` when it, or an exception it was raised from, is the
    process running out of open files, memory or shared memory; ``None`` otherwise. ``doing``
    says what failed ("Reading the local file x"). Catch-alls that turn a failure into a request
    error ask this first, so a legitimate request is never blamed for the process's limits."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ResourceError):
            return cause
        if isinstance(cause, MemoryError):
            found: tuple[str, str] | None = _MEMORY
        elif isinstance(cause, OSError):
            found = _RESOURCES.get(cause.errno or 0)
        else:
            found = None
        if found is not None:
            resource, setting = found
            reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else type(cause).__name__
            return ResourceError(f"{doing} failed: the process is out of {resource} ({reason}). The request is not "
                                 f"at fault: retry it, or raise {setting}.", resource=resource, setting=setting)
        cause = cause.__cause__ or cause.__context__
    return None


class AddressInUseError(MMFrontError, OSError):
    """The server's HTTP address (``--host``:``--port``) is taken by another socket: found before
    any engine starts, so nothing is left to stop."""


class ShmHandleError(MMFrontError, ValueError):
    """A shared-memory handle is forged, stale, or points at data that has been overwritten."""


class DecodeError(MMFrontError, ValueError):
    """Wire bytes could not be decoded: truncated, malformed, or inconsistent."""


class UnknownUtilityError(DecodeError):
    """A utility call names a method the engine does not have. ``call_id`` is the call's, so the
    engine answers that call with a failure instead of leaving its caller waiting."""

    def __init__(self, message: str, *, call_id: int = -1) -> None:
        super().__init__(message)
        self.call_id = call_id


class EncodeError(MMFrontError, TypeError):
    """An object cannot be encoded for the wire (mmfront never falls back to pickle)."""


class TransportError(MMFrontError, RuntimeError):
    """The frontend/engine transport failed (peer gone, timeout): answered 503, the engine may be
    reachable again."""

    http_status = 503
    error_type = "ServiceUnavailableError"


class EngineDeadError(TransportError):
    """The engine stopped answering, or restarted after the request had produced output: the
    request cannot finish. ``retryable`` is true: send it again (vLLM's ``EngineDeadError``,
    which vLLM's server answers 500)."""

    retryable = True
    http_status = 500
    error_type = "InternalServerError"


class HandshakeError(TransportError):
    """An engine's start-up handshake failed: a peer that is not an expected engine rank, one
    whose greeting does not fit the configuration, or a rank that never came within the wait."""


class UtilityCallError(MMFrontError, RuntimeError):
    """The engine ran a utility call and it failed: the message is the engine's
    ``failure_message`` (vLLM raises it as a plain ``Exception``). ``method`` names the call."""

    def __init__(self, message: str, *, method: str = "") -> None:
        super().__init__(message)
        self.method = method


class LaneError(MMFrontError, RuntimeError):
    """A processing lane (a worker process or a Ray actor) died, could not start, or was closed
    while it held an item: the request is not at fault. ``retryable`` is true: the lane restarts,
    so sending the request again processes it."""

    retryable = True
    http_status = 503
    error_type = "ServiceUnavailableError"


# --- what an engine reports for one request ----------------------------------------------------


class GenerationError(MMFrontError, RuntimeError):
    """The engine failed one request for a reason of its own (vLLM's ``GenerationError``): the
    other requests carry on, and the request is not at fault."""


class RetryableRequestError(GenerationError):
    """The engine failed one request for a transient reason: sending it again may pass (vLLM's
    ``RetryableRequestError``, answered 503)."""

    retryable = True
    http_status = 503
    error_type = "ServiceUnavailableError"
