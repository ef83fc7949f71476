"""``benchmarks/bench_frontends.py`` (``mmfront bench --only frontends``): its measurement of an API
server's CPU time, its Qwen2.5-VL folder, its skip without the peer, and its whole code path on 4
requests per pass where the peer exists. No timing is asserted: the speeds are the benchmark's."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from mmfront.testing.peer import ENV_VAR, SKIP_REASON, qwen2_5_vl_peer_folder, vllm_peer_python

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PEER = vllm_peer_python()
PEER_DIR = BENCHMARKS.parents[1] / "shared" / "peer"


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("bench_frontends")
    finally:
        sys.path.remove(str(BENCHMARKS))


BURNER = textwrap.dedent("""
    import os, sys, time
    def burn(seconds):
        start = time.process_time()
        while time.process_time() - start < seconds:
            pass
    if os.fork() == 0:
        burn(0.3)
        print("child", flush=True)
        time.sleep(60)
    else:
        burn(0.3)
        time.sleep(0.5)
        print("parent", flush=True)
        time.sleep(60)
""")


def test_the_cpu_time_of_a_process_group_counts_its_children(bench: ModuleType) -> None:
    process = subprocess.Popen([sys.executable, "-c", BURNER], stdout=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        assert process.stdout is not None
        lines = {process.stdout.readline().strip() for _ in range(2)}
        assert lines == {"child", "parent"}
        cpu = bench.group_cpu_s(process.pid)
        assert 0.55 <= cpu < 5, cpu
        assert bench.group_rss_bytes(process.pid) > 2 * 2**20
        assert bench.group_cpu_s(2**22 + 1) == 0.0  # no such group
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)


def test_the_qwen_folder_has_the_standard_minimum_its_limit_and_words_for_the_stub_tokens(
        bench: ModuleType, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = qwen2_5_vl_peer_folder(tmp_path, bench.QWEN_SMALL_MAX_PIXELS)
    images = json.loads((folder / "processor_config.json").read_text())["image_processor"]
    assert (images["min_pixels"], images["max_pixels"]) == (3136, 12544)
    assert images["size"] == {"shortest_edge": 3136, "longest_edge": 12544}
    assert (images["patch_size"], images["merge_size"]) == (14, 2)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    assert config["text_config"]["vocab_size"] == 2048
    assert config["text_config"]["max_position_embeddings"] == 128000
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert len(tokenizer) == 2048
    assert tokenizer.decode([1010, 1011]) == " w1010 w1011"
    assert qwen2_5_vl_peer_folder(tmp_path, bench.QWEN_SMALL_MAX_PIXELS) == folder  # built once


def test_without_the_peer_the_bench_says_it_skipped(bench: ModuleType, monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    from _harness import Report

    monkeypatch.setenv(ENV_VAR, str(tmp_path / "no-venv" / "bin" / "python"))
    report = Report()
    bench.run(report, quick=True)
    assert [row.name for row in report.rows] == ["vLLM peer not found: skipped (no stock engine)"]


def test_an_unknown_configuration_is_refused_with_the_known_ones(bench: ModuleType,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bench.SELECT_ENV, "gemma3,qwen9")
    with pytest.raises(SystemExit, match=r"unknown configuration \['qwen9'\]; known: \['qwen2.5-vl-small', "
                                         r"'qwen2.5-vl', 'gemma3'\]"):
        bench.selected_configs()
    monkeypatch.setenv(bench.SELECT_ENV, "gemma3")
    assert [c.key for c in bench.selected_configs()] == ["gemma3"]


@pytest.mark.slow
@pytest.mark.vllm_side_by_side
@pytest.mark.skipif(PEER is None or not PEER_DIR.is_dir(), reason=SKIP_REASON)
def test_the_three_frontends_serve_qwen_through_the_bench_code_path(bench: ModuleType, tmp_path: Path) -> None:
    """Qwen2.5-VL with the small limit, every side, 4 requests a pass: each side starts, serves
    both passes through vLLM's client, and its CPU is read; the report names every ratio."""
    from _harness import Report

    assert PEER is not None
    config = next(c for c in bench.CONFIGS if c.key == "qwen2.5-vl-small")
    sides, skipped = bench.sides_of(config, PEER)
    results = bench.measure(PEER, config, sides, rounds=1, prompts=4, folder=tmp_path)
    [served] = results
    assert list(served) == sides
    for side, one in served.items():
        assert one.failed == "", f"{side}: {one.failed}"
        assert len(one.passes) == 2
        assert one.startup_rss_mib > 50
        for each in one.passes:
            assert each.requests_per_s > 0 and each.median_ttft_ms > 0 and each.cpu_ms_per_request > 0
    report = Report()
    bench.report_config(report, config, results, skipped)
    ratios = [row.name for row in report.rows if row.unit == "x"]
    assert ratios == [f"Qwen2.5-VL, small limit: {what}: mmfront / faster vLLM, {label}"
                      for what in ("new images", "same images again")
                      for label in ("requests/s", "median TTFT", "CPU per request")]
