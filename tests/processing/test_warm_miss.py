"""A miss processed in place (the server's own threads, ``--processing-lanes 0``) page-faults no
fresh memory in once warm: its large buffers (the decoded pixels, the resized planes, Qwen2-VL's
patch rows, Gemma 3's model-ready rows) come from :func:`mmfront.wire.warm.warm_memory`.

Why it matters: ``mmfront serve`` fixes glibc's mmap threshold at 1 MiB, so each of those buffers
was a fresh mapping, faulted in page by page on every miss (measured here before the change: 1,788
faults per Qwen2.5-VL 1024x768 miss, 577 at the small pixel limit, 1,255 per Gemma 3 896x896
miss and 2,415 per 1024x768 one, which torch's resize made), ~5 ms of a Qwen2.5-VL miss's CPU on
the project's 2-core VM. Each case runs in a child
interpreter that fixes the threshold as the server does; the counts are the process's minor
faults per miss, each on a new image, after two warm-up misses."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from packaging.version import Version

from markers import NEEDS_TORCHVISION
from mmfront import MultiModalConfig, bicubic, pixels
from mmfront.media import DecodeBudget, load_image_bytes
from mmfront.models.registry import create_processor
from mmfront.models.transformers.base import TRANSFORMERS_VERSION
from mmfront.testing.media import make_image
from mmfront.testing.models import build_model_folder
from preloaded import popen

_MEASURE = textwrap.dedent("""
    import io, json, resource, sys
    from mmfront.wire.allocator import unmap_large_buffers
    assert unmap_large_buffers()
    import torch
    torch.set_num_threads(1)
    from mmfront import MultiModalConfig
    from mmfront.media import DecodeBudget, load_image_bytes
    from mmfront.models.registry import create_processor
    from mmfront.testing.media import make_image

    folder, width, height = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    config = MultiModalConfig(mm_processor_cache_gb=0)
    proc = create_processor(folder, config)
    payloads = []
    for seed in range(7):
        encoded = io.BytesIO()
        make_image(width, height, seed=seed).save(encoded, format="JPEG")
        payloads.append(encoded.getvalue())
    ids = proc.info.get_tokenizer().encode(proc.get_placeholder_str("image", 0), add_special_tokens=False)
    faults, shapes = [], set()
    for payload in payloads:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        item = load_image_bytes(payload, config=config, budget=DecodeBudget(1 << 30))
        out = proc.apply(ids, {"image": [item]})
        shapes.add(tuple(out["mm_kwargs"]["image"][0]["pixel_values"].data.shape))
        del out, item
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"faults": faults[2:], "shapes": sorted(shapes)}))
""")

RESIZED_IN_C = pytest.mark.skipif(not bicubic.resizes_in_c(),
                                  reason="no AVX2 loops on this CPU (or no extension): torch resizes, into its own memory")
QWEN_STEPS_SWAPPED = pytest.mark.skipif(
    Version("5.15") > TRANSFORMERS_VERSION or not pixels.patch_rows_in_c(),
    reason="transformers 5.14 inlines Qwen2-VL's patchify (or no extension): HF's copies fault fresh memory in, "
           "which is why such a processor keeps its lanes by default (tests/processing/test_threads.py)")
QWEN = {"patch_size": 14, "merge_size": 2}
CASES = [
    pytest.param("qwen2_5_vl", {**QWEN, "max_pixels": 12845056}, (1024, 768), [3996, 1176],
                 marks=[NEEDS_TORCHVISION, QWEN_STEPS_SWAPPED, RESIZED_IN_C], id="Qwen2.5-VL standard limits, 1024x768"),
    pytest.param("qwen2_5_vl", {**QWEN, "max_pixels": 12544}, (1024, 768), [48, 1176],
                 marks=[NEEDS_TORCHVISION, QWEN_STEPS_SWAPPED], id="Qwen2.5-VL small limit, 1024x768"),
    pytest.param("gemma3-896", {}, (896, 896), [1, 3, 896, 896], id="Gemma 3, 896x896"),
    pytest.param("gemma3-896", {}, (1024, 768), [1, 3, 896, 896], marks=RESIZED_IN_C, id="Gemma 3, 1024x768"),
]


@pytest.mark.parametrize(("kind", "sizes", "image_size", "shape"), CASES)
def test_a_warm_miss_in_place_faults_no_fresh_memory_in(kind: str, sizes: dict[str, int], image_size: tuple[int, int],
                                                        shape: list[int], tmp_path: Path) -> None:
    folder = build_model_folder(kind, tmp_path / kind, **sizes)
    child = popen([sys.executable, "-c", _MEASURE, str(folder), *map(str, image_size)], stdout=subprocess.PIPE,
                  stderr=subprocess.PIPE, text=True)
    out, err = child.communicate(timeout=300)
    assert child.returncode == 0, err[-3000:]
    measured = json.loads(out.strip().splitlines()[-1])
    assert measured["shapes"] == [shape]
    assert max(measured["faults"]) < 100, measured  # a fresh 4.7 MB of patch rows alone: ~1,150


@pytest.mark.parametrize(("kind", "sizes"), [
    pytest.param("qwen2_5_vl", {**QWEN, "max_pixels": 12845056}, marks=NEEDS_TORCHVISION, id="Qwen2.5-VL"),
    pytest.param("gemma3-896", {}, id="Gemma 3"),
])
def test_misses_in_place_on_many_threads_keep_their_own_pixels(kind: str, sizes: dict[str, int],
                                                               tmp_path: Path) -> None:
    """Warm blocks go back to the pool as soon as a miss drops them, while other threads take
    them: every miss's rows equal the ones processed alone, whether its outputs were still held
    (another thread must not be handed their blocks) or dropped at once (their blocks serve
    the next misses)."""
    folder = build_model_folder(kind, tmp_path / kind, **sizes)
    config = MultiModalConfig(mm_processor_cache_gb=0)
    proc = create_processor(folder, config)
    ids = proc.info.get_tokenizer().encode(proc.get_placeholder_str("image", 0), add_special_tokens=False)
    payloads = []
    for seed in range(12):
        encoded = io.BytesIO()
        make_image(1024 - 16 * (seed % 3), 768, seed=seed).save(encoded, format="JPEG")
        payloads.append(encoded.getvalue())

    def rows(payload: bytes) -> torch.Tensor:
        item = load_image_bytes(payload, config=config, budget=DecodeBudget(1 << 30))
        return proc.apply(ids, {"image": [item]})["mm_kwargs"]["image"][0]["pixel_values"].data

    alone = [rows(p).clone() for p in payloads]
    held: dict[int, torch.Tensor] = {}

    def worker(start: int) -> None:
        for n in range(start, len(payloads), 3):
            for _ in range(2):
                got = rows(payloads[n])
                assert torch.equal(got, alone[n]), n  # checked before its blocks can go back
            held[n] = got  # the last one held until every thread is done

    with ThreadPoolExecutor(3) as pool:
        list(pool.map(worker, range(3)))
    assert sorted(held) == list(range(len(payloads)))
    assert all(torch.equal(held[n], alone[n]) for n in held)
