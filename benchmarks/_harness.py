"""Shared timing helpers for `mmfront bench`.

Each ``bench_*.py`` module in this folder defines ``run(report: Report, quick: bool) -> None``.
Timings are medians over repeats; speed goals are ratios against a baseline measured in the same
run (these machines are noisy, so absolute numbers from different runs do not compare).
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import statistics
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def median_time(fn: Callable[[], object], *, repeat: int = 15, number: int = 0, budget_s: float = 0.2) -> float:
    """Median seconds per call of ``fn`` over ``repeat`` samples of ``number`` calls each.

    With ``number=0`` the batch size is picked so one sample takes about ``budget_s / repeat``.
    """
    fn()  # warm up caches and lazy imports
    if number <= 0:
        t0 = time.perf_counter()
        fn()
        one = max(time.perf_counter() - t0, 1e-7)
        number = max(1, int(budget_s / repeat / one))
    samples = []
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(number):
                fn()
            samples.append((time.perf_counter() - t0) / number)
    finally:
        if gc_was_enabled:
            gc.enable()
    return statistics.median(samples)


@dataclass
class Row:
    group: str
    name: str
    value: float
    unit: str
    target: str = ""
    ok: bool | None = None


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)

    def add(self, group: str, name: str, value: float, unit: str, *, target: str = "", ok: bool | None = None) -> None:
        row = Row(group, name, value, unit, target, ok)
        self.rows.append(row)
        print(format_row(row), flush=True)

    def ratio(self, group: str, name: str, value: float, *, at_least: float | None = None,
              at_most: float | None = None) -> None:
        """Record a ratio and whether it meets its goal (``at_least`` or ``at_most``)."""
        ok: bool | None = None
        target = ""
        if at_least is not None:
            ok, target = value >= at_least, f">= {at_least:g}x"
        if at_most is not None:
            ok, target = value <= at_most, f"<= {at_most:g}x"
        self.add(group, name, value, "x", target=target, ok=ok)


def format_row(row: Row) -> str:
    status = {True: "ok", False: "MISS", None: ""}[row.ok]
    value = f"{row.value:.3f}" if row.unit == "x" else f"{row.value:.4g}"
    return f"  {row.group:<22} {row.name:<52} {value:>10} {row.unit:<3} {row.target:<10} {status}"


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 0.0) -> None:
    """The process and its children (it leads its own process group); SIGTERM first if ``grace_s``."""
    if grace_s and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def log_tail(path: Path) -> list[str]:
    """A log's last lines, for an error that says why a process failed."""
    return path.read_text(errors="replace").strip().splitlines()[-5:] if path.exists() else []


def wait_healthy(base: str, processes: Sequence[subprocess.Popen[Any]], logs: Sequence[Path], timeout_s: float) -> None:
    """Wait until ``base``'s ``/health`` answers 200; a process of ``processes`` that exits
    first, or ``timeout_s`` passing, is an error with the tail of each log."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            raise RuntimeError(f"a process exited before the server was ready: {[log_tail(log) for log in logs]}")
        with contextlib.suppress(OSError, urllib.error.URLError), \
                urllib.request.urlopen(base + "/health", timeout=2) as reply:
            if reply.status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the server was not healthy after {timeout_s:.0f} s: {[log_tail(log) for log in logs]}")
