"""``mmfront demo``: the main job, end to end, on the embedded default model.

Builds (once) the offline Gemma 3 processor at real sizes, then sends three chat requests with
images as PNG data URLs from the frontend (P0) to an engine-side receiver (P1, in process here):
the first request processes its image, the second reuses it from the cache and processes a new
one, the third is all cache hits. Before the third, P1's cache is cleared behind P0's back (what
vLLM reports as "P0/P1 cache drift" and fails the request for); the client notices, resends the
missing images itself, and the request is admitted all the same.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import torch

from mmfront.cache.factory import engine_receiver_cache_from_config
from mmfront.config import MultiModalConfig
from mmfront.engine.client import EngineClient, RequestAdmitted
from mmfront.engine.receiver import EngineReceiver
from mmfront.engine.transport import BaseTransport
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.models import default_model_dir
from mmfront.wire import EngineCoreRequest, Frame, MsgpackDecoder
from mmfront.wire.messages import REQUEST, decode_envelope


def _messages(urls: list[str], text: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


class _InProcessLink(BaseTransport):
    """P0 -> P1 -> P0 without a socket: envelopes queue up and are delivered in order; P1's
    replies queue up for :meth:`recv`."""

    def __init__(self, receiver: EngineReceiver) -> None:
        self.receiver = receiver
        self.to_engine: deque[list[Frame]] = deque()
        self.to_client: deque[list[Frame]] = deque()
        self.wire_bytes = 0
        self.sent: list[EngineCoreRequest] = []
        self.admitted: list[EngineCoreRequest] = []
        self._decode = MsgpackDecoder(EngineCoreRequest)

    def send(self, frames: Sequence[Frame]) -> None:
        frames = list(frames)
        self.wire_bytes += sum(len(memoryview(f)) for f in frames)
        envelope = decode_envelope(frames)
        if envelope.kind == REQUEST:
            self.sent.append(self._decode.decode(envelope.message))
        self.to_engine.append(frames)

    def recv(self, timeout: float | None = None) -> list[Frame] | None:
        return self.to_client.popleft() if self.to_client else None

    def close(self) -> None:
        self.to_engine.clear()
        self.to_client.clear()

    def pump(self, client: EngineClient) -> list[RequestAdmitted]:
        """Let P1 handle everything sent, and P0 everything P1 answered, until both are quiet."""
        events: list[RequestAdmitted] = []
        while self.to_engine:
            ready, replies = self.receiver.handle(self.to_engine.popleft())
            self.admitted += ready
            self.to_client.extend(replies)
            while (reply := self.recv()) is not None:
                events += [e for e in client.handle_reply(reply) if isinstance(e, RequestAdmitted)]
        return events


def _describe(sent: list[EngineCoreRequest], engine: EngineCoreRequest, seconds: float, wire: int) -> None:
    sends = []
    for attempt in sent:
        features = attempt.mm_features or []
        cached = sum(f.data is None for f in features)
        sends.append(f"{len(features) - cached} with data, {cached} as cache references")
    print(f"  {engine.request_id}: {len(engine.prompt_token_ids or [])} prompt tokens, "
          f"{len(engine.mm_features or [])} image(s); sent {' / resent '.join(sends)}; {seconds * 1e3:.1f} ms; "
          f"{wire:,} bytes on the wire")
    for f in engine.mm_features or []:
        assert f.data is not None
        shape = tuple(torch.as_tensor(f.data["pixel_values"].data).shape)
        print(f"    {f.modality} {(f.mm_hash or f.identifier)[:16]}…  placeholder offset={f.mm_position.offset} "
              f"length={f.mm_position.length} embeds={f.mm_position.get_num_embeds()}  engine has pixel_values "
              f"{shape}")


def run_demo(*, verbose: bool = False) -> int:
    t0 = time.perf_counter()
    model_dir = default_model_dir()
    print(f"default model: {model_dir} (ready in {time.perf_counter() - t0:.1f} s)")
    t0 = time.perf_counter()
    config = MultiModalConfig()
    preprocessor = InputPreprocessor(model_dir, config)
    preprocessor.warmup()
    receiver = EngineReceiver(engine_receiver_cache_from_config(config))
    link = _InProcessLink(receiver)
    client = EngineClient(InputProcessor(preprocessor), link)
    print(f"frontend: {type(preprocessor.processor).__name__} over {type(preprocessor.processor.info.hf_processor).__name__}, "
          f"P0 cache {type(preprocessor.cache).__name__}, P1 cache {type(receiver.cache).__name__} "
          f"(ready in {time.perf_counter() - t0:.1f} s)")

    urls = {"photo": image_data_url(make_image(1024, 768, seed=1)), "chart": image_data_url(make_image(640, 480, seed=2))}
    print(f"sample images as PNG data URLs: photo {len(urls['photo']):,} chars, chart {len(urls['chart']):,} chars")
    requests = [
        ("req-1", [urls["photo"]], "Describe this photo."),
        ("req-2", [urls["photo"], urls["chart"]], "Compare the photo with the chart."),
        ("req-3", [urls["chart"], urls["photo"]], "And the other way round?"),
    ]
    for request_id, request_urls, text in requests:
        if request_id == "req-3":
            receiver.reset_cache()
            print("  (P1's processor cache is cleared now; P0 still believes it holds both images)")
        t0 = time.perf_counter()
        before = link.wire_bytes
        client.add_request(request_id, _messages(request_urls, text))
        admitted = link.pump(client)
        seconds = time.perf_counter() - t0
        if not any(e.request_id == request_id for e in admitted):
            print(f"  {request_id} was not admitted")
            return 1
        engine = next(r for r in link.admitted if r.request_id == request_id)
        _describe([r for r in link.sent if r.request_id == request_id], engine, seconds, link.wire_bytes - before)
        if verbose:
            print(f"    prompt ids (first 12): {(engine.prompt_token_ids or [])[:12]}")
    stats, drift = preprocessor.stats, client.stats
    print(f"P0 cache: {stats.requests} requests, {stats.queries} item lookups, {stats.hits} hits; drift handled "
          f"without an error: {drift.resends} resend(s), {drift.shadow_resets} shadow reset(s); "
          f"{len(link.admitted)} of {len(requests)} requests admitted by the engine")
    return 0 if len(link.admitted) == len(requests) else 1
