"""``return_weight_versions``: which weights made each range of a choice's tokens, as vLLM's
output processor tracks them (``RequestState.track_weight_version``): every message of engine
outputs carries the engine's weight version, and a choice's span starts wherever the version of
the step that brought its new tokens changes. Fed by the engine client's steps (on its reader
thread, before the outputs reach their streams), read by the app as a choice finishes."""

from __future__ import annotations

import threading

import msgspec

from mmfront.engine.client_events import EngineStep


class WeightVersionSpan(msgspec.Struct):
    """Output tokens ``[start, end)`` were sampled by the weights labelled ``version``."""

    version: str
    start: int
    end: int


class WeightVersions:
    """The span starts of the requests that asked for them, until the app takes them."""

    def __init__(self) -> None:
        self._starts: dict[str, list[tuple[str, int]]] = {}
        self._tokens: dict[str, int] = {}
        self._lock = threading.Lock()

    def track(self, request_ids: list[str]) -> None:
        with self._lock:
            for request_id in request_ids:
                self._starts[request_id] = []
                self._tokens[request_id] = 0

    def on_step(self, step: EngineStep, request_ids: list[str]) -> None:
        """:meth:`AsyncEngineClient.add_step_observer`'s callback."""
        version = step.weight_version
        with self._lock:
            for output, request_id in zip(step.outputs, request_ids):
                starts = self._starts.get(request_id)
                if starts is None or not output.new_token_ids:
                    continue
                if version is not None and (not starts or starts[-1][0] != version):
                    starts.append((version, self._tokens[request_id]))
                self._tokens[request_id] += len(output.new_token_ids)

    def take(self, request_id: str, num_tokens: int) -> list[WeightVersionSpan] | None:
        """The spans of a finished choice of ``num_tokens`` tokens (``None``: none were labelled,
        as vLLM's), forgotten here."""
        with self._lock:
            starts = self._starts.pop(request_id, None)
            self._tokens.pop(request_id, None)
        if starts is None or (not starts and num_tokens):
            return None
        ends = [start for _, start in starts[1:]] + [num_tokens]
        return [WeightVersionSpan(version, start, end) for (version, start), end in zip(starts, ends)]

    def drop(self, request_id: str) -> None:
        """The choice was given up."""
        with self._lock:
            self._starts.pop(request_id, None)
            self._tokens.pop(request_id, None)


__all__ = ["WeightVersionSpan", "WeightVersions"]
