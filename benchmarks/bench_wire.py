"""P0 -> P1 transfer of one request holding a (5, 3, 896, 896) float32 tensor (48 MB) over ``ipc://``,
mmfront against vLLM 0.33's encoder + ZMQ path, measured the same way in the same run.

Timed region on both sides, per hop: encode the ``EngineCoreRequest``, send it on P0's ROUTER,
receive it on the engine's DEALER, decode it (tensors as views of the received frames). mmfront
goes through its transports as they are by default (``ZmqFrontendTransport`` ->
``ZmqEngineTransport``, envelope and vLLM frame layout included, the 48 MB frame on the ``ipc``
side channel: written once into a sealed memfd that the engine maps); vLLM's peer
(``benchmarks/peer/vllm_wire.py``, in its own venv) uses its ``MsgpackEncoder``/``MsgpackDecoder``
on the same sockets. The two sides run alternately, a few rounds each, and each side's figure is
the median of its round medians, so a burst of load on the shared machine hits both.

With the shm cache the tensor goes into the shared-memory ring once and the wire carries only
the signed handle: that hop adds the put (one copy into warm ring pages) and the receiver's
zero-copy resolve, and its frames are asserted to be small.

The rows under "where time goes": the codec alone; the same hop with the side channel off (plain
ZMQ frames, what vLLM does: the unix socket moves 48 MB, a copy into the kernel and a copy out
into a fresh buffer); one memcpy of the tensor; and the engine's first read of every byte of the
tensor it received over the side channel (its pages are mapped, not copied, so the first touch
is where they fault in; a socket's fresh buffer costs as much to read).

The peer: :func:`mmfront.testing.peer.vllm_peer_python` (``MMFRONT_VLLM_PEER``, default /tmp/vllm-peer-venv);
without it the ratios are skipped.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch

from _harness import Report
from mmfront.cache.shm_cache import ShmObjectStoreReceiverCache, ShmObjectStoreSenderCache
from mmfront.engine.transports.zmq import ZmqEngineTransport, ZmqFrontendTransport
from mmfront.inputs import (
    MultiModalBatchedField,
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    PlaceholderRange,
)
from mmfront.testing.peer import vllm_peer_python
from mmfront.wire import EngineCoreRequest, MsgpackEncoder, SamplingParams, frame_view
from mmfront.wire.messages import REQUEST, Direction, decode_message, encode_envelope

GROUP = "wire (5,3,896,896) f32"
SHAPE = (5, 3, 896, 896)
MM_HASH = "9" * 64
REPO = Path(__file__).resolve().parents[1]
HANDLE_WIRE_LIMIT = 16 << 10
"""What the shm hop may put on the wire in all (the prompt's 1324 token ids are most of it)."""


def _request(data: MultiModalKwargsItem | None, mm_hash: str = MM_HASH) -> EngineCoreRequest:
    """The request vLLM's peer builds too: 5 crops of 260 tokens, 1324 prompt ids, greedy."""
    feature = MultiModalFeatureSpec(data, "image", mm_hash, PlaceholderRange(3, 5 * 260), mm_hash)
    return EngineCoreRequest("chatcmpl-0123456789abcdef-0", list(range(2, 2 + 5 * 260 + 24)), [feature],
                             SamplingParams(max_tokens=64, temperature=0.0), None, time.time(), None, None, None)


def _item(pixels: torch.Tensor) -> MultiModalKwargsItem:
    return MultiModalKwargsItem({"pixel_values": MultiModalFieldElem(pixels, MultiModalBatchedField())})


def _median_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


class _Peer:
    """vLLM's hop in its own venv, kept running so each round costs no import."""

    def __init__(self, python: Path) -> None:
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", HF_HUB_OFFLINE="1")
        self._proc = subprocess.Popen([str(python), str(REPO / "benchmarks" / "peer" / "vllm_wire.py")], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.frame_bytes: list[int] = self._read()["frame_bytes"]

    def _read(self) -> dict[str, Any]:
        stdout: IO[str] | None = self._proc.stdout
        line = stdout.readline() if stdout is not None else ""
        if not line:
            raise RuntimeError(f"the vLLM peer exited with code {self._proc.wait(60)}")
        result: dict[str, Any] = json.loads(line)
        return result

    def round(self, reps: int) -> float:
        assert self._proc.stdin is not None
        self._proc.stdin.write(f"{reps}\n")
        self._proc.stdin.flush()
        return float(self._read()["hop_ms"])

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(60)


def _start_peer() -> _Peer | None:
    python = vllm_peer_python()
    if python is None:
        return None
    try:
        return _Peer(python)
    except (RuntimeError, json.JSONDecodeError) as e:
        print(f"  vLLM peer failed: {e}", file=sys.stderr)
        return None


class _Link:
    """mmfront's P0 and engine ends over ``ipc://``, and the shm ring, with one hop of each kind."""

    def __init__(self, pixels: torch.Tensor, ring_slots: int) -> None:
        self.pixels = pixels
        self.request = _request(_item(pixels))
        self.encoder = MsgpackEncoder()
        self.nbytes = pixels.numel() * pixels.element_size()
        self.sender = ShmObjectStoreSenderCache(ring_slots * self.nbytes + (1 << 20),
                                                max_object_size=self.nbytes + (1 << 20))
        self.receiver = ShmObjectStoreReceiverCache(self.sender.shm_name, zero_copy=True)
        self.p0 = ZmqFrontendTransport("ipc")
        self.engine = ZmqEngineTransport(self.p0.addresses, engine_index=0)
        self.p0.wait_for_engines([0], timeout=30)
        self.p0_plain = ZmqFrontendTransport("ipc", side_channel_min_bytes=None)
        self.engine_plain = ZmqEngineTransport(self.p0_plain.addresses, engine_index=0)
        self.p0_plain.wait_for_engines([0], timeout=30)
        self.wire_bytes: list[int] = []
        """The frame sizes of the last envelope sent."""
        self._keys = iter(range(1 << 30))

    def send(self, request: EngineCoreRequest, plain: bool = False) -> EngineCoreRequest:
        envelope = encode_envelope(REQUEST, self.encoder.encode(request))
        self.wire_bytes = [frame_view(f, i).nbytes for i, f in enumerate(envelope)]
        p0, engine = (self.p0_plain, self.engine_plain) if plain else (self.p0, self.engine)
        p0.send(envelope)
        frames = engine.recv(timeout=30)
        assert frames is not None, "the engine transport received nothing"
        return decode_message(frames, Direction.TO_ENGINE).body

    def hop(self) -> EngineCoreRequest:
        return self.send(self.request)

    def shm_hop(self) -> None:
        """A miss through the ring (a new key each time): put, send the handle, resolve it."""
        key = f"{MM_HASH[:-8]}{next(self._keys):08d}"
        self.sender.begin_request(key)
        handle, _ = self.sender.get_and_update_item((_item(self.pixels), ()), key)
        self.sender.release_sender_touches()
        assert handle is not None and "pixel_values" not in handle, "the ring was full: the item went inline"
        got = self.send(_request(handle, key))
        self.receiver.get_and_update_features(got.mm_features or [])
        self.receiver.release_reads()
        self.sender.on_request_finished(key)

    def codec_only(self) -> None:
        envelope = encode_envelope(REQUEST, self.encoder.encode(self.request))
        decode_message(envelope, Direction.TO_ENGINE)

    def plain_hop(self) -> EngineCoreRequest:
        return self.send(self.request, plain=True)

    def first_read_ms(self) -> float:
        """A fresh hop's tensor read once, end to end, by the engine (median of 3)."""
        samples = []
        for _ in range(3):
            got = self.hop().mm_features[0].data  # type: ignore[index]
            assert got is not None
            tensor = got["pixel_values"].data
            t0 = time.perf_counter()
            tensor.sum()  # type: ignore[union-attr]
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1e3

    def close(self) -> None:
        self.engine.close()
        self.p0.close()
        self.engine_plain.close()
        self.p0_plain.close()
        self.receiver.close()
        self.sender.close()


def run(report: Report, quick: bool) -> None:
    rounds, reps, ring_slots = (2, 5, 3) if quick else (4, 8, 3)
    pixels = torch.rand(SHAPE, generator=torch.Generator().manual_seed(0))
    link = _Link(pixels, ring_slots)
    peer = _start_peer()
    try:
        got = link.hop().mm_features[0].data  # type: ignore[index]
        assert got is not None and torch.equal(got["pixel_values"].data, pixels)  # type: ignore[arg-type]
        assert link.wire_bytes[3] == link.nbytes, f"the tensor travels as one aux frame, got {link.wire_bytes}"
        for _ in range(2 * ring_slots):  # two laps: every page of the ring has been written once
            link.shm_hop()
        shm_wire = sum(link.wire_bytes)
        assert shm_wire < HANDLE_WIRE_LIMIT, f"with shm only the handle travels, got frames {link.wire_bytes}"
        ours, theirs, shm = [], [], []
        for _ in range(rounds):
            if peer is not None:
                theirs.append(peer.round(reps))
            ours.append(_median_ms(link.hop, reps))
            shm.append(_median_ms(link.shm_hop, reps))
        codec_ms = _median_ms(link.codec_only, reps)
        plain_ms = _median_ms(link.plain_hop, reps)
        first_read_ms = link.first_read_ms()
        source = memoryview(pixels.numpy().data).cast("B")
        warm = memoryview(bytearray(source.nbytes))
        memcpy_ms = _median_ms(lambda: warm.__setitem__(slice(None), source), reps)
    finally:
        if peer is not None:
            peer.close()
        link.close()
    mmfront_ms, shm_ms = statistics.median(ours), statistics.median(shm)
    report.add(GROUP, "mmfront ipc hop (encode+send+recv+decode; side channel)", mmfront_ms, "ms")
    report.add(GROUP, f"mmfront shm hop (put+handle hop+resolve; wire {shm_wire} B)", shm_ms, "ms")
    report.add(GROUP, "where time goes: mmfront codec alone (no socket)", codec_ms, "ms")
    report.add(GROUP, "where time goes: mmfront ipc hop, side channel off (plain ZMQ)", plain_ms, "ms")
    report.add(GROUP, "where time goes: one memcpy of 48 MB into warm memory", memcpy_ms, "ms")
    report.add(GROUP, "where time goes: engine's first read of the mapped tensor", first_read_ms, "ms")
    if peer is None:
        report.add(GROUP, "vLLM peer not found: ratios skipped", 0.0, "")
        return
    assert peer.frame_bytes[1] == link.nbytes, f"vLLM sends the tensor as one aux frame, got {peer.frame_bytes}"
    vllm_ms = statistics.median(theirs)
    report.add(GROUP, "vLLM ipc hop (encode+send+recv+decode)", vllm_ms, "ms")
    report.ratio(GROUP, "ipc: vLLM / mmfront (speed-up)", vllm_ms / mmfront_ms, at_least=1.5)
    report.ratio(GROUP, "shm: vLLM ipc / mmfront shm (speed-up)", vllm_ms / shm_ms)
