"""``--reasoning-parser NAME``: reasoning split off the content of an answer, by vLLM's names."""

from __future__ import annotations

from mmfront.serve.reasoning.base import ReasoningDelta, ReasoningParser, ReasoningStream
from mmfront.serve.reasoning.deepseek_r1 import DeepSeekR1ReasoningParser
from mmfront.serve.reasoning.qwen3 import Qwen3ReasoningParser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
}
"""The ``--reasoning-parser`` names mmfront knows."""

__all__ = ["REASONING_PARSERS", "ReasoningDelta", "ReasoningParser", "ReasoningStream"]
