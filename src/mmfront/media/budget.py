"""Size limits on media: the encoded-size cap and the per-request allowance of decoded bytes.

A request may carry many small encoded files that each decode to hundreds of megabytes. Checking
each item alone cannot stop that, so every loader charges the memory it is about to commit to
against one budget per request, from the header, before any pixel or sample is decoded: an
image's decode peak, conversions included (:mod:`mmfront.media._image_peak`), ``frames*4`` per
audio.
"""

from __future__ import annotations

import threading

from mmfront.config import MultiModalConfig
from mmfront.errors import ConfigError, MediaTooLargeError


class DecodeBudget:
    """How many decoded bytes one request may still spend.

    Create one per request (the chat layer does, from
    ``config.max_media_request_decode_bytes``) and pass it to every load of that request.
    Charging is thread-safe, so the items of a request may be loaded concurrently.
    """

    __slots__ = ("_lock", "limit_bytes", "used_bytes")

    def __init__(self, limit_bytes: int) -> None:
        if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
            raise ConfigError(f"DecodeBudget limit_bytes must be an integer >= 0, got {limit_bytes!r}")
        self.limit_bytes = limit_bytes
        self.used_bytes = 0
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: MultiModalConfig) -> DecodeBudget:
        return cls(config.max_media_request_decode_bytes)

    @property
    def remaining_bytes(self) -> int:
        return self.limit_bytes - self.used_bytes

    def charge(self, nbytes: int, *, what: str) -> None:
        """Reserve ``nbytes`` for ``what``; a refused charge reserves nothing."""
        with self._lock:
            if self.used_bytes + nbytes > self.limit_bytes:
                raise MediaTooLargeError(
                    f"{what} decodes to {nbytes} bytes, but this request has only "
                    f"{self.limit_bytes - self.used_bytes} of its {self.limit_bytes} decode bytes left "
                    "(max_media_request_decode_bytes). Send fewer or smaller media items, or raise "
                    "max_media_request_decode_bytes.",
                    parameter="multi_modal_data",
                )
            self.used_bytes += nbytes

    def __repr__(self) -> str:
        return f"DecodeBudget(used={self.used_bytes}, limit={self.limit_bytes})"


def check_media_size(nbytes: int, config: MultiModalConfig, *, what: str) -> None:
    """Refuse an encoded payload over ``max_media_bytes``, whatever its source."""
    if nbytes > config.max_media_bytes:
        raise MediaTooLargeError(
            f"{what} is {nbytes} bytes, more than max_media_bytes={config.max_media_bytes}. Send a smaller "
            "file, or raise max_media_bytes.",
            parameter="multi_modal_data",
        )
