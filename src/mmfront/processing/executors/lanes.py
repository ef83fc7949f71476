"""What the lane executors share: a job goes to the lanes as codec frames, one per item where the
processor's items are independent, and its reply comes back as items or the lane's error."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from concurrent.futures import Future

from mmfront.errors import ConfigError, LaneError
from mmfront.inputs import MultiModalKwargsItems
from mmfront.processing.executors.base import ItemExecutor, ItemJob, ItemProcessor
from mmfront.processing.executors.inplace import InPlaceExecutor
from mmfront.processing.executors.jobs import LaneReply, LaneSpec, encode_job, encode_warm_up
from mmfront.wire import Frame, MsgpackDecoder, MsgpackEncoder

_IN_PLACE = InPlaceExecutor()


class BaseLaneExecutor(ItemExecutor):
    """Runs jobs on ``size`` lanes, each with its own processor built from ``spec``.

    A job whose items cannot travel (an exotic item type, a non-data kwarg) is processed in place,
    and so is every job once the executor is closed (inputs prepared before :meth:`close` may
    process an item again when they are committed)."""

    def __init__(self, spec: LaneSpec, size: int) -> None:
        if size < 1:
            raise ConfigError(f"A lane executor needs at least 1 lane, got {size}.")
        self.spec = spec
        self.size = size
        self.closed = False
        self._encoder = MsgpackEncoder()
        self._decoder = MsgpackDecoder(LaneReply)

    def run(self, job: ItemJob, processor: ItemProcessor) -> MultiModalKwargsItems:
        parts = job.per_item() if processor.items_are_independent else [job]
        frames = [self.encode_job(part) for part in parts]
        if self.closed or any(f is None for f in frames):
            return _IN_PLACE.run(job, processor)
        futures = [self.submit_job(f) for f in frames if f is not None]
        results = [future.result() for future in futures]
        return results[0] if len(results) == 1 else MultiModalKwargsItems.merge(results)

    def warm_up(self, counts: Mapping[str, int], processor: ItemProcessor) -> None:
        """Warm the next free lane: it processes the dummy items and drops their outputs, so the
        server never holds them (nothing once the executor is closed: jobs then run in place)."""
        if self.closed:
            return
        reply: LaneReply = self._decoder.decode(self._submit(encode_warm_up(counts, self._encoder)).result())
        if reply.failure is not None:
            reply.failure.reraise()

    def encode_job(self, job: ItemJob) -> list[Frame] | None:
        """The frames of one job; ``None`` when it has no wire form."""
        return encode_job(job, self._encoder)

    def submit_job(self, frames: list[Frame]) -> Future[MultiModalKwargsItems]:
        """Run a job on the next free lane; the future holds its items, or the error processing
        them raised (the same mmfront type as in place), or :class:`LaneError`."""
        out: Future[MultiModalKwargsItems] = Future()

        def finish(raw: Future[list[Frame]]) -> None:
            try:
                reply: LaneReply = self._decoder.decode(raw.result())
                if reply.failure is not None:
                    reply.failure.reraise()
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


__all__ = ["BaseLaneExecutor"]
