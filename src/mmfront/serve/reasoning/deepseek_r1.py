"""``deepseek_r1``: ``<think>...</think>``; DeepSeek R1's template opens the block, so an
output without markers is all reasoning."""

from __future__ import annotations

from mmfront.serve.reasoning.base import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
