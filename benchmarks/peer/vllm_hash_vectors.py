"""Digests of tests/hashing_vectors.py computed by vLLM 0.33's own hasher (and, with ``--bench``,
vLLM's hashing times for the inputs of benchmarks/bench_hashing.py).

Run it in the vLLM peer environment (see ../shared/reference/vllm-peer.md), never in mmfront's:

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 /tmp/vllm-peer-venv/bin/python \
        benchmarks/peer/vllm_hash_vectors.py [--bench]

It prints JSON: ``{"vllm": version, "digests": {name: hex}, "mm_hashes": {case: {modality: [hash]}},
"bench_ms": {...}}``.
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[2]


def _load_vectors_module():
    spec = importlib.util.spec_from_file_location("hashing_vectors", REPO / "tests" / "hashing_vectors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _photo_like(size: int, seed: int) -> Image.Image:
    """The image of benchmarks/bench_hashing.py (that module imports mmfront, so it is repeated here)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    base = np.stack([x * 255 // (size - 1), y * 255 // (size - 1), (x + y) * 255 // (2 * size - 2)], axis=-1)
    noisy = base + rng.integers(-8, 8, base.shape)
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8), "RGB")


def _median_ms(fn, repeat: int = 31) -> float:
    fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def _mm_hashes(module) -> dict[str, dict[str, list[str]]]:
    """``ProcessorInputs.get_mm_hashes`` on ``module.mm_hash_cases``, after vLLM's own parser."""
    from vllm.multimodal.media import MediaWithBytes
    from vllm.multimodal.parse import MultiModalDataParser
    from vllm.multimodal.processing.inputs import ProcessorInputs

    parser = MultiModalDataParser()
    out = {}
    for name, (items, kwargs) in module.mm_hash_cases(MediaWithBytes).items():
        algorithm = "sha256" if name.endswith("sha256") else "blake3"
        inputs = ProcessorInputs(
            prompt=[], mm_data_items=parser.parse_mm_data(items), mm_uuid_items=kwargs.get("mm_uuids"),
            hf_processor_mm_kwargs=kwargs.get("hf_processor_mm_kwargs", {}),
            media_io_kwargs=kwargs.get("media_io_kwargs", {}),
        )
        out[name] = inputs.get_mm_hashes(module.MODEL_ID, algorithm)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", action="store_true", help="also time vLLM on the benchmark inputs")
    args = parser.parse_args()

    import vllm
    from vllm.multimodal.hasher import MultiModalHasher
    from vllm.multimodal.media import MediaWithBytes

    def media_with_bytes(media, original_bytes, io_config):
        return MediaWithBytes(media, original_bytes, io_config)

    module = _load_vectors_module()
    vectors = module.vectors(media_with_bytes)
    digests = {name: MultiModalHasher.hash_kwargs(algorithm, **kwargs) for name, (algorithm, kwargs) in vectors.items()}
    result: dict[str, object] = {"vllm": vllm.__version__, "digests": digests, "mm_hashes": _mm_hashes(module)}
    if args.bench:
        import blake3

        image = _photo_like(1024, seed=0)
        png = io.BytesIO()
        image.save(png, "PNG")
        media = MediaWithBytes(image, png.getvalue())
        array = np.random.default_rng(0).standard_normal(1 << 20).astype(np.float32)
        bench = {}
        for name, value, raw in [("pil_1024", image, image.tobytes()), ("png_1024", media, png.getvalue()),
                                 ("array_4mib", array, array.tobytes())]:
            bench[name] = {
                "vllm_ms": _median_ms(lambda v=value: MultiModalHasher.hash_kwargs("blake3", image=v)),
                "raw_blake3_ms": _median_ms(lambda r=raw: blake3.blake3(r).hexdigest()),
            }
        result["bench_ms"] = bench
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
