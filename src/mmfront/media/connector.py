"""Where media comes from: data URLs, base64, bytes, allowed local files and allowed URLs.

:class:`MediaConnector` turns whatever a chat request names (vLLM's ``image_url`` /
``input_audio`` / ``video_url`` values) into encoded bytes, then hands them to the lazy loaders. Every source
is refused unless the deployment allowed it: local files only below
``allowed_local_media_path``, URLs from public addresses, or from hosts ``allowed_media_domains``
names (:mod:`mmfront.media.fetch`). Every payload is capped
at ``max_media_bytes``.
"""

from __future__ import annotations

import binascii
import functools
import os
import re
import stat
import threading
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np
import pybase64
from PIL import Image

from mmfront.config import MultiModalConfig
from mmfront.errors import (
    ConfigError,
    InputTypeError,
    MediaDecodeError,
    MediaEncodingNotSupportedError,
    MediaPathError,
    MediaTooLargeError,
    MediaURLNotAllowedError,
    ValidationError,
    resource_error,
)
from mmfront.media.audio import AudioWithRate, load_audio_bytes
from mmfront.media.base import MediaWithBytes
from mmfront.media.budget import DecodeBudget, check_media_size
from mmfront.media.fetch import HttpFetcher, describe_url
from mmfront.media.image import load_image_bytes, resolve_image_options
from mmfront.media.video import load_video_bytes, resolve_video_options


@dataclass(frozen=True)
class DecodedDataURL:
    """A base64 data URL its reader decoded already: ``mmfront serve`` lifts a chat body's data
    URLs out before decoding the body, checking their base64 on the way
    (:mod:`mmfront.serve.inline_media`). The connector takes its bytes as it takes the URL's,
    under the same limits and with the same errors, without the URL's text being made, sliced,
    encoded and decoded again (~0.25 ms of a 1024x768 JPEG's cache hit)."""

    data: bytes
    base64_length: int
    """Characters of base64 after the URL's comma: the size refused before decoding is read from it."""


MediaSource = str | bytes | bytearray | memoryview | DecodedDataURL
"""A URL (``http(s)://``, ``file://``, ``data:``), a local path, a base64 string, raw bytes, or a
data URL decoded already."""

_T = TypeVar("_T")
_S = TypeVar("_S")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def decode_base64(text: str, *, max_bytes: int, what: str = "The media") -> bytes:
    """Strict standard base64 (line breaks tolerated), refused early when the decoded size would
    pass ``max_bytes``."""
    _check_base64_length(len(text), max_bytes=max_bytes, what=what)
    # pybase64 (SIMD, what vLLM uses): the stdlib's decoder would dominate a cache hit on a
    # large data URL.
    try:
        return pybase64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        pass
    try:
        return pybase64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MediaDecodeError(
            f"{what} is not valid base64 ({exc}). Encode the file with standard base64 (A-Z, a-z, 0-9, '+', '/', "
            "'=' padding), or pass a URL, a data: URL or a file path instead.",
            parameter="multi_modal_data",
        ) from None


def base64_length_fits(length: int, max_bytes: int) -> bool:
    """Whether ``length`` characters of base64 may decode to at most ``max_bytes`` (its padding
    unknown): what is refused before decoding."""
    return length // 4 * 3 <= max_bytes + 2


def _check_base64_length(length: int, *, max_bytes: int, what: str) -> None:
    if not base64_length_fits(length, max_bytes):
        raise MediaTooLargeError(
            f"{what} is about {length // 4 * 3} bytes (from its base64 length), more than max_media_bytes="
            f"{max_bytes}. Send a smaller file, or raise max_media_bytes.",
            parameter="multi_modal_data",
        )


def is_base64_header(header: str) -> bool:
    """Whether a data URL's header (between ``data:`` and its comma) declares base64, the only
    encoding the connector takes."""
    return "base64" in (param.strip().lower() for param in header.split(";")[1:])


class MediaConnector:
    """Loads the media items of requests under one deployment's :class:`MultiModalConfig`.

    Each ``load_*`` takes the request's :class:`DecodeBudget`. Items come back lazy (header
    checked, bytes kept, pixels/samples decoded on first use); pass ``lazy=False`` to decode at
    once. ``max_workers`` bounds the threads of :meth:`load_images` / :meth:`load_audios`
    (vLLM uses 8 media-loading threads).
    """

    def __init__(self, config: MultiModalConfig, *, max_workers: int = 8) -> None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ConfigError(f"MediaConnector max_workers must be an integer >= 1, got {max_workers!r}")
        try:
            resolve_image_options(config)
            resolve_video_options(config)
            _check_audio_options(config.media_io_kwargs, source="config.media_io_kwargs")
        except (ValidationError, InputTypeError) as exc:
            raise ConfigError(str(exc)) from None
        self.config = config
        self.max_workers = max_workers
        root = config.allowed_local_media_path
        self._root = None if root is None else os.path.realpath(root)
        self._http = HttpFetcher(config.allowed_media_domains, config.max_media_bytes)
        self._pool: ThreadPoolExecutor | None = None  # created on the first multi-item load, then reused
        self._pool_lock = threading.Lock()

    # --- loading ---

    def load_image(
        self,
        url_or_data: MediaSource,
        *,
        budget: DecodeBudget,
        media_io_kwargs: Mapping[str, Any] | None = None,
        lazy: bool = True,
    ) -> MediaWithBytes[Image.Image]:
        data = self.fetch_bytes(url_or_data, timeout=self.config.image_fetch_timeout, what="The image")
        return load_image_bytes(data, config=self.config, budget=budget, media_io_kwargs=media_io_kwargs, lazy=lazy)

    def load_audio(
        self,
        url_or_data: MediaSource,
        *,
        budget: DecodeBudget,
        media_io_kwargs: Mapping[str, Any] | None = None,
        lazy: bool = True,
    ) -> MediaWithBytes[AudioWithRate]:
        _check_audio_options(media_io_kwargs, source="media_io_kwargs")
        data = self.fetch_bytes(url_or_data, timeout=self.config.audio_fetch_timeout, what="The audio")
        return load_audio_bytes(data, config=self.config, budget=budget, lazy=lazy)

    def load_video(
        self,
        url_or_data: MediaSource,
        *,
        budget: DecodeBudget,
        media_io_kwargs: Mapping[str, Any] | None = None,
        video_processor: str | None = None,
        lazy: bool = True,
    ) -> MediaWithBytes[np.ndarray]:
        """A video's kept frames, lazily; ``info["metadata"]`` is vLLM's metadata for them.
        ``video_processor`` (the model's HF video processor class name) picks vLLM's sampler."""
        resolve_video_options(self.config, media_io_kwargs, video_processor=video_processor)
        data = self.fetch_bytes(url_or_data, timeout=self.config.video_fetch_timeout, what="The video")
        return load_video_bytes(data, config=self.config, budget=budget, media_io_kwargs=media_io_kwargs,
                                video_processor=video_processor, lazy=lazy)

    def load_images(
        self,
        sources: Iterable[MediaSource],
        *,
        budget: DecodeBudget,
        media_io_kwargs: Mapping[str, Any] | None = None,
        lazy: bool = True,
    ) -> list[MediaWithBytes[Image.Image]]:
        """Several images, fetched concurrently; results keep the order of ``sources``, and the
        first failing item (in that order) raises its error."""
        load = functools.partial(self.load_image, budget=budget, media_io_kwargs=media_io_kwargs, lazy=lazy)
        return self._load_many(load, sources)

    def load_audios(
        self,
        sources: Iterable[MediaSource],
        *,
        budget: DecodeBudget,
        media_io_kwargs: Mapping[str, Any] | None = None,
        lazy: bool = True,
    ) -> list[MediaWithBytes[AudioWithRate]]:
        load = functools.partial(self.load_audio, budget=budget, media_io_kwargs=media_io_kwargs, lazy=lazy)
        return self._load_many(load, sources)

    def load_all(self, loads: Sequence[Callable[[], _T]]) -> list[_T]:
        """Run independent loads concurrently (a request's media parts); results keep the order
        of ``loads``, and the first failing load (in that order) raises its error."""
        return self._load_many(lambda load: load(), loads)

    def _load_many(self, load: Callable[[_S], _T], sources: Iterable[_S]) -> list[_T]:
        items = list(sources)
        if len(items) <= 1 or self.max_workers == 1:
            return [load(source) for source in items]
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.max_workers, thread_name_prefix="mmfront-media")
        futures = [self._pool.submit(load, source) for source in items]
        try:
            return [future.result() for future in futures]
        finally:
            for future in futures:
                future.cancel()

    # --- sources ---

    def fetch_bytes(self, url_or_data: MediaSource, *, timeout: float, what: str = "The media") -> bytes:
        """The encoded bytes ``url_or_data`` names, from whichever source it is."""
        if isinstance(url_or_data, (bytes, bytearray, memoryview)):
            data = bytes(url_or_data)
        elif isinstance(url_or_data, str):
            data = self._fetch_str(url_or_data, timeout=timeout, what=what)
        elif isinstance(url_or_data, DecodedDataURL):
            _check_base64_length(url_or_data.base64_length, max_bytes=self.config.max_media_bytes, what=what)
            data = url_or_data.data
        else:
            raise InputTypeError(
                f"{what} must be given as a URL, data: URL, file path, base64 string or bytes, got "
                f"{type(url_or_data).__name__}", parameter="multi_modal_data"
            )
        check_media_size(len(data), self.config, what=what)
        return data

    def _fetch_str(self, source: str, *, timeout: float, what: str) -> bytes:
        if not source.strip():
            raise MediaDecodeError(f"{what} is an empty string; send a URL, a data: URL or base64 data.",
                                   parameter="multi_modal_data")
        if source[:5].lower() == "data:":
            return self._from_data_url(source, what=what)
        match = _SCHEME.match(source)
        if match:
            scheme = match.group(1).lower()
            if scheme in ("http", "https"):
                return self._http.fetch(source, timeout=timeout)
            if scheme == "file":
                return self._read_local(_file_url_path(source), shown=describe_url(source))
            raise MediaURLNotAllowedError(f"Media URL {describe_url(source)} uses the unsupported scheme "
                                          f"{scheme!r}; use http(s)://, file://, a data: URL or base64.",
                                          parameter="multi_modal_data")
        # base64 has no '.', so a name with an extension is a path; a leading '/' is ambiguous
        # (a JPEG's base64 starts with "/9j/") and counts as a path only when it is not base64.
        if "." not in source:
            try:
                return decode_base64(source, max_bytes=self.config.max_media_bytes, what=what)
            except MediaDecodeError:
                if not source.startswith("/"):
                    raise
        return self._read_local(source, shown=describe_url(source))

    def _from_data_url(self, url: str, *, what: str) -> bytes:
        # Slice out only the payload: each copy of a multi-MB data URL is made holding the GIL.
        comma = url.find(",", 5)
        if comma < 0:
            raise MediaDecodeError(f"Malformed data URL {describe_url(url, 60)}: there is no ',' before the data. Use "
                                   "data:<media type>;base64,<data>.", parameter="multi_modal_data")
        header, payload = url[5:comma], url[comma + 1:]
        if not is_base64_header(header):
            raise MediaEncodingNotSupportedError(f"Only base64 data URLs are supported, got {describe_url(url, 60)}. "
                                                 "Use data:<media type>;base64,<data>.", parameter="multi_modal_data")
        return decode_base64(payload, max_bytes=self.config.max_media_bytes, what=what)

    def _read_local(self, path: str, *, shown: str) -> bytes:
        """A file below the allowed root; ``..``, absolute paths outside it and symbolic links
        leading out of it are refused after resolving the real path."""
        if self._root is None:
            raise MediaPathError(
                f"Loading local files is disabled, so {shown} cannot be read. Set allowed_local_media_path to the "
                "directory media files may be read from, or send the media inline.",
                parameter="multi_modal_data",
            )
        try:
            real = os.path.realpath(os.path.join(self._root, path))
        except (ValueError, OSError) as exc:
            raise resource_error(exc, doing=f"Resolving the local path {shown}") or MediaPathError(
                f"Invalid local media path {shown}: {exc}.", parameter="multi_modal_data") from None
        if os.path.commonpath([real, self._root]) != self._root:
            raise MediaPathError(
                f"The path {shown} leads outside allowed_local_media_path (after resolving '..' and symbolic "
                "links). Only files below that directory can be loaded.",
                parameter="multi_modal_data",
            )
        try:
            fd = os.open(real, _READ_FLAGS)
        except FileNotFoundError:
            raise MediaPathError(f"No file at {shown} below allowed_local_media_path; check the path.",
                                 parameter="multi_modal_data") from None
        except OSError as exc:
            raise resource_error(exc, doing=f"Opening the local file {shown}") or MediaPathError(
                f"Cannot read the local file {shown}: {exc.strerror}.", parameter="multi_modal_data") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise MediaPathError(f"{shown} is not a regular file; name a media file.", parameter="multi_modal_data")
            check_media_size(info.st_size, self.config, what=f"The file {shown}")
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, "rb") as file:
            data = file.read(self.config.max_media_bytes + 1)
        check_media_size(len(data), self.config, what=f"The file {shown}")
        return data


def _file_url_path(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError as exc:  # an unclosed or invalid IPv6 bracket in the authority
        raise MediaPathError(f"File URL {describe_url(url)} is malformed ({exc}); file URLs must be local "
                             "(file:///absolute/path).", parameter="multi_modal_data") from None
    if parts.netloc not in ("", "localhost"):
        raise MediaPathError(f"File URL {describe_url(url)} names the host {parts.netloc!r}; file URLs must be local "
                             "(file:///absolute/path).", parameter="multi_modal_data")
    return urllib.request.url2pathname(parts.path)


def _check_audio_options(media_io_kwargs: Mapping[str, Any] | None, *, source: str) -> None:
    if media_io_kwargs is None:
        return
    if not isinstance(media_io_kwargs, Mapping):
        raise InputTypeError(f"{source} must map a modality to options, got {type(media_io_kwargs).__name__}", parameter="media_io_kwargs")
    options = media_io_kwargs.get("audio")
    if options:
        raise ValidationError(f"{source}['audio'] has options {sorted(options)}, but audio loading takes none; "
                              "remove them.", parameter="media_io_kwargs")
