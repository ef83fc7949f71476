"""``apply()`` latency for one 1024x1024 image on the real-size Gemma3 fixture, cache miss and hit,
for PNG bytes and for a PIL image (and a miss on JPEG bytes), side by side with vLLM 0.33 when its peer venv is present.

Timed region on both sides: parse + apply with the default LRU sender cache. Loading PNG bytes is
timed separately, because the two frontends put different work there: vLLM decodes the image at
load; mmfront reads the header and hashes the bytes (on the loading threads, off the processing
lane) and decodes only on a miss, inside ``apply``. So the table also gives load + apply, the
end-to-end cost of a PNG item, where a hit is compared with vLLM's decode + hit.

The peer: :func:`mmfront.testing.peer.vllm_peer_python` (``MMFRONT_VLLM_PEER``, default /tmp/vllm-peer-venv), its
model folder is ``<venv>/models/tiny-gemma3-896`` (built by ../shared/peer/vllm_peer_setup.sh).

A PNG miss is also timed stage by stage (decode, to array, resize, normalize), with mmfront's PNG
decode (inflated by ISA-L, then Pillow) against Pillow's own on the same bytes in the same rounds.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from _harness import Report
from mmfront import MultiModalConfig
from mmfront.cache.lru import LruKeyReplicatedSenderCache
from mmfront.hashing import prehash_media
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.media.png_inflate import decode_png
from mmfront.models.gemma3 import _target_size
from mmfront.models.registry import create_processor
from mmfront.pixels import normalize_, resized, to_hwc_uint8
from mmfront.testing.media import natural_image
from mmfront.testing.models import cached_model_dir
from mmfront.testing.peer import vllm_peer_model_dir, vllm_peer_python

PROMPT = "<start_of_turn>user\n<start_of_image>Describe this image in detail.<end_of_turn>\n<start_of_turn>model\n"
REPO = Path(__file__).resolve().parents[1]


def _png(img: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _jpeg(img: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="JPEG")
    return buf.getvalue()


def _median_ms(fn: Callable[[Any], object], items: list[Any]) -> float:
    samples = []
    for item in items:
        t0 = time.perf_counter()
        fn(item)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def measure_mmfront(quick: bool) -> dict[str, float]:
    config = MultiModalConfig()
    proc = create_processor(cached_model_dir("gemma3-896"), config)
    prompt = proc.info.tokenizer.encode(PROMPT)
    cache = LruKeyReplicatedSenderCache(config.mm_processor_cache_bytes)
    n_miss, n_hit = (6, 40) if quick else (20, 150)

    def run(item: Any) -> None:
        proc.apply(prompt, {"image": [item]}, cache=cache)

    connector = MediaConnector(config)

    def lazy(data: bytes) -> Any:
        """What the chat path does with an image part: load lazily, then prehash."""
        item = connector.load_image(data, budget=DecodeBudget(config.max_media_request_decode_bytes))
        prehash_media(item, "image", config.mm_hasher_algorithm)
        return item

    out: dict[str, float] = {}
    run(natural_image(tag=99_999))
    out["miss_pil_ms"] = _median_ms(run, [natural_image(tag=i + 1) for i in range(n_miss)])
    base = natural_image()
    run(base)
    out["hit_pil_ms"] = _median_ms(run, [base] * n_hit)
    out["miss_png_ms"] = _median_ms(run, [lazy(_png(natural_image(tag=1000 + i))) for i in range(n_miss)])
    # decoded by libjpeg-turbo straight into the array the native path reads (mmfront.media.jpeg); a
    # seed each, as a tag's few pixels may not survive the JPEG encoding (the same bytes: a hit)
    out["miss_jpeg_ms"] = _median_ms(run, [lazy(_jpeg(natural_image(seed=2000 + i))) for i in range(n_miss)])
    base_png = _png(base)
    run(lazy(base_png))
    out["load_png_ms"] = _median_ms(lazy, [base_png] * n_hit)
    hit_items = [lazy(base_png) for _ in range(n_hit)]
    out["hit_png_ms"] = _median_ms(run, hit_items)
    assert all(item.decode_count == 0 for item in hit_items), "a cache hit must never decode"
    out.update(measure_miss_stages(proc, n_miss))
    return out


def measure_miss_stages(proc: Any, rounds: int) -> dict[str, float]:
    """Medians of each stage of a 1024x1024 PNG miss, on the same image, rounds alternated with
    Pillow's own decode of the same bytes (the same pixels, asserted): where a miss goes."""
    payload = _png(natural_image(tag=77))
    settings = proc.info.image_kwargs({})
    out_hw = _target_size(settings)

    def pillow(data: bytes) -> Any:
        image = Image.open(io.BytesIO(data), formats=("PNG",))
        image.load()
        return image

    def normalize(rows: torch.Tensor) -> None:
        pixels = torch.empty((1, 3, *out_hw), dtype=torch.float32)
        pixels[0].copy_(rows)
        normalize_(pixels, settings)

    image = decode_png(payload)
    assert image.tobytes() == pillow(payload).tobytes(), "the decode must keep Pillow's pixels"
    view = to_hwc_uint8(image)
    assert view is not None
    resized_view = resized(view, out_hw)
    stages: dict[str, tuple[Callable[[], object], list[float]]] = {
        "stage_pillow_decode_ms": (lambda: pillow(payload), []),
        "stage_decode_ms": (lambda: decode_png(payload), []),
        "stage_to_array_ms": (lambda: to_hwc_uint8(image), []),
        "stage_resize_ms": (lambda: resized(view, out_hw), []),
        "stage_normalize_ms": (lambda: normalize(resized_view), []),
    }
    for _ in range(rounds * 3):
        for stage, samples in stages.values():
            t0 = time.perf_counter()
            stage()
            samples.append(time.perf_counter() - t0)
    return {key: statistics.median(samples) * 1e3 for key, (_, samples) in stages.items()}


def measure_vllm(quick: bool) -> dict[str, float] | None:
    python = vllm_peer_python()
    model_dir = None if python is None else vllm_peer_model_dir(python)
    if python is None or model_dir is None:
        return None
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO / "src"))
    cmd = [str(python), str(REPO / "benchmarks" / "peer" / "vllm_apply.py"), str(model_dir)]
    done = subprocess.run(cmd + (["--quick"] if quick else []), env=env, capture_output=True, text=True,
                          check=False, timeout=900)
    if done.returncode != 0:
        print(f"  vLLM peer failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(report: Report, quick: bool) -> None:
    vllm = measure_vllm(quick)
    ours = measure_mmfront(quick)
    group = "apply gemma3-896"
    for key in ("miss_pil_ms", "hit_pil_ms", "load_png_ms", "miss_png_ms", "hit_png_ms", "miss_jpeg_ms"):
        report.add(group, f"mmfront {key[:-3]}", ours[key], "ms")
    for key, label in (("stage_decode_ms", "decode (ISA-L inflate + Pillow)"), ("stage_to_array_ms", "to uint8 array"),
                       ("stage_resize_ms", "resize to 896"), ("stage_normalize_ms", "to float32 + normalize")):
        report.add(group, f"miss PNG stage: {label}", ours[key], "ms")
    report.add(group, "miss PNG stage: decode by Pillow alone", ours["stage_pillow_decode_ms"], "ms")
    report.ratio(group, "PNG decode: mmfront / Pillow", ours["stage_decode_ms"] / ours["stage_pillow_decode_ms"],
                 at_most=0.75)
    if vllm is None:
        report.add(group, "vLLM peer not found: ratios skipped", 0.0, "")
        return
    for key in ("miss_pil_ms", "hit_pil_ms", "miss_png_ms", "hit_png_ms", "png_decode_ms"):
        report.add(group, f"vLLM {key[:-3]}", vllm[key], "ms")
    report.ratio(group, "hit PNG: mmfront / vLLM", ours["hit_png_ms"] / vllm["hit_png_ms"], at_most=0.5)
    report.ratio(group, "hit PIL: mmfront / vLLM", ours["hit_pil_ms"] / vllm["hit_pil_ms"], at_most=0.5)
    report.ratio(group, "miss PIL: mmfront / vLLM", ours["miss_pil_ms"] / vllm["miss_pil_ms"], at_most=1.0)
    report.ratio(group, "load+hit PNG: mmfront / vLLM", (ours["load_png_ms"] + ours["hit_png_ms"])
                 / (vllm["png_decode_ms"] + vllm["hit_png_ms"]))
    report.ratio(group, "load+miss PNG: mmfront / vLLM", (ours["load_png_ms"] + ours["miss_png_ms"])
                 / (vllm["png_decode_ms"] + vllm["miss_png_ms"]), at_most=1.0)
