"""What the HTTP layer of ``mmfront serve`` is configured with, in ``vllm serve``'s terms.

The command line (``mmfront serve``'s flags, vLLM's names) fills one :class:`ServeSettings`;
the app (:func:`mmfront.serve.app.create_app`) and the launcher that starts the engines read it,
so a flag has one home.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DEFAULT_MAX_BODY_BYTES = 64 << 20
"""Request bodies above this are refused before they are read whole (413)."""


@dataclass(frozen=True)
class ServeSettings:
    """The HTTP side of one ``mmfront serve`` (engine flags live in ``MultiModalConfig`` and
    ``DataParallelConfig``)."""

    model: Path
    """The model folder (``vllm serve MODEL``)."""
    served_model_name: tuple[str, ...] = ()
    """Names clients may send as ``model``; the first is the one reported (empty: ``model``'s path,
    as vLLM)."""
    host: str = "0.0.0.0"
    port: int = 8000
    api_key: str | None = None
    """With a key, every ``/v1`` request needs ``Authorization: Bearer KEY`` (else 401)."""
    max_model_len: int | None = None
    """Caps the engines' own ``max_model_len`` (vLLM's ``--max-model-len``)."""
    max_logprobs: int = 20
    """Most logprobs a request may ask for per token (vLLM's ``--max-logprobs``; -1: the vocabulary)."""
    chat_template: str | None = None
    """A Jinja template (its text, or a file's path) in place of the model's own."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    uvicorn_log_level: str = "info"
    api_server_count: int = 1

    @property
    def model_names(self) -> tuple[str, ...]:
        """The names ``model`` may take; the first is reported in responses and ``/v1/models``."""
        return self.served_model_name or (str(self.model),)


__all__ = ["DEFAULT_MAX_BODY_BYTES", "ServeSettings"]
