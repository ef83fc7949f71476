"""Processing lanes on the real-size Gemma3 fixture (1024x1024 PNGs, every image unique: all misses).

* Throughput: requests/s of a crowd of 1-image requests (prepared on as many threads as cores),
  with 1 lane and with 2; the goal is 2 lanes >= 1.6x one lane on a 2-core machine.
* Latency of one 3-image request with 1 lane and with 2 (its items spread over the lanes).
* The thread budget under outside CPU load (one busy process per core): a miss processed in
  place with torch on one thread (the budget's plan) and on one thread per core (torch's default).

Timed region: ``InputPreprocessor.preprocess`` of images already loaded lazily and prehashed, as
the chat path hands them over; the PNG decode is part of the miss, on the lane.
"""

from __future__ import annotations

import io
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import torch

from _harness import Report
from mmfront import MultiModalConfig
from mmfront.hashing import prehash_media
from mmfront.media import DecodeBudget
from mmfront.preprocess import InputPreprocessor
from mmfront.processing.threads import available_cores
from mmfront.testing.media import natural_image
from mmfront.testing.models import cached_model_dir

GROUP = "lanes gemma3-896"
_tags = iter(range(500_000, 10**9))


def _png(tag: int) -> bytes:
    buf = io.BytesIO()
    natural_image(tag=tag).save(buf, format="PNG")
    return buf.getvalue()


def _images(pre: InputPreprocessor, count: int) -> list[Any]:
    """``count`` unique images, loaded lazily and prehashed (what the chat path hands over)."""
    out = []
    for _ in range(count):
        item = pre.connector.load_image(_png(next(_tags)), budget=DecodeBudget(1 << 30))
        prehash_media(item, "image", pre.config.mm_hasher_algorithm)
        out.append(item)
    return out


def _prompt(pre: InputPreprocessor, n: int) -> list[int]:
    placeholder = pre.processor.get_placeholder_str("image", 0)
    return pre.tokenizer.encode("<start_of_turn>user\n" + placeholder * n + "Describe.<end_of_turn>\n")


def _preprocessor(lanes: int) -> InputPreprocessor:
    pre = InputPreprocessor(cached_model_dir("gemma3-896"), MultiModalConfig(mm_processing_lanes=lanes))
    if lanes:  # start every lane before timing: one request each, at once
        with ThreadPoolExecutor(lanes) as pool:
            list(pool.map(lambda images: pre.preprocess(_prompt(pre, 1), {"image": images}),
                          [_images(pre, 1) for _ in range(lanes)]))
    return pre


def _requests_per_s(pre: InputPreprocessor, count: int) -> float:
    prompt = _prompt(pre, 1)
    requests = [_images(pre, 1) for _ in range(count)]
    with ThreadPoolExecutor(available_cores()) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda images: pre.preprocess(prompt, {"image": images}), requests))
        return count / (time.perf_counter() - t0)


def _median_ms(pre: InputPreprocessor, n_images: int, repeat: int) -> float:
    prompt = _prompt(pre, n_images)
    samples = []
    for images in [_images(pre, n_images) for _ in range(repeat)]:
        t0 = time.perf_counter()
        pre.preprocess(prompt, {"image": images})
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


@contextmanager
def _outside_load() -> Iterator[None]:
    """One busy process per core, as another tenant of the machine would be."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(available_cores())]
    try:
        time.sleep(0.5)
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def run(report: Report, quick: bool) -> None:
    crowd, repeat = (8, 3) if quick else (24, 7)
    results: dict[int, tuple[float, float]] = {}
    for lanes in (1, 2):
        with _preprocessor(lanes) as pre:
            results[lanes] = (_requests_per_s(pre, crowd), _median_ms(pre, 3, repeat))
        report.add(GROUP, f"{lanes} lane(s): 1-image misses", results[lanes][0], "req/s")
        report.add(GROUP, f"{lanes} lane(s): one 3-image miss", results[lanes][1], "ms")
    report.ratio(GROUP, "2 lanes / 1 lane requests/s", results[2][0] / results[1][0], at_least=1.6)
    report.ratio(GROUP, "3-image request: 1 lane / 2 lanes latency", results[1][1] / results[2][1])

    in_place = InputPreprocessor(cached_model_dir("gemma3-896"), MultiModalConfig(mm_processing_lanes=0))
    budget_threads = torch.get_num_threads()
    with _outside_load():
        budgeted = _median_ms(in_place, 1, repeat)
        torch.set_num_threads(available_cores())
        try:
            unbudgeted = _median_ms(in_place, 1, repeat)
        finally:
            torch.set_num_threads(budget_threads)
    report.add(GROUP, f"under load, in place, torch on {budget_threads} thread (budget)", budgeted, "ms")
    report.add(GROUP, f"under load, in place, torch on {available_cores()} threads", unbudgeted, "ms")
    report.ratio(GROUP, "under load: unbudgeted / budgeted miss latency", unbudgeted / budgeted, at_least=1.0)
