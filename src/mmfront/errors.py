"""Every error mmfront raises on purpose, as one tree.

Serving code catches :class:`MMFrontError` for "mmfront said no", and :class:`ValidationError`
for "the request is at fault" (HTTP 400/422): that one root holds every request error and each
carries ``parameter``, the request field at fault (``None`` where no single field is), like
vLLM's ``VLLMValidationError``. Errors also derive from the builtin a vLLM user would catch for
the same situation, drawn in brackets, so code written against vLLM keeps working; a request
error about a Python type is therefore both a ``ValueError`` and a ``TypeError``. Each message
says what to do about it. This module imports nothing from mmfront, so every layer may raise.

The tree (``tests/test_errors.py`` checks it against the classes)::

    MMFrontError
    ├── ConfigError [ValueError]
    ├── UnsupportedModelError [ValueError]
    │   └── MissingOffsetsError
    ├── FieldConfigError [ValueError]
    ├── ValidationError [ValueError]
    │   ├── InputTypeError [TypeError]
    │   │   └── HashingTypeError
    │   ├── UnsupportedModalityError
    │   ├── ChatFormatError
    │   ├── PromptUpdateError
    │   ├── ProcessorError
    │   └── MediaError
    │       ├── MediaDecodeError
    │       ├── MediaFormatError
    │       ├── MediaTooLargeError
    │       ├── MediaPathError
    │       └── MediaFetchError
    ├── ModalityNotFoundError [KeyError]
    ├── MultiModalCacheMissError [RuntimeError]
    ├── CacheError [RuntimeError]
    ├── ShmHandleError [ValueError]
    ├── DecodeError [ValueError]
    │   └── UnknownUtilityError
    ├── EncodeError [TypeError]
    ├── TransportError [RuntimeError]
    │   ├── EngineDeadError
    │   └── HandshakeError
    ├── UtilityCallError [RuntimeError]
    ├── LaneError [RuntimeError]
    └── ResourceExhaustedError [OSError]

Above :class:`ValidationError` sit the deployment's faults (configuration, a model mmfront
cannot serve, a processor whose outputs break its own layout); below it, the request's; after
it, a lookup the calling code got wrong and the cache and wire errors between P0 and P1.
"""

from __future__ import annotations

from collections.abc import Sequence


class MMFrontError(Exception):
    """Base class of every mmfront error."""


# --- the deployment's faults -------------------------------------------------------------------


class ConfigError(MMFrontError, ValueError):
    """A configuration value is invalid."""


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

    def __init__(self, message: str, *, parameter: str | None = None, value: object = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value


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
    """Loading a media item failed. The request is at fault (HTTP 422 in an API server)."""


class MediaDecodeError(MediaError):
    """The media bytes are not valid (bad base64, truncated or corrupt file)."""


class MediaFormatError(MediaError):
    """The media format is not in the allowlist."""


class MediaTooLargeError(MediaError):
    """The media exceeds a size limit (bytes, pixels or the per-request decode budget)."""


class MediaPathError(MediaError):
    """A local file path is not allowed (outside the allowed root, or no root configured)."""


class MediaFetchError(MediaError):
    """Fetching media over http(s) failed or is not allowed.

    ``retryable`` is true for failures a client may retry (HTTP 5xx, 408, 429, timeouts)."""

    def __init__(self, message: str, *, parameter: str | None = None, retryable: bool = False) -> None:
        super().__init__(message, parameter=parameter)
        self.retryable = retryable


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
    resend the request with its data."""

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
    """The frontend/engine transport failed (peer gone, timeout)."""


class EngineDeadError(TransportError):
    """The engine stopped answering, or restarted after the request had produced output: the
    request cannot finish. ``retryable`` is true: send it again (vLLM's ``EngineDeadError``)."""

    retryable = True


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


class ResourceExhaustedError(MMFrontError, OSError):
    """The process ran out of an operating-system resource (file descriptors, memory for a
    mapping): the message names it and the limit to raise; the input is not at fault."""

