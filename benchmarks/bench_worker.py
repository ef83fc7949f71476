"""The worker on the demo workload (CPU): ``mmfront demo --json`` end to end, that is chat requests
with 1-3 PNG/JPEG data-URL images (40% of them repeated) through the async client over ZMQ into
``mmfront worker`` running the embedded Gemma 3 (real processor sizes, small random weights), 8
requests in flight, 8 tokens each.

Reported, without targets: the engine's encoder cache hit rate (a repeated image reuses its
vision-tower output), generated tokens/s and requests/s over the run's wall time, and the P0
cache hit rate. The demo's own checks (every request answered once, a sample equal to
transformers' ``generate``) must hold, or the benchmark fails: a fast wrong answer is no number.
It runs as a subprocess, as a user would run it: ``mmfront demo --json --num-requests N``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from _harness import Report

GROUP = "worker gemma3-896 (CPU)"


def run_demo_json(num_requests: int) -> dict[str, Any]:
    """``mmfront demo --json``'s summary (the JSON object that ends its output)."""
    cmd = [sys.executable, "-m", "mmfront.cli", "demo", "--json", "--num-requests", str(num_requests)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=1800)
    lines = done.stdout.splitlines()
    starts = [n for n, line in enumerate(lines) if line.startswith("{")]
    try:
        summary: dict[str, Any] = json.loads("\n".join(lines[starts[-1]:]))
    except (IndexError, ValueError):
        raise RuntimeError(f"mmfront demo exited with {done.returncode} and no JSON summary: "
                           f"{done.stderr.strip().splitlines()[-3:]}") from None
    failed = [name for name, ok in summary["checks"].items() if not ok]
    if done.returncode != 0 or failed:
        raise RuntimeError(f"mmfront demo failed its checks {failed} (exit {done.returncode})")
    return summary


def run(report: Report, quick: bool) -> None:
    summary = run_demo_json(24 if quick else 60)
    wall_s = summary["requests"] / summary["requests_per_s"]
    report.add(GROUP, f"{summary['requests']} demo requests, encoder cache hit rate",
               summary["encoder_cache_hit_rate"], "")
    report.add(GROUP, "P0 processor cache hit rate", summary["p0_cache_hit_rate"], "")
    report.add(GROUP, f"generated tokens/s ({summary['tokens']} tokens)", summary["tokens"] / wall_s, "/s")
    report.add(GROUP, "requests/s, end to end", summary["requests_per_s"], "/s")
