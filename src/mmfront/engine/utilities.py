"""The utility methods of ``mmfront worker``, with vLLM 0.33 ``EngineCore``'s names and meaning.

A frontend calls them by name (``AsyncEngineClient.call_utility`` or vLLM's own client);
:class:`~mmfront.engine.receiver.EngineCoreReceiver` runs them and answers each call.

Sleeping is vLLM's: ``sleep`` pauses the scheduler (the engine loop runs no step); with
``mode="abort"`` (vLLM's default) every request is aborted first, each finishing with
``FinishReason.ABORT``, with ``"keep"`` they stay and resume on wake-up. Requests that arrive
while the engine sleeps are held, not refused, and run once it is awake. From level 1 the caches
are cleared too (prefix, multimodal, encoder) and the "memory" sleeps: ``wake_up`` with tags
wakes only those (``"weights"``, ``"kv_cache"``; ``"scheduling"`` alone wakes nothing), and the
scheduler resumes once nothing sleeps, as vLLM's does. The reference runner keeps its weights
where they are: no memory is actually released.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.runner import ModelRunner
from mmfront.errors import ConfigError
from mmfront.wire.structs import EngineCoreOutput, FinishReason

SLEEP_TAGS = frozenset({"weights", "kv_cache"})
"""What sleeps from level 1 (vLLM's sleep-mode tags)."""


class WorkerUtilities:
    """What ``mmfront worker`` answers to utility calls; :attr:`paused` tells its engine loop to
    run no step."""

    def __init__(self, runner: ModelRunner, receiver: EngineCoreReceiver) -> None:
        self.runner = runner
        self.receiver = receiver
        self.paused = False
        self._asleep: set[str] = set()

    @property
    def methods(self) -> dict[str, Callable[..., Any]]:
        """The methods by vLLM name, for ``EngineCoreReceiver.utilities``."""
        return {"get_supported_tasks": self.get_supported_tasks, "is_sleeping": self.is_sleeping,
                "sleep": self.sleep, "wake_up": self.wake_up, "reset_prefix_cache": self.reset_prefix_cache,
                "reset_encoder_cache": self.runner.reset_encoder_cache}

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    def is_sleeping(self) -> bool:
        return self.paused or bool(self._asleep)

    def sleep(self, level: int = 1, mode: str = "abort") -> None:
        if mode not in ("abort", "keep"):
            raise ConfigError(f"sleep mode {mode!r}: mmfront worker sleeps with 'abort' or 'keep'.")
        if mode == "abort":
            aborted = self.runner.request_ids
            for request_id in aborted:
                self.runner.abort(request_id)
            self.receiver.send([EngineCoreOutput(rid, [], finish_reason=FinishReason.ABORT) for rid in aborted])
        self.paused = True
        if level >= 1:
            self.reset_prefix_cache()
            self.receiver.reset_mm_caches()
            self.runner.reset_encoder_cache()
            self._asleep = set(SLEEP_TAGS)

    def wake_up(self, tags: list[str] | None = None) -> bool:
        """Wake what ``tags`` name (``None``: everything); True when the engine is fully awake."""
        if tags is None:
            self._asleep.clear()
        else:
            self._asleep -= set(tags)
        if not self._asleep:
            self.paused = False
        return not self._asleep

    def reset_prefix_cache(self, reset_running_requests: bool = False, reset_connector: bool = False) -> bool:
        return self.runner.reset_prefix_cache()


__all__ = ["SLEEP_TAGS", "WorkerUtilities"]
