"""vLLM 0.33's Gemma3 ``apply()`` latency, measured the way ``bench_processing.py`` measures mmfront.

Runs inside the vLLM peer venv (``/work/shared/peer/vllm_peer_setup.sh``), never in mmfront's; prints
one JSON object. Same images (``mmfront.testing.media.natural_image``, imported via PYTHONPATH=src),
same prompt, same timed region (parse + apply with the default LRU sender cache), medians.

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 PYTHONPATH=src \
        /tmp/vllm-peer-venv/bin/python benchmarks/peer/vllm_apply.py MODEL_DIR [--quick]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()

    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.cache import LruKeyReplicatedSenderCache
    from vllm.multimodal.media import ImageMediaIO
    from vllm.multimodal.processing import ProcessorInputs, TimingContext

    from mmfront.testing.media import natural_image

    mc = ModelConfig(model=args.model_dir, tokenizer=args.model_dir, max_model_len=8192)
    proc = MULTIMODAL_REGISTRY.create_processor(mc)
    tok = proc.info.get_tokenizer()
    prompt = tok.encode("<start_of_turn>user\n<start_of_image>Describe this image in detail.<end_of_turn>\n"
                        "<start_of_turn>model\n")
    n_miss, n_hit = (6, 40) if args.quick else (20, 150)

    def png(img: object) -> bytes:
        buf = io.BytesIO()
        img.save(buf, format="PNG")  # type: ignore[attr-defined]
        return buf.getvalue()

    def run(item: object, cache: object) -> None:
        items = proc.info.parse_mm_data({"image": [item]})
        proc.apply(ProcessorInputs(prompt=list(prompt), mm_data_items=items, cache=cache), TimingContext(enabled=False))

    def median_ms(fn: object, items: list[object]) -> float:
        samples = []
        for item in items:
            t0 = time.perf_counter()
            fn(item)  # type: ignore[operator]
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1e3

    io_ = ImageMediaIO()
    base = natural_image()
    base_png = png(base)
    out = {}
    cache = LruKeyReplicatedSenderCache(mc)
    run(natural_image(tag=99_999), cache)  # warm up
    miss_pil = [natural_image(tag=i + 1) for i in range(n_miss)]
    out["miss_pil_ms"] = median_ms(lambda im: run(im, cache), miss_pil)
    run(base, cache)
    out["hit_pil_ms"] = median_ms(lambda im: run(im, cache), [base] * n_hit)
    pngs = [png(natural_image(tag=1000 + i)) for i in range(n_miss)]
    out["png_decode_ms"] = median_ms(io_.load_bytes, pngs)
    loaded = [io_.load_bytes(b) for b in pngs]
    out["miss_png_ms"] = median_ms(lambda im: run(im, cache), loaded)
    hit_item = io_.load_bytes(base_png)
    run(hit_item, cache)
    out["hit_png_ms"] = median_ms(lambda im: run(im, cache), [hit_item] * n_hit)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
