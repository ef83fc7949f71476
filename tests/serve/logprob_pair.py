"""``vllm serve`` and ``mmfront serve`` in front of stock vLLM engines whose executor returns
logprobs (``../shared/peer/logprob_stub.py``: sample and prompt logprobs laid out as vLLM's GPU
runner sends them), for the ported logprob cases of vLLM's OpenAI server tests; and what a
stream says about its tokens, logprobs and token ids, whatever chunks its text was cut into.

The stub's generated token k is 1000 + k (text only); at a generated position the candidates are
the sampled token then ``sampled + j - 1`` with logprob ``-0.1 * j``, at a prompt position the next
prompt token then ``next + j - 1`` with logprob ``-0.2 * j``."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from test_vllm_serve_parity import PEER, Answer, Pair, Side, masked, start_side, wait_healthy

LOGPROB_ENGINE = ["--distributed-executor-backend", "logprob_stub.LogprobStubExecutor"]


def start_pair(folder: Any, server_args: Sequence[str] = ()) -> Iterator[Pair]:
    """Both servers with ``server_args`` (each its own logprob engine), healthy; stopped after."""
    assert PEER is not None
    sides: list[Side] = []
    try:
        sides.append(start_side("vllm", [str(PEER.parent / "vllm")], {}, folder, engine_args=LOGPROB_ENGINE,
                                server_args=server_args))
        mmfront_env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "VLLM_TARGET_DEVICE": "cpu"}
        sides.append(start_side("mmfront", [sys.executable, "-m", "mmfront.cli"], mmfront_env, folder,
                                engine_args=LOGPROB_ENGINE, server_args=server_args))
        wait_healthy(sides)
        yield Pair(*sides)
    finally:
        for side in sides:
            side.stop()


@dataclass
class StreamedChoice:
    """One choice of a stream, its chunks joined."""

    text: str = ""
    chunks_with_prompt_ids: int = 0
    prompt_token_ids: Any = None
    token_ids: list[int] = field(default_factory=list)
    chat_logprobs: list[Any] = field(default_factory=list)
    completion_logprobs: dict[str, list[Any]] = field(default_factory=dict)
    finish_reason: str | None = None


def streamed(answer: Answer) -> tuple[dict[int, StreamedChoice], list[Any]]:
    """Each choice of a stream, and its usage chunks."""
    assert answer.status == 200, answer.text
    events = [e for e in answer.text.split("\n\n") if e.strip()]
    assert events and events[-1] == "data: [DONE]", answer.text
    choices: dict[int, StreamedChoice] = {}
    usage = []
    for event in events[:-1]:
        chunk = masked(json.loads(event.removeprefix("data: ")))
        assert "error" not in chunk, answer.text
        if "prompt_token_ids" in chunk and chunk["prompt_token_ids"] is not None:
            index = chunk["choices"][0]["index"]
            choices.setdefault(index, StreamedChoice()).prompt_token_ids = chunk["prompt_token_ids"]
            choices[index].chunks_with_prompt_ids += 1
        if not chunk["choices"]:
            usage.append(chunk)
            continue
        [choice] = chunk["choices"]
        out = choices.setdefault(choice["index"], StreamedChoice())
        out.text += choice.get("delta", choice).get("content" if "delta" in choice else "text") or ""
        if choice.get("prompt_token_ids") is not None:
            out.prompt_token_ids = choice["prompt_token_ids"]
            out.chunks_with_prompt_ids += 1
        out.token_ids += choice.get("token_ids") or []
        logprobs = choice.get("logprobs")
        if logprobs is not None and "content" in logprobs:
            out.chat_logprobs += logprobs["content"] or []
        elif logprobs is not None:
            for key, values in logprobs.items():
                out.completion_logprobs.setdefault(key, []).extend(values)
        out.finish_reason = choice.get("finish_reason") or out.finish_reason
    return choices, usage


__all__ = ["LOGPROB_ENGINE", "StreamedChoice", "start_pair", "streamed"]
