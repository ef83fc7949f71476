"""vLLM 0.33's own video path for one clip, timed over the region ``bench_video.py`` times for
mmfront's miss: the clip's bytes through ``VideoMediaIO.load_bytes`` (the loader backend vLLM's
media connector picks for the model's video processor, OpenCV by default, default sampling), then
``parse_mm_data`` + ``apply`` with a fresh LRU sender cache. Prints one JSON object.

Runs inside the vLLM peer venv (with ``opencv-python-headless``), never in mmfront's:

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 PYTHONPATH=src \
        /tmp/vllm-peer-venv/bin/python benchmarks/peer/vllm_video.py MODEL_DIR CLIP PROMPT [--quick]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("clip")
    parser.add_argument("prompt")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()

    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.cache import LruKeyReplicatedSenderCache
    from vllm.multimodal.media import ImageMediaIO, VideoMediaIO
    from vllm.multimodal.processing import ProcessorInputs, TimingContext
    from vllm.multimodal.video import get_video_loader_backend_for_processor

    mc = ModelConfig(model=args.model_dir, tokenizer=args.model_dir, max_model_len=32768)
    proc = MULTIMODAL_REGISTRY.create_processor(mc)
    prompt = proc.info.get_tokenizer().encode(args.prompt)
    video_processor = type(proc.info.get_hf_processor().video_processor).__name__
    backend = get_video_loader_backend_for_processor(video_processor)
    kwargs = {"video_backend": backend} if backend else {}
    clip = Path(args.clip).read_bytes()

    def request() -> int:
        """What vLLM's chat path does with a video part's bytes, then the processor with a fresh cache."""
        video = VideoMediaIO(ImageMediaIO(), **kwargs).load_bytes(clip)
        items = proc.info.parse_mm_data({"video": [video]})
        proc.apply(ProcessorInputs(prompt=list(prompt), mm_data_items=items, cache=LruKeyReplicatedSenderCache(mc)),
                   TimingContext(enabled=False))
        return int(video.media[0].shape[0])

    frames = request()  # warm up
    misses = []
    for _ in range(2 if args.quick else 5):
        t0 = time.perf_counter()
        request()
        misses.append(time.perf_counter() - t0)
    print(json.dumps({"miss_ms": statistics.median(misses) * 1e3, "frames": frames,
                      "video_processor": video_processor, "backend": backend or "opencv"}))


if __name__ == "__main__":
    main()
