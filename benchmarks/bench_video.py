"""A 10 s 1280x720 30 fps H.264 clip (made offline with PyAV) through the chat path's video steps
on the Qwen2.5-VL fixture: load (header, sampling, hash), then ``apply`` with the default LRU
sender cache. A miss decodes the kept frames and runs the HF video processor; a repeated clip is
a cache hit that decodes nothing (asserted).

Memory: the peak resident-set growth during one miss (sampled every millisecond on a thread),
against the bytes of the frames kept and the decode budget charged for them.

vLLM 0.33's own video path (``peer/vllm_video.py``: ``VideoMediaIO`` with the loader backend its
connector picks for Qwen2.5-VL's video processor, decoding with OpenCV, then its processor's
``apply``) runs in the peer venv (:func:`mmfront.testing.peer.vllm_peer_python`) on the same clip,
prompt and fixture folder, over the same region; it is reported as not measured where that venv
is absent or cannot import ``cv2`` (``pip install opencv-python-headless`` there).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _harness import Report
from mmfront import MultiModalConfig
from mmfront.cache.lru import LruKeyReplicatedSenderCache
from mmfront.hashing import prehash_media
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.registry import create_processor
from mmfront.testing.media import make_video
from mmfront.testing.models import cached_model_dir, mmfront_home
from mmfront.testing.peer import vllm_peer_python

REPO = Path(__file__).resolve().parents[1]
GROUP = "video 720p 10s"
PROMPT = "<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>What happens?<|im_end|>\n<|im_start|>assistant\n"


def clip_720p() -> Path:
    """The clip, encoded once and kept under mmfront's home (encoding takes longer than a run)."""
    path = mmfront_home() / "media" / "bench-720p-10s-30fps.mp4"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        data = make_video(seconds=10.0, fps=30, width=1280, height=720, seed=1)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    return path


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def peak_rss_growth(fn: Callable[[], object]) -> float:
    """Bytes the resident set grew by at its peak while ``fn`` ran, over where it started."""
    gc.collect()
    base = _rss_bytes()
    peak = base
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _rss_bytes())
            time.sleep(0.001)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return float(max(peak, _rss_bytes()) - base)


def measure_mmfront(clip: bytes, quick: bool) -> dict[str, float]:
    config = MultiModalConfig()
    proc = create_processor(cached_model_dir("qwen2_5_vl"), config)
    video_processor = type(proc.info.hf_processor.video_processor).__name__
    connector = MediaConnector(config)
    prompt = proc.info.tokenizer.encode(PROMPT)

    def load() -> Any:
        """What the chat path does with a video part: load lazily (header only), then prehash."""
        item = connector.load_video(clip, budget=DecodeBudget(config.max_media_request_decode_bytes),
                                    video_processor=video_processor)
        prehash_media(item, "video", config.mm_hasher_algorithm)
        return item

    def request(cache: Any) -> Any:
        item = load()
        proc.apply(prompt, {"video": [item]}, cache=cache)
        return item

    n_miss, n_hit = (2, 5) if quick else (5, 20)
    request(LruKeyReplicatedSenderCache(config.mm_processor_cache_bytes))  # warm up
    misses = []
    for _ in range(n_miss):
        cache = LruKeyReplicatedSenderCache(config.mm_processor_cache_bytes)
        t0 = time.perf_counter()
        request(cache)
        misses.append(time.perf_counter() - t0)
    hits, hit_items = [], []
    for _ in range(n_hit):
        t0 = time.perf_counter()
        hit_items.append(request(cache))
        hits.append(time.perf_counter() - t0)
    assert all(item.decode_count == 0 for item in hit_items), "a cache hit must never decode"
    kept = load()
    frames_nbytes = float(kept.info["frames_nbytes"])
    budget = DecodeBudget(config.max_media_request_decode_bytes)
    connector.load_video(clip, budget=budget, video_processor=video_processor)
    peak = peak_rss_growth(lambda: request(LruKeyReplicatedSenderCache(config.mm_processor_cache_bytes)))
    return {
        "miss_ms": statistics.median(misses) * 1e3,
        "hit_ms": statistics.median(hits) * 1e3,
        "frames": float(len(kept.info["metadata"]["frames_indices"])),
        "frames_mb": frames_nbytes / 1e6,
        "budget_mb": float(budget.used_bytes) / 1e6,
        "peak_mb": peak / 1e6,
    }


def measure_vllm(clip: Path, quick: bool) -> dict[str, Any] | str:
    """vLLM's miss on the same clip and folder, or why it is not measured."""
    python = vllm_peer_python()
    if python is None:
        return "vLLM peer venv not found"
    probe = subprocess.run([str(python), "-c", "import cv2"], capture_output=True, text=True, check=False, timeout=120)
    if probe.returncode != 0:
        return "the vLLM peer venv has no OpenCV (cv2), which vLLM 0.33's video loader needs"
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO / "src"))
    cmd = [str(python), str(REPO / "benchmarks" / "peer" / "vllm_video.py"), str(cached_model_dir("qwen2_5_vl")),
           str(clip), PROMPT]
    done = subprocess.run(cmd + (["--quick"] if quick else []), env=env, capture_output=True, text=True,
                          check=False, timeout=900)
    if done.returncode != 0:
        return f"the vLLM peer failed: {done.stderr.strip().splitlines()[-1:]}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(report: Report, quick: bool) -> None:
    clip_path = clip_720p()
    clip = clip_path.read_bytes()
    ours = measure_mmfront(clip, quick)
    report.add(GROUP, f"clip: H.264 MP4, {len(clip) / 1e6:.1f} MB; frames kept", ours["frames"], "")
    report.add(GROUP, "mmfront miss (load + decode + HF)", ours["miss_ms"], "ms")
    report.add(GROUP, "mmfront hit (load + hash + cache)", ours["hit_ms"], "ms")
    report.ratio(GROUP, "hit / miss", ours["hit_ms"] / ours["miss_ms"], at_most=0.05)
    report.add(GROUP, "frames kept (RGB bytes)", ours["frames_mb"], "MB")
    report.add(GROUP, "decode budget charged", ours["budget_mb"], "MB")
    report.add(GROUP, "peak RSS growth during a miss", ours["peak_mb"], "MB")
    report.ratio(GROUP, "miss peak / frames kept", ours["peak_mb"] / ours["frames_mb"])
    theirs = measure_vllm(clip_path, quick)
    if isinstance(theirs, str):
        report.add(GROUP, f"vLLM miss not measured: {theirs}", 0.0, "")
        return
    assert theirs["frames"] == ours["frames"], f"frames kept differ: vLLM {theirs['frames']}, mmfront {ours['frames']}"
    report.add(GROUP, f"vLLM 0.33 miss ({theirs['backend']} sampling, OpenCV decode + HF)", theirs["miss_ms"], "ms")
    report.ratio(GROUP, "mmfront miss / vLLM miss", ours["miss_ms"] / theirs["miss_ms"], at_most=0.7)
