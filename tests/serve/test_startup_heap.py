"""``mmfront serve`` freezes its start-up heap before it serves, as vLLM's server does
(``freeze_gc_heap``): what start-up left is collected first, and what lives is frozen, so full
collections while requests wait no longer walk it."""

from __future__ import annotations

import subprocess
import sys

FREEZE = """
import gc, weakref
from mmfront.serve.launcher import freeze_startup_heap

class Node:
    pass

kept = [Node() for _ in range(2000)]
cycle = Node(); cycle.me = cycle
gone = weakref.ref(cycle)
del cycle
gc.disable()  # only the freeze's own collections may collect the cycle
assert gone() is not None and gc.get_freeze_count() == 0
freeze_startup_heap()
print(gone() is None, gc.get_freeze_count() >= len(kept), any(o is kept for o in gc.get_objects()))
"""


def test_the_startup_heap_is_collected_then_frozen_as_vllm_freezes_it() -> None:
    out = subprocess.run([sys.executable, "-c", FREEZE], capture_output=True, text=True, timeout=120, check=True)
    # the cycle start-up left was collected, what lives is frozen (no longer walked by the collector)
    assert out.stdout.split() == ["True", "True", "False"], out
