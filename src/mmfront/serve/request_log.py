"""Request logs under ``vllm serve``'s ``--enable-log-requests`` and ``--max-log-len``: each
request's id and sampling parameters at INFO, its prompt (cut to ``--max-log-len``) at DEBUG;
with ``--enable-log-outputs`` each response's text and finish reason at INFO and its token ids at
DEBUG (a stream's deltas, unless ``--disable-log-deltas``, then its whole text); in vLLM's words,
so log searches written for vLLM keep working."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from mmfront.serve.responses import ChatMessage

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

    def log_outputs(self, request_id: str, outputs: str, output_token_ids: Sequence[int] | None,
                    finish_reason: str | None = None, *, is_streaming: bool = False, delta: bool = False) -> None:
        """vLLM's ``RequestLogger.log_outputs``."""
        limit = self.max_log_len
        if limit is not None:
            outputs = outputs[:limit]
        stream_info = (" (streaming delta)" if delta else " (streaming complete)") if is_streaming else ""
        if logger.isEnabledFor(logging.DEBUG):
            shown_ids = None if output_token_ids is None else list(output_token_ids)[:limit]
            logger.debug("Generated response %s%s details: output_token_ids: %s", request_id, stream_info, shown_ids)
        logger.info("Generated response %s%s: output: %r, finish_reason: %s", request_id, stream_info, outputs,
                    finish_reason)

    def log_tokenize(self, request_id: str, request: Any) -> None:
        """A ``/tokenize`` request: its prompt (a chat's messages are rendered later), no parameters."""
        self.log_inputs(request_id, getattr(request, "prompt", None), None, None)


def logged_message(message: ChatMessage) -> str:
    """What vLLM logs of an answer's message: its content, else its tool calls as ``name(arguments)``."""
    if message.content:
        return message.content
    if message.tool_calls:
        return f"[tool_calls: {', '.join(f'{c.function.name}({c.function.arguments})' for c in message.tool_calls)}]"
    return ""


__all__ = ["RequestLogger", "logged_message", "logger"]
