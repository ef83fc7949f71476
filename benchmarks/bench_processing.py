"""``apply()`` latency for one 1024x1024 image on the real-size Gemma3 fixture, cache miss and hit,
for PNG bytes and for a PIL image, side by side with vLLM 0.33 when its peer venv is present.

Timed region on both sides: parse + apply with the default LRU sender cache. Loading PNG bytes is
timed separately, because the two frontends put different work there: vLLM decodes the image at
load; mmfront reads the header and hashes the bytes (on the loading threads, off the processing
lane) and decodes only on a miss, inside ``apply``. So the table also gives load + apply, the
end-to-end cost of a PNG item, where a hit is compared with vLLM's decode + hit.

The peer: ``MMFRONT_VLLM_PEER`` names its python (default /tmp/vllm-peer/.venv-vllm/bin/python), its
model folder is ``<venv>/models/tiny-gemma3-896`` (built by /work/shared/peer/vllm_peer_setup.sh).

The decode of a miss is also timed alone: mmfront's PNG decode (inflated by ISA-L, then Pillow)
against Pillow's own on the same bytes, alternated in the same run (the same pixels, asserted).
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

from PIL import Image

from _harness import Report
from mmfront import MultiModalConfig
from mmfront.cache.lru import LruKeyReplicatedSenderCache
from mmfront.hashing import prehash_media
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.media.png_inflate import decode_png
from mmfront.models.registry import create_processor
from mmfront.testing.media import natural_image
from mmfront.testing.models import cached_model_dir

PROMPT = "<start_of_turn>user\n<start_of_image>Describe this image in detail.<end_of_turn>\n<start_of_turn>model\n"
REPO = Path(__file__).resolve().parents[1]


def _png(img: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
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
    base_png = _png(base)
    run(lazy(base_png))
    out["load_png_ms"] = _median_ms(lazy, [base_png] * n_hit)
    hit_items = [lazy(base_png) for _ in range(n_hit)]
    out["hit_png_ms"] = _median_ms(run, hit_items)
    assert all(item.decode_count == 0 for item in hit_items), "a cache hit must never decode"
    out.update(measure_png_decode(n_miss))
    return out


def measure_png_decode(rounds: int) -> dict[str, float]:
    """Medians of mmfront's and Pillow's decode of the same 1024x1024 PNG, rounds alternated."""
    payload = _png(natural_image(tag=77))

    def pillow(data: bytes) -> Any:
        image = Image.open(io.BytesIO(data), formats=("PNG",))
        image.load()
        return image

    assert decode_png(payload).tobytes() == pillow(payload).tobytes(), "the decode must keep Pillow's pixels"
    ours: list[float] = []
    theirs: list[float] = []
    for _ in range(rounds * 3):
        for decode, samples in ((decode_png, ours), (pillow, theirs)):
            t0 = time.perf_counter()
            decode(payload)
            samples.append(time.perf_counter() - t0)
    return {"png_decode_ms": statistics.median(ours) * 1e3, "pillow_png_decode_ms": statistics.median(theirs) * 1e3}


def measure_vllm(quick: bool) -> dict[str, float] | None:
    python = Path(os.environ.get("MMFRONT_VLLM_PEER", "/tmp/vllm-peer/.venv-vllm/bin/python"))
    model_dir = python.parents[1] / "models" / "tiny-gemma3-896"
    if not python.exists() or not model_dir.is_dir():
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
    for key in ("miss_pil_ms", "hit_pil_ms", "load_png_ms", "miss_png_ms", "hit_png_ms"):
        report.add(group, f"mmfront {key[:-3]}", ours[key], "ms")
    report.add(group, "PNG decode, mmfront (ISA-L inflate + Pillow)", ours["png_decode_ms"], "ms")
    report.add(group, "PNG decode, Pillow alone", ours["pillow_png_decode_ms"], "ms")
    report.ratio(group, "PNG decode: mmfront / Pillow", ours["png_decode_ms"] / ours["pillow_png_decode_ms"],
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
