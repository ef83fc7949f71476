"""vLLM 0.33's Qwen2.5-VL miss stage by stage, measured the way ``bench_miss.py`` measures mmfront.

Runs inside the vLLM peer venv, never in mmfront's; prints one JSON object: per case (``WxH FORMAT``)
the median ms of each stage. Same images (``mmfront.testing.media.natural_image``, one seed each: a
tag's few pixels can vanish in a JPEG; imported via PYTHONPATH=src), same folder, same stages where vLLM has them:

* ``decode``: ``ImageMediaIO.load_bytes`` (vLLM decodes as it loads a data URL's bytes);
* ``hash``: ``MultiModalHasher.hash_kwargs`` of the loaded item (its original bytes);
* ``to_tensor``, ``resize``, ``patchify``: the HF image processor's own steps (vLLM's Qwen2-VL
  processor calls HF's), on the decoded image;
* ``apply``: ``apply()`` on a miss, the item loaded beforehand (vLLM's default sender cache);
* ``encode``: ``MsgpackEncoder.encode`` of the miss's item; ``send``: its frames over a ZMQ ``ipc://``
  PUSH/PULL pair, received.

torch runs one intra-op thread and stages are timed in thread CPU time (the send in wall time), as on
mmfront's side.

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 PYTHONPATH=src \
        /tmp/vllm-peer-venv/bin/python benchmarks/peer/vllm_miss.py MODEL_DIR CASES_JSON [--rounds N]
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any


def cpu_timed(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    """The CPU time of the calling thread in ``fn`` (every stage but the send runs in it, torch on
    one thread): on a shared machine wall time would count the other tenants' turns too. Also
    ``bench_miss.py``'s, so both sides time alike."""
    start = time.thread_time()
    value = fn(*args, **kwargs)
    return time.thread_time() - start, value


def wall_timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    value = fn(*args)
    return time.perf_counter() - start, value


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("cases", help='JSON list of [width, height, "JPEG"|"PNG"]')
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()

    import torch
    import zmq
    from transformers.image_utils import SizeDict
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.multimodal.cache import LruKeyReplicatedSenderCache
    from vllm.multimodal.hasher import MultiModalHasher
    from vllm.multimodal.media import ImageMediaIO
    from vllm.multimodal.processing import ProcessorInputs, TimingContext
    from vllm.v1.serial_utils import MsgpackEncoder

    from mmfront.testing.media import natural_image

    torch.set_num_threads(1)  # as bench_miss.py runs mmfront's side
    mc = ModelConfig(model=args.model_dir, tokenizer=args.model_dir, max_model_len=20480)
    proc = MULTIMODAL_REGISTRY.create_processor(mc)
    cache = LruKeyReplicatedSenderCache(mc)
    hf = proc.info.get_hf_processor()
    ip = hf.image_processor
    prompt = proc.info.get_tokenizer().encode("Describe <|vision_start|><|image_pad|><|vision_end|>")
    encoder = MsgpackEncoder()
    algorithm = mc.multimodal_config.mm_hasher_algorithm
    media_io = ImageMediaIO()
    factor = ip.patch_size * ip.merge_size
    size = SizeDict(shortest_edge=ip.size["shortest_edge"], longest_edge=ip.size["longest_edge"])

    context = zmq.Context()
    folder = tempfile.mkdtemp(prefix="vllm-miss-")
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    pull.bind(f"ipc://{folder}/s")
    push.connect(f"ipc://{folder}/s")

    def send(frames: list[Any]) -> None:
        push.send_multipart(frames, copy=False)
        pull.recv_multipart(copy=False)

    out: dict[str, dict[str, float]] = {}
    for n, (width, height, fmt) in enumerate(json.loads(args.cases)):
        samples: dict[str, list[float]] = {}
        for i in range(args.rounds + 1):  # the first round warms up
            buf = io.BytesIO()
            natural_image(width, height, seed=1 + i + 1000 * n).save(buf, format=fmt)
            data = buf.getvalue()
            times: dict[str, float] = {}
            times["decode"], item = cpu_timed(media_io.load_bytes, data)
            times["hash"], _ = cpu_timed(MultiModalHasher.hash_kwargs, algorithm, model_id=args.model_dir, image=item)
            times["to_tensor"], chw = cpu_timed(ip.process_image, item.media, do_convert_rgb=True)
            times["resize"], resized = cpu_timed(ip.resize, chw[None], size=size, resample=ip.resample, factor=factor)
            times["patchify"], _ = cpu_timed(ip.patchify, resized, ip.patch_size, ip.merge_size, ip.temporal_patch_size)
            inputs = ProcessorInputs(prompt=list(prompt), mm_data_items=proc.info.parse_mm_data({"image": [item]}),
                                     cache=cache)
            times["apply"], result = cpu_timed(proc.apply, inputs, TimingContext(enabled=False))
            kwargs_item = result["mm_kwargs"]["image"][0]
            assert kwargs_item is not None, "every round's image must be new (a miss)"
            times["encode"], frames = cpu_timed(encoder.encode, kwargs_item)
            times["send"], _ = wall_timed(send, frames)  # ZMQ's I/O thread does the work
            if i:
                for key, value in times.items():
                    samples.setdefault(key, []).append(value)
        out[f"{width}x{height} {fmt}"] = {key: statistics.median(v) * 1e3 for key, v in samples.items()}
    push.close(0)
    pull.close(0)
    context.term()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
