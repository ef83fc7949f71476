"""Request logs under ``vllm serve``'s ``--enable-log-requests`` and ``--max-log-len``: each
request's id and sampling parameters at INFO, its prompt (cut to ``--max-log-len``) at DEBUG,
in vLLM's words, so log searches written for vLLM keep working."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger("mmfront.serve.requests")


class RequestLogger:
    """Logs what each request asks for (one per server)."""

    def __init__(self, max_log_len: int | None) -> None:
        self.max_log_len = max_log_len

    def log_inputs(self, request_id: str, prompt: str | None, prompt_token_ids: Sequence[int] | None,
                   params: Any) -> None:
        """vLLM's ``RequestLogger.log_inputs``: the prompt at DEBUG, the parameters at INFO."""
        if logger.isEnabledFor(logging.DEBUG):
            limit = self.max_log_len
            shown_prompt = prompt if prompt is None or limit is None else prompt[:limit]
            shown_ids = None if prompt_token_ids is None else list(
                prompt_token_ids if limit is None else prompt_token_ids[:limit])
            logger.debug("Request %s details: prompt: %r, prompt_token_ids: %s, prompt_embeds shape: %s.",
                         request_id, shown_prompt, shown_ids, None)
        logger.info("Received request %s: params: %s, lora_request: %s.", request_id, params, None)

    def log_tokenize(self, request_id: str, request: Any) -> None:
        """A ``/tokenize`` request: its prompt (a chat's messages are rendered later), no parameters."""
        self.log_inputs(request_id, getattr(request, "prompt", None), None, None)


__all__ = ["RequestLogger", "logger"]
