"""Processing lanes: the HF processing of cache misses, in worker processes or Ray actors.

Hashing, the P0 cache reads, the splice and the cache commit stay in the calling process, in
request order, so the P0/P1 mirror stays exact; only the HF call for a missing item (its image
decode included) moves to a lane. Each lane holds its own processor, built from the model folder
with the same classes and config, so an item processed on a lane is byte-identical to one
processed in place (``tests/processing/test_lanes.py`` checks it).

Nothing is pickled: a job and its reply are the codec's frames (:mod:`mmfront.wire.codec`).
Lazily loaded images travel as their encoded bytes and are decoded on the lane; decoded images
travel as raw pixels, arrays and tensors zero-copy. The prompt updates are not sent back (they
hold callables): the caller resolves them from the returned kwargs, which is cheap.

Two executors: :class:`LocalProcessLanes` (spawned processes fed over pipes, the default) and
:class:`RayLanes` (``pip install mmfront[ray]``: actors, for when one machine's cores are not
enough). A lane that dies fails the item it held with :class:`~mmfront.errors.LaneError` and is
restarted for the next one; nothing waits on a dead lane.
"""

from __future__ import annotations

import contextlib
import importlib
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import fields, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
import torch
from PIL import Image

from mmfront import errors
from mmfront.config import MultiModalConfig
from mmfront.errors import (
    ConfigError,
    DecodeError,
    EncodeError,
    LaneError,
    PromptUpdateError,
    TransportError,
    ValidationError,
)
from mmfront.inputs import MultiModalFieldElem, MultiModalFlatField, MultiModalKwargsItem, MultiModalKwargsItems
from mmfront.media.budget import DecodeBudget
from mmfront.media.image import load_image_bytes
from mmfront.parse import (
    AudioProcessorItems,
    ImageProcessorItems,
    MediaWithBytes,
    ModalityDataItems,
    MultiModalDataItems,
)
from mmfront.processing.hf import load_hf_processor
from mmfront.wire import Frame, MsgpackDecoder, MsgpackEncoder
from mmfront.wire.pipe import recv_frames, send_frames

if TYPE_CHECKING:
    from mmfront.processing.processor import BaseMultiModalProcessor

_POLL_S = 0.5
"""How often a caller waiting on a lane checks that the lane's process is still alive."""
_STOP_S = 5.0
"""How long a closing lane may take to exit before it is killed."""
_START_S = 600.0
"""How long a lane may take to import and build its processor (minutes on a loaded machine)."""
_SHARE_FROM = 1 << 20
"""Reply frames of at least this many bytes (pixel tensors) come back in shared memory: the
caller maps them rather than copying them off the socket into fresh memory (see
:mod:`mmfront.wire.pipe`). Below it the socket is as cheap."""

# --- messages ---------------------------------------------------------------------------------


class LaneSpec(msgspec.Struct, frozen=True):
    """What a lane needs to build the caller's processor: its classes by import path, the model
    folder and the config."""

    processor_cls: str
    info_cls: str
    model_dir: str
    model_id: str
    config: dict[str, Any]
    sys_path: list[str]

    @classmethod
    def of(cls, processor: BaseMultiModalProcessor) -> LaneSpec | None:
        """The spec of ``processor``; ``None`` when a lane cannot rebuild it: it was given a
        ready HF processor rather than a folder, or a class of it is not importable by name."""
        info = processor.info
        paths = [_import_path(type(processor)), _import_path(type(info))]
        if info.model_dir is None or None in paths:
            return None
        config = {f.name: getattr(info.config, f.name) for f in fields(info.config)}
        return cls(paths[0] or "", paths[1] or "", str(info.model_dir), info.model_id, config, list(sys.path))

    def build(self) -> BaseMultiModalProcessor:
        config = MultiModalConfig(**self.config)
        info = _resolve(self.info_cls)(load_hf_processor(Path(self.model_dir)), model_id=self.model_id,
                                       config=config, model_dir=self.model_dir)
        processor: BaseMultiModalProcessor = _resolve(self.processor_cls)(info)
        return processor


class _EncodedImage(msgspec.Struct, tag="encoded"):
    """A lazily loaded image: its bytes (an array, so they travel as an aux frame rather than a
    copy into the message body) and the conversion its loader recorded."""

    payload: np.ndarray
    io_config: dict[str, Any] | None


class _RawImage(msgspec.Struct, tag="pil"):
    mode: str
    width: int
    height: int
    pixels: np.ndarray


class _Array(msgspec.Struct, tag="array"):
    value: np.ndarray


class _Tensor(msgspec.Struct, tag="tensor"):
    value: torch.Tensor


_Media = _EncodedImage | _RawImage | _Array | _Tensor


class _Job(msgspec.Struct):
    items: dict[str, list[_Media]]
    hf_kwargs: dict[str, Any]


class _Failure(msgspec.Struct):
    kind: str
    message: str
    parameter: str | None = None


class _Reply(msgspec.Struct):
    items: MultiModalKwargsItems | None = None
    failure: _Failure | None = None


_CONTAINERS: dict[type[ModalityDataItems[Any, Any]], str] = {ImageProcessorItems: "image", AudioProcessorItems: "audio"}
_PALETTE_MODES = frozenset({"P", "PA"})


def _import_path(cls: type) -> str | None:
    if "<locals>" in cls.__qualname__ or cls.__module__ == "__main__":
        return None
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve(path: str) -> Any:
    module, _, qualname = path.partition(":")
    obj: Any = importlib.import_module(module)
    for name in qualname.split("."):
        obj = getattr(obj, name)
    return obj


def _media_of(container: ModalityDataItems[Any, Any], index: int) -> _Media | None:
    """How one item travels; ``None`` when it cannot (it is then processed in place). An image
    still undecoded travels as its bytes, and is decoded on the lane."""
    raw = container.get_item_for_hash(index)
    if isinstance(raw, MediaWithBytes) and not raw.is_decoded and "source_mode" in raw.info:
        return _EncodedImage(np.frombuffer(raw.original_bytes, np.uint8), raw.io_config)
    decoded = container.get(index)
    if isinstance(decoded, Image.Image):
        if decoded.mode in _PALETTE_MODES:
            return None
        return _RawImage(decoded.mode, decoded.width, decoded.height, np.frombuffer(decoded.tobytes(), np.uint8))
    if isinstance(decoded, np.ndarray) and decoded.dtype != object:
        return _Array(decoded)
    if isinstance(decoded, torch.Tensor):
        return _Tensor(decoded)
    return None


def _item_of(media: _Media, config: MultiModalConfig) -> object:
    if isinstance(media, _EncodedImage):
        options = media.io_config or {"image_mode": None}
        return load_image_bytes(media.payload.tobytes(), config=config, budget=DecodeBudget(config.max_media_request_decode_bytes),
                                media_io_kwargs={"image": options}, lazy=False)
    if isinstance(media, _RawImage):
        return Image.frombytes(media.mode, (media.width, media.height), media.pixels.tobytes())
    return media.value


def _failure_of(exc: BaseException) -> _Failure:
    if isinstance(exc, errors.MMFrontError):
        return _Failure(type(exc).__name__, str(exc), getattr(exc, "parameter", None))
    return _Failure("", f"{type(exc).__name__}: {exc}")


def _raise_failure(failure: _Failure) -> None:
    """Raise the error the lane raised, as the same mmfront type where it is one."""
    cls = getattr(errors, failure.kind, None) if failure.kind else None
    if isinstance(cls, type) and issubclass(cls, PromptUpdateError):
        raise cls(failure.message, modality=failure.parameter)
    if isinstance(cls, type) and issubclass(cls, ValidationError):
        raise cls(failure.message, parameter=failure.parameter)
    if isinstance(cls, type) and issubclass(cls, errors.MMFrontError) and cls is not errors.MMFrontError:
        raise cls(failure.message)
    raise LaneError(f"A processing lane failed: {failure.message}")


# --- the lane's side --------------------------------------------------------------------------


class _LaneProcessor:
    """One lane's processor and codec: job frames in, reply frames out."""

    def __init__(self, spec: LaneSpec) -> None:
        torch.set_num_threads(1)  # a lane is one runnable thread of the budget
        self.processor = spec.build()
        self.encoder = MsgpackEncoder()
        self.decoder = MsgpackDecoder(_Job)

    def run(self, frames: list[Frame]) -> list[Frame]:
        try:
            job: _Job = self.decoder.decode(frames)
            config = self.processor.info.config
            items = MultiModalDataItems()
            for modality, media in job.items.items():
                container = ImageProcessorItems if modality == "image" else AudioProcessorItems
                items[modality] = container([_item_of(m, config) for m in media])
            reply = _Reply(items=self.processor.process_hf_items(items, job.hf_kwargs))
        except Exception as exc:  # every failure goes back to the caller, typed
            reply = _Reply(failure=_failure_of(exc))
        return self.encoder.encode(reply)


def worker_main(fd: int) -> None:
    """A lane process (``python -c``, started by :class:`LocalProcessLanes` with its end of a
    socket pair as ``fd``): build the processor from the spec it is sent, then answer jobs until
    the caller closes its end."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the caller, which closes the lanes
    conn = Connection(fd)
    encoder = MsgpackEncoder()
    try:
        spec: LaneSpec = MsgpackDecoder(LaneSpec).decode(recv_frames(conn) or [b""])
        sys.path.extend(p for p in spec.sys_path if p not in sys.path)  # where the caller imports its classes from
        lane = _LaneProcessor(spec)
    except Exception as exc:  # the caller gets the reason instead of a dead pipe
        send_frames(conn, encoder.encode(_Reply(failure=_failure_of(exc))))
        return
    send_frames(conn, encoder.encode(_Reply()))
    while True:
        try:
            frames = recv_frames(conn)
        except (EOFError, TransportError):
            return
        if frames is not None:
            send_frames(conn, lane.run(frames), share_from=_SHARE_FROM)


# --- the caller's side ------------------------------------------------------------------------


class BaseLaneExecutor(ABC):
    """Runs HF processing jobs on lanes; thread-safe, so many requests can submit at once."""

    def __init__(self, spec: LaneSpec, size: int) -> None:
        if size < 1:
            raise ConfigError(f"A lane executor needs at least 1 lane, got {size}.")
        self.spec = spec
        self.size = size
        self._encoder = MsgpackEncoder()
        self._decoder = MsgpackDecoder(_Reply)

    def encode_job(self, items: MultiModalDataItems, hf_kwargs: Mapping[str, Any]) -> list[Frame] | None:
        """The frames of one job; ``None`` when an item or kwarg has no wire form (an exotic
        item type, a non-data kwarg), and the caller processes it in place."""
        media: dict[str, list[_Media]] = {}
        for modality, container in items.items():
            if _CONTAINERS.get(type(container)) != modality:
                return None
            media[modality] = []
            for index in range(container.get_count()):
                one = _media_of(container, index)
                if one is None:
                    return None
                media[modality].append(one)
        try:
            return self._encoder.encode(_Job(media, dict(hf_kwargs)))
        except EncodeError:
            return None

    def submit_job(self, frames: list[Frame]) -> Future[MultiModalKwargsItems]:
        """Run a job on the next free lane; the future holds its items, or the error processing
        them raised (the same mmfront type as in place), or :class:`LaneError`."""
        out: Future[MultiModalKwargsItems] = Future()

        def finish(raw: Future[list[Frame]]) -> None:
            try:
                reply: _Reply = self._decoder.decode(raw.result())
                if reply.failure is not None:
                    _raise_failure(reply.failure)
                if reply.items is None:
                    raise LaneError("A processing lane answered without items or an error.")
                out.set_result(reply.items)
            except Exception as exc:
                out.set_exception(exc)

        self._submit(frames).add_done_callback(finish)
        return out

    @abstractmethod
    def _submit(self, frames: list[Frame]) -> Future[list[Frame]]:
        """Send one job's frames to a lane; the future holds the reply's frames, or LaneError."""

    @abstractmethod
    def close(self) -> None:
        """Stop every lane (idempotent); jobs still queued fail with :class:`LaneError`."""

    def __enter__(self) -> BaseLaneExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Worker:
    """One lane process and the caller's end of its socket.

    Started with ``python -c``, not ``multiprocessing``: a spawned process would import the
    caller's ``__main__`` again (a script without a ``__main__`` guard would run twice), and a
    forked one would inherit the caller's threads and locks.
    """

    def __init__(self, spec_frames: list[Frame], name: str) -> None:
        self.name = name
        ours, theirs = socket.socketpair()
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-c", f"from mmfront.processing.lanes import worker_main; worker_main({theirs.fileno()})"],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
        self.conn = Connection(ours.detach())  # reaches EOF when the process dies
        try:
            send_frames(self.conn, spec_frames)
            reply: _Reply = MsgpackDecoder(_Reply).decode(self._recv(deadline=time.monotonic() + _START_S))
        except LaneError:
            self.stop()
            raise
        except (TransportError, DecodeError) as exc:
            self.stop()
            raise LaneError(f"Processing lane {name} failed to start: {exc}") from exc
        if reply.failure is not None:
            self.stop()
            raise LaneError(f"A processing lane could not build the processor: {reply.failure.message}")

    def call(self, frames: list[Frame]) -> list[Frame]:
        try:
            send_frames(self.conn, frames)
        except TransportError:
            raise self._died() from None
        return self._recv()

    def _recv(self, deadline: float | None = None) -> list[Frame]:
        try:
            while not self.conn.poll(_POLL_S):
                if self.process.poll() is not None:
                    raise self._died()
                if deadline is not None and time.monotonic() > deadline:
                    raise LaneError(f"Processing lane {self.name} did not build its processor within {_START_S:g} s.")
            frames = recv_frames(self.conn, accept_shared=True)
        except (EOFError, TransportError):
            raise self._died() from None
        assert frames is not None
        return frames

    def _died(self) -> LaneError:
        try:
            code: int | None = self.process.wait(_STOP_S)
        except subprocess.TimeoutExpired:
            code = None
        return LaneError(f"Processing lane {self.name} (pid {self.process.pid}) exited with code {code} while it "
                         "held an item; the lane restarts, send the request again.")

    def stop(self) -> None:
        self.conn.close()
        try:
            self.process.wait(_STOP_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class LocalProcessLanes(BaseLaneExecutor):
    """``size`` spawned processes, each with its own processor, fed over pipes.

    One thread per lane takes the next job from a shared queue, so a free lane always takes the
    next item. The processes start in the background at construction (warm-up); jobs submitted
    before a lane is up wait for it.
    """

    def __init__(self, spec: LaneSpec, size: int) -> None:
        super().__init__(spec, size)
        self._spec_frames = self._encoder.encode(spec)
        self._jobs: queue.SimpleQueue[tuple[list[Frame], Future[list[Frame]]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._closed = False
        self._workers: list[_Worker | None] = [None] * size
        self._threads = [threading.Thread(target=self._run_lane, args=(i,), name=f"mmfront-lane-{i}", daemon=True)
                         for i in range(size)]
        for thread in self._threads:
            thread.start()

    def pids(self) -> list[int | None]:
        """The lanes' process ids (``None`` for a lane not running now)."""
        return [None if w is None else w.process.pid for w in self._workers]

    def _submit(self, frames: list[Frame]) -> Future[list[Frame]]:
        future: Future[list[Frame]] = Future()
        with self._lock:
            if self._closed:
                raise LaneError("The processing lanes are closed; create the preprocessor again.")
            self._jobs.put((frames, future))
        return future

    def _start(self, index: int) -> _Worker:
        try:
            worker = _Worker(self._spec_frames, name=f"mmfront-lane-{index}")
        except OSError as exc:  # no process could be started (limits, memory)
            raise LaneError(f"Could not start processing lane {index}: {exc}") from exc
        self._workers[index] = worker
        return worker

    def _run_lane(self, index: int) -> None:
        worker: _Worker | None = None
        with contextlib.suppress(LaneError):  # the first job on this lane starts it again and reports why not
            worker = self._start(index)
        while (job := self._jobs.get()) is not None:
            frames, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                if worker is None:
                    worker = self._start(index)
                future.set_result(worker.call(frames))
            except Exception as exc:  # the lane thread must survive whatever a lane does
                future.set_exception(exc if isinstance(exc, LaneError) else LaneError(f"Processing lane {index} failed: {exc}"))
                if worker is not None:
                    worker.stop()
                worker = self._workers[index] = None
        if worker is not None:
            worker.stop()
        self._workers[index] = None

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in self._threads:
                self._jobs.put(None)
        for thread in self._threads:
            thread.join()


class _RayLane:
    """A Ray actor's body: one lane processor, codec frames in and out."""

    def __init__(self, spec_frames: list[bytes]) -> None:
        self.lane = _LaneProcessor(MsgpackDecoder(LaneSpec).decode(spec_frames))

    def run(self, frames: list[bytes]) -> list[bytes]:
        return [bytes(f) for f in self.lane.run([bytearray(f) for f in frames])]


class RayLanes(BaseLaneExecutor):
    """``size`` Ray actors of one CPU each; a job goes to the actor with the fewest in flight.

    Connects to the Ray the process already initialized (``ray.init(address=...)`` for a
    cluster), else Ray starts a local one. A dead actor is restarted by Ray; the job it held fails
    with :class:`LaneError`.
    """

    def __init__(self, spec: LaneSpec, size: int) -> None:
        super().__init__(spec, size)
        try:
            import ray
        except ImportError as exc:
            raise ConfigError("mm_lane_executor='ray' needs Ray: pip install 'mmfront[ray]'.") from exc
        self._ray = ray
        actor: Any = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=0)(_RayLane)
        spec_frames = [bytes(f) for f in self._encoder.encode(spec)]
        self._actors: list[Any] = [actor.remote(spec_frames) for _ in range(size)]
        self._in_flight = [0] * size
        self._lock = threading.Lock()
        self._closed = False

    def _submit(self, frames: list[Frame]) -> Future[list[Frame]]:
        with self._lock:
            if self._closed:
                raise LaneError("The processing lanes are closed; create the preprocessor again.")
            index = min(range(self.size), key=self._in_flight.__getitem__)
            self._in_flight[index] += 1
            ref = self._actors[index].run.remote([bytes(memoryview(f)) for f in frames])
        out: Future[list[Frame]] = Future()

        def done(raw: Future[Any]) -> None:
            with self._lock:
                self._in_flight[index] -= 1
            try:
                out.set_result([bytearray(f) for f in raw.result()])
            except self._ray.exceptions.RayError as exc:
                out.set_exception(LaneError(f"Ray processing lane {index} failed while it held an item ({exc}); "
                                            "send the request again."))

        ref.future().add_done_callback(done)
        return out

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for actor in self._actors:
            self._ray.kill(actor)


def merge_item_results(parts: Sequence[MultiModalKwargsItems]) -> MultiModalKwargsItems:
    """The items of per-item jobs as one HF call over all of them would have split them: each
    flat field's slice moves past the rows of the items before it (item 1 of a call holds
    ``slice(1, 2)``, not ``slice(0, 1)``), so the result is byte-identical to processing in place."""
    merged: dict[str, list[MultiModalKwargsItem | None]] = {}
    offsets: dict[tuple[str, str], int] = {}
    for part in parts:
        for modality, items in part.items():
            out = merged.setdefault(modality, [])
            for item in items:
                out.append(None if item is None else _placed(item, modality, offsets))
    return MultiModalKwargsItems(merged)


def _placed(item: MultiModalKwargsItem, modality: str, offsets: dict[tuple[str, str], int]) -> MultiModalKwargsItem:
    out = MultiModalKwargsItem()
    for key, elem in item.items():
        field = elem.field
        if isinstance(field, MultiModalFlatField) and len(field.slices) == 1:
            rows = len(elem.data) if field.dim == 0 and isinstance(elem.data, list) else \
                int(elem.data.shape[field.dim]) if isinstance(elem.data, torch.Tensor) else None
            if rows is not None:
                offset = offsets.get((modality, key), 0)
                offsets[(modality, key)] = offset + rows
                field = replace(field, slices=[_shifted(field.slices[0], field.dim, offset)])  # type: ignore[arg-type]
        out[key] = MultiModalFieldElem(elem.data, field)
    return out


def _shifted(where: slice | tuple[slice, ...], dim: int, offset: int) -> slice | tuple[slice, ...]:
    if isinstance(where, slice):
        return slice((where.start or 0) + offset, (where.stop or 0) + offset, where.step)
    axis = where[dim]
    return (*where[:dim], slice((axis.start or 0) + offset, (axis.stop or 0) + offset, axis.step), *where[dim + 1:])


def lanes_for(processor: BaseMultiModalProcessor, config: MultiModalConfig, size: int) -> BaseLaneExecutor | None:
    """The executor ``config`` asks for, with ``size`` lanes; ``None`` for in-place processing
    (``size`` 0, or lanes left to the default for a processor no lane can rebuild)."""
    if size == 0:
        return None
    spec = LaneSpec.of(processor)
    if spec is None:
        if config.mm_processing_lanes is None:
            return None
        raise ConfigError(
            f"mm_processing_lanes={config.mm_processing_lanes} needs a processor a lane can rebuild: one created "
            f"from a model folder (create_processor(folder)), with classes importable by name; "
            f"{type(processor).__name__} is not. Set mm_processing_lanes=0 to process in place.")
    if config.mm_lane_executor == "ray":
        return RayLanes(spec, size)
    return LocalProcessLanes(spec, size)


__all__ = ["BaseLaneExecutor", "LaneSpec", "LocalProcessLanes", "RayLanes", "lanes_for", "merge_item_results"]
