"""``mmfront demo``: the main job, end to end, on the embedded default model.

Builds (once) the offline Gemma 3 processor at real sizes, then turns three chat requests with
images sent as PNG data URLs into ``EngineCoreRequest``s and encodes them for the wire: the first
request processes its image, the second reuses it from the cache and processes a new one, the
third is all cache hits and sends no image data at all.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from mmfront.config import MultiModalConfig
from mmfront.engine.codec import MsgpackEncoder
from mmfront.engine.structs import EngineCoreRequest
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.models import default_model_dir


def _messages(urls: list[str], text: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def _describe(request: EngineCoreRequest, seconds: float, frames: list[Any], verbose: bool) -> None:
    features = request.mm_features or []
    sent = [f for f in features if f.data is not None]
    print(f"  {request.request_id}: {len(request.prompt_token_ids or [])} prompt tokens, {len(features)} image(s), "
          f"{len(sent)} sent with data, {len(features) - len(sent)} left to the engine cache; "
          f"{seconds * 1e3:.1f} ms; wire: {len(frames)} frame(s), {sum(len(memoryview(f)) for f in frames):,} bytes")
    for f in features:
        shape = tuple(torch.as_tensor(f.data["pixel_values"].data).shape) if f.data is not None else "cached in P1"
        print(f"    {f.modality} {(f.mm_hash or f.identifier)[:16]}…  placeholder offset={f.mm_position.offset} "
              f"length={f.mm_position.length} embeds={f.mm_position.get_num_embeds()}  pixel_values={shape}")
    if verbose:
        print(f"    prompt ids (first 12): {(request.prompt_token_ids or [])[:12]}")


def run_demo(*, verbose: bool = False) -> int:
    t0 = time.perf_counter()
    model_dir = default_model_dir()
    print(f"default model: {model_dir} (ready in {time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    preprocessor = InputPreprocessor(model_dir, MultiModalConfig())
    processor = InputProcessor(preprocessor)
    print(f"processor: {type(preprocessor.processor).__name__} over "
          f"{type(preprocessor.processor.info.hf_processor).__name__}, cache: {type(preprocessor.cache).__name__} "
          f"(loaded in {time.perf_counter() - t0:.1f} s)")

    photo, chart = make_image(1024, 768, seed=1), make_image(640, 480, seed=2)
    urls = {"photo": image_data_url(photo), "chart": image_data_url(chart)}
    print(f"sample images as PNG data URLs: photo {len(urls['photo']):,} chars, chart {len(urls['chart']):,} chars")
    requests = [
        ("req-1", [urls["photo"]], "Describe this photo."),
        ("req-2", [urls["photo"], urls["chart"]], "Compare the photo with the chart."),
        ("req-3", [urls["chart"], urls["photo"]], "And the other way round?"),
    ]
    encoder = MsgpackEncoder()
    for request_id, request_urls, text in requests:
        t0 = time.perf_counter()
        request = processor.process_inputs(request_id, _messages(request_urls, text))
        seconds = time.perf_counter() - t0
        _describe(request, seconds, encoder.encode(request), verbose)
    stats = preprocessor.stats
    print(f"cache: {stats.requests} requests, {stats.queries} item lookups, {stats.hits} hits "
          f"(hit ratio {stats.hit_ratio:.0%})")
    return 0
