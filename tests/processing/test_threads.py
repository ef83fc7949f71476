"""The thread budget's division."""

from __future__ import annotations

import pytest

from mmfront import MultiModalConfig
from mmfront.processing.threads import ThreadPlan


@pytest.mark.parametrize(("lanes", "budget", "want"), [
    (None, 4, ThreadPlan(budget=4, lanes=3, torch_threads=1, decode_threads=1)),
    (None, 1, ThreadPlan(budget=1, lanes=1, torch_threads=1, decode_threads=1)),
    (0, 4, ThreadPlan(budget=4, lanes=0, torch_threads=1, decode_threads=4)),
    (2, 8, ThreadPlan(budget=8, lanes=2, torch_threads=1, decode_threads=6)),
])
def test_the_thread_plan_divides_the_budget(lanes: int | None, budget: int, want: ThreadPlan) -> None:
    assert ThreadPlan.from_config(MultiModalConfig(mm_processing_lanes=lanes, mm_thread_budget=budget)) == want
