"""A Qwen2.5-VL miss at real sizes, stage by stage, in mmfront and in vLLM 0.33's Python frontend
(issue 34, Build 2).

The folder is ``bench_frontends``' Qwen2.5-VL with the standard limits (``min_pixels`` 3136,
``max_pixels`` 12845056: a 1024x768 image becomes 1036x756 px, 999 tokens; a 1920x1080 one
1932x1092 px, 2,691 tokens); the images are 1024x768 and 1920x1080, as JPEG (Pillow's default
quality) and PNG, a new one every round (``natural_image``, one seed each). Per image, each stage
once, in the order a miss runs them; medians over rounds (the first round warms up):

* ``load + hash``: the data URL's bytes to a lazy item and its blake3 content hash
  (``MediaConnector.load_image`` + ``prehash_media``: mmfront hashes the bytes and decodes only on a
  miss); vLLM: ``hash`` (``MultiModalHasher`` over the item's original bytes);
* ``decode``: the lazy item's decode (a plain JPEG by libjpeg-turbo straight into numpy,
  :mod:`mmfront.media.jpeg`; PNG through ISA-L and Pillow); vLLM decodes as it loads (Pillow);
* ``to tensor``, ``resize``, ``patchify``: the HF image processor's steps, which vLLM runs as they
  are (the same transformers code), each against mmfront's (``qwen2_vl_speedups``): PIL to a CHW
  uint8 tensor (HF: a contiguous copy; mmfront: a view of the pixel array, a JPEG's decoded pixels
  as the transformers backend hands them, or the PIL image's), the bicubic
  antialiased uint8 resize of either (HF's contiguous tensor: torch's kernel; mmfront's view:
  :func:`mmfront.bicubic.resize_planes`, the same bytes into planes), and the patch rows (HF's
  ``patchify``; mmfront's :func:`mmfront.pixels.patch_rows`, one C pass); the results are asserted
  equal. Nothing is
  normalised: vLLM's engine normalises Qwen2-VL's uint8 rows on the device
  (``--mm-device-do-normalize``, its default for the class), and both frontends send uint8;
* ``kwargs merge``, ``dummy text``: what HF's processor call does besides the image processor, each
  once as it does it on every call: its merge and validation of the call's kwargs
  (``ProcessorMixin._merge_kwargs``, through :class:`mmfront.processing.hf.MergedHfKwargs` built
  afresh) and the tokenization of the dummy text, one image pad per token of the image. mmfront's
  transformers backend does neither on a Qwen2-VL miss now (``ModelSpec.image_expansions``): the
  image processor runs alone, with kwargs merged once per distinct set, and the expansion comes from
  the grid;
* ``apply``: the processor's ``apply()`` on a miss with the default sender cache, mmfront's with
  the lazy item (decode included) and, in the same round and alternating order, two processors of
  the before: one calling HF's processor as it did (``apply_call``: mmfront's pixel steps, HF's
  ``__call__`` on a dummy text) and one that also keeps HF's pixel steps (``apply_hf``); vLLM's with
  the item it loaded (decode not included);
* ``encode``: the miss's item through the wire encoder (``MsgpackEncoder``), ``send``: its frames
  over a ZMQ ``ipc://`` PUSH/PULL pair, received.

torch runs one intra-op thread on both sides, as mmfront's server runs it (its ``ThreadPlan``), and
each stage is timed in CPU time of the thread that runs it (``time.thread_time``; the send, whose
work ZMQ's I/O thread does, in wall time): on a shared machine wall time counts the other tenants'
turns too (a 4.7 MB tensor's fill took 32 ms of wall time with torch's 2 threads under a load of
10, 0.05 ms with one). vLLM's side runs in its peer venv (``benchmarks/peer/vllm_miss.py``), after mmfront's, on the same
images; without the peer its lines are skipped. vLLM's Rust frontend (``vllm-rs``) is a compiled
server with no stage hooks: its cost per request is ``bench_frontends``' CPU per request.
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import zmq

from _harness import Report
from bench_frontends import QWEN_STANDARD_MAX_PIXELS
from mmfront import MultiModalConfig
from mmfront.cache.lru import LruKeyReplicatedSenderCache
from mmfront.hashing import prehash_media
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.registry import create_processor
from mmfront.models.transformers import offsets_request_kwargs
from mmfront.processing.hf import MergedHfKwargs, resolve_hf_kwargs
from mmfront.processing.native import DEVICE_NORMALIZE_KWARGS
from mmfront.testing.media import natural_image
from mmfront.testing.peer import qwen2_5_vl_peer_folder, vllm_peer_python
from mmfront.wire import MsgpackEncoder
from peer.vllm_miss import cpu_timed, wall_timed

GROUP = "miss"
REPO = Path(__file__).resolve().parents[1]
CASES = ((1024, 768, "JPEG"), (1024, 768, "PNG"), (1920, 1080, "JPEG"), (1920, 1080, "PNG"))
STAGES = (("load_hash", "load + hash"), ("decode", "decode"), ("to_tensor_hf", "to tensor, HF's (a contiguous copy)"),
          ("to_tensor", "to tensor, mmfront's (a view)"), ("resize_hf", "resize of HF's tensor (torch uint8 bicubic)"),
          ("resize", "resize of mmfront's view"), ("patchify_hf", "patchify, HF's"),
          ("patchify", "patchify, mmfront's C pass"), ("merge", "kwargs merge, HF's (per call through HF's call)"),
          ("dummy_text", "dummy text tokenized (per call through HF's call)"),
          ("apply_hf", "apply() miss, HF's steps and HF's call"),
          ("apply_call", "apply() miss, mmfront's steps, HF's call (before)"),
          ("apply", "apply() miss, image processor alone (after)"), ("encode", "encode"),
          ("send", "send (ZMQ ipc, received)"))
VLLM_STAGES = (("hash", "hash"), ("decode", "decode (at load)"), ("to_tensor", "to tensor (HF)"),
               ("resize", "resize (HF)"), ("patchify", "patchify (HF)"), ("apply", "apply() miss, decoded item"),
               ("encode", "encode"), ("send", "send (ZMQ ipc, received)"))


def _encoded(width: int, height: int, fmt: str, seed: int) -> bytes:
    buf = io.BytesIO()
    natural_image(width, height, seed=seed).save(buf, format=fmt)
    return buf.getvalue()


class _Pipe:
    """A ZMQ PUSH/PULL pair over ``ipc://``: what one engine hop's transport costs."""

    def __init__(self, folder: str) -> None:
        self.context = zmq.Context()
        self.pull, self.push = self.context.socket(zmq.PULL), self.context.socket(zmq.PUSH)
        self.pull.bind(f"ipc://{folder}/miss")
        self.push.connect(f"ipc://{folder}/miss")

    def send(self, frames: list[Any]) -> None:
        self.push.send_multipart(frames, copy=False)
        self.pull.recv_multipart(copy=False)

    def close(self) -> None:
        self.push.close(0)
        self.pull.close(0)
        self.context.term()


def measure_mmfront(folder: Path, rounds: int, pipe: _Pipe) -> dict[str, dict[str, float]]:
    torch.set_num_threads(1)  # as mmfront's server runs torch (ThreadPlan)
    config = MultiModalConfig()
    proc: Any = create_processor(folder, config)
    before: Any = create_processor(folder, config)
    via_call: Any = create_processor(folder, config)
    hf_steps = type(before.info.hf_processor.image_processor)
    for step in ("patchify", "process_image"):  # mmfront's steps are the instance's: HF's methods again
        delattr(before.info.hf_processor.image_processor, step)
    for p in (before, via_call):  # HF's __call__ on a dummy text, as before ModelSpec.image_expansions
        p.image_expansions = None
    hf = proc.info.hf_processor
    call_kwargs = proc.call_kwargs(("image",), resolve_hf_kwargs(hf, config.mm_processor_kwargs, DEVICE_NORMALIZE_KWARGS),
                                   **offsets_request_kwargs())
    from transformers.image_utils import SizeDict  # after mmfront loaded a processor (its torchvision guard)

    ip = proc.info.hf_processor.image_processor
    factor = ip.patch_size * ip.merge_size
    size = SizeDict(shortest_edge=ip.size["shortest_edge"], longest_edge=ip.size["longest_edge"])
    prompt = proc.info.tokenizer.encode("Describe " + proc.get_placeholder_str("image", 0))
    caches = {id(p): LruKeyReplicatedSenderCache(config.mm_processor_cache_bytes) for p in (proc, before, via_call)}
    applied = {id(proc): "apply", id(before): "apply_hf", id(via_call): "apply_call"}
    connector = MediaConnector(config)
    encoder = MsgpackEncoder()

    def lazy(data: bytes) -> Any:
        item = connector.load_image(data, budget=DecodeBudget(config.max_media_request_decode_bytes))
        prehash_media(item, "image", config.mm_hasher_algorithm)
        return item

    out: dict[str, dict[str, float]] = {}
    for n, (width, height, fmt) in enumerate(CASES):
        samples: dict[str, list[float]] = {}
        for i in range(rounds + 1):  # the first round warms up
            data = _encoded(width, height, fmt, seed=1 + i + 1000 * n)
            times: dict[str, float] = {}
            times["load_hash"], item = cpu_timed(lazy, data)
            times["decode"], _ = cpu_timed(item.ensure_decoded, pixels=True)  # as for a processor that reads_pixels
            pixels = item.pixels  # a plain JPEG's, decoded straight into numpy; None for a PNG
            image = item.media  # what HF's steps take: the PIL image (made from those pixels, untimed)
            times["to_tensor_hf"], chw_hf = cpu_timed(hf_steps.process_image, ip, image, do_convert_rgb=True)
            source = image if pixels is None else torch.from_numpy(pixels).permute(2, 0, 1)  # as the backend hands it
            times["to_tensor"], chw = cpu_timed(ip.process_image, source, do_convert_rgb=True)
            times["resize_hf"], resized_hf = cpu_timed(ip.resize, chw_hf[None], size=size, resample=ip.resample,
                                                    factor=factor)
            times["resize"], resized = cpu_timed(ip.resize, chw[None], size=size, resample=ip.resample, factor=factor)
            assert torch.equal(resized, resized_hf), "the resize of mmfront's view differs from HF's"
            patch = {"patch_size": ip.patch_size, "merge_size": ip.merge_size,
                     "temporal_patch_size": ip.temporal_patch_size}
            times["patchify_hf"], (want, _, _) = cpu_timed(hf_steps.patchify, ip, resized, **patch)
            times["patchify"], (rows, _, _) = cpu_timed(ip.patchify, resized, **patch)
            assert torch.equal(rows, want), "mmfront's patch rows differ from HF's"
            times["merge"], _ = cpu_timed(MergedHfKwargs(hf), call_kwargs)
            pads = hf.image_token * (int(rows.shape[0]) // ip.merge_size**2)
            times["dummy_text"], _ = cpu_timed(hf.tokenizer, [pads], return_tensors="pt")
            order = (proc, via_call, before)
            for p in order[i % 3:] + order[:i % 3]:
                times[applied[id(p)]], result = cpu_timed(p.apply, prompt, {"image": [lazy(data)]}, cache=caches[id(p)])
                if p is proc:
                    kwargs_item = result["mm_kwargs"]["image"][0]
            assert kwargs_item is not None, "every round's image must be new (a miss)"
            times["encode"], frames = cpu_timed(encoder.encode, kwargs_item)
            times["send"], _ = wall_timed(pipe.send, frames)  # ZMQ's I/O thread does the work
            if i:
                for key, value in times.items():
                    samples.setdefault(key, []).append(value)
        out[f"{width}x{height} {fmt}"] = {key: statistics.median(v) * 1e3 for key, v in samples.items()}
    return out


def measure_vllm(folder: Path, rounds: int) -> dict[str, dict[str, float]] | None:
    python = vllm_peer_python()
    if python is None:
        return None
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO / "src"))
    cmd = [str(python), str(REPO / "benchmarks" / "peer" / "vllm_miss.py"), str(folder), json.dumps(CASES),
           "--rounds", str(rounds)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        print(f"  vLLM peer failed: {done.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    result: dict[str, dict[str, float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run(report: Report, quick: bool) -> None:
    rounds = 3 if quick else 8
    with tempfile.TemporaryDirectory(prefix="mmfront-bench-miss-") as name:
        folder = qwen2_5_vl_peer_folder(Path(name), QWEN_STANDARD_MAX_PIXELS)
        pipe = _Pipe(name)
        try:
            ours = measure_mmfront(folder, rounds, pipe)
        finally:
            pipe.close()
        theirs = measure_vllm(folder, rounds)
    for case, stages in ours.items():
        for key, label in STAGES:
            report.add(GROUP, f"Qwen2.5-VL {case}, mmfront: {label}", stages[key], "ms")
        report.ratio(GROUP, f"Qwen2.5-VL {case}: patchify, mmfront / HF", stages["patchify"] / stages["patchify_hf"])
        report.ratio(GROUP, f"Qwen2.5-VL {case}: apply() miss, image processor alone / HF's call",
                     stages["apply"] / stages["apply_call"], at_most=1.0)
        report.ratio(GROUP, f"Qwen2.5-VL {case}: apply() miss, mmfront / HF's steps and call",
                     stages["apply"] / stages["apply_hf"], at_most=1.0)
    if theirs is None:
        report.add(GROUP, "vLLM peer not found or failed: its stages skipped", 0.0, "")
        return
    for case, stages in theirs.items():
        for key, label in VLLM_STAGES:
            report.add(GROUP, f"Qwen2.5-VL {case}, vLLM: {label}", stages[key], "ms")
        mine = ours[case]
        report.ratio(GROUP, f"Qwen2.5-VL {case}: miss, mmfront (load + hash + apply) / vLLM (decode + hash + apply)",
                     (mine["load_hash"] + mine["apply"]) / (stages["decode"] + stages["hash"] + stages["apply"]))
    report.add(GROUP, f"({rounds} images a case, medians)", 0.0, "")
