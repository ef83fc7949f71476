"""Lanes as Ray actors (``pip install mmfront[ray]``), for when one machine's cores are not enough."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

from mmfront.errors import ConfigError, LaneError
from mmfront.processing.executors.jobs import LaneRunner, LaneSpec
from mmfront.processing.executors.lanes import BaseLaneExecutor
from mmfront.wire import Frame, MsgpackDecoder


class _RayLane:
    """A Ray actor's body: one lane, codec frames in and out."""

    def __init__(self, spec_frames: list[bytes]) -> None:
        self.lane = LaneRunner(MsgpackDecoder(LaneSpec).decode(spec_frames))

    def run(self, frames: list[bytes]) -> list[bytes]:
        return [bytes(f) for f in self.lane.run([bytearray(f) for f in frames])]


class RayExecutor(BaseLaneExecutor):
    """``size`` Ray actors of one CPU each (``mm_lane_executor="ray"``); a job goes to the actor
    with the fewest in flight.

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

    def _submit(self, frames: list[Frame]) -> Future[list[Frame]]:
        with self._lock:
            if self.closed:
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
            if self.closed:
                return
            self.closed = True
        for actor in self._actors:
            self._ray.kill(actor)


__all__ = ["RayExecutor"]
