"""Fetching media over http(s), only from allowed hosts, with a timeout and a size cap.

The stdlib ``urllib`` does the work (no new dependency). Redirects are followed only to allowed
hosts, so an allowed host cannot bounce the server to an internal address. The body is read in
chunks and abandoned as soon as it passes ``max_media_bytes``; a ``Content-Length`` over the
cap is refused before reading anything.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import IO, Any
from urllib.parse import urlsplit

from mmfront.errors import MediaFetchError, MediaTooLargeError

_CHUNK_BYTES = 1 << 16
_RETRYABLE_4XX = frozenset({408, 429})


def describe_url(url: str, limit: int = 200) -> str:
    """``url`` shortened for an error message (data URLs can be megabytes long)."""
    return url if len(url) <= limit else f"{url[:limit]}... ({len(url)} characters)"


def is_domain_allowed(host: str, allowed: Sequence[str]) -> bool:
    """Exact host names, ``*.example.com`` for any subdomain (not ``example.com`` itself), or
    ``*`` for every host. Case and a trailing dot are ignored."""
    host = host.lower().rstrip(".")
    for pattern in allowed:
        if pattern == "*":
            return True
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
                return True
        elif host == pattern.rstrip("."):
            return True
    return False


def check_url_allowed(url: str, allowed: Sequence[str] | None) -> None:
    """Refuse ``url`` unless it is http(s) with a host in ``allowed``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise MediaFetchError(f"Media URL {describe_url(url)} uses the unsupported scheme {parts.scheme!r}; use "
                              "http(s)://, file://, a data: URL or base64.", parameter="multi_modal_data")
    host = parts.hostname
    if not host:
        raise MediaFetchError(f"Media URL {describe_url(url)} has no host name; send a full http(s) URL.",
                              parameter="multi_modal_data")
    if allowed is None:
        raise MediaFetchError(
            f"Fetching media from URLs is disabled, so {describe_url(url)} cannot be loaded. Set "
            "allowed_media_domains to the hosts media may come from (e.g. ['images.example.com'], or ['*'] for any), "
            "or send the media inline as a data: URL.",
            parameter="multi_modal_data",
        )
    if not is_domain_allowed(host, allowed):
        raise MediaFetchError(
            f"The host {host!r} of media URL {describe_url(url)} is not in allowed_media_domains. Host the media on "
            "an allowed domain, send it inline as a data: URL, or add the host to allowed_media_domains.",
            parameter="multi_modal_data",
        )


class _AllowlistRedirectHandler(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only when its target passes the same allowlist as the first URL."""

    def __init__(self, allowed: Sequence[str] | None) -> None:
        super().__init__()
        self.allowed = allowed

    def redirect_request(  # noqa: PLR0917 (urllib calls it with these six positional arguments)
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        try:
            check_url_allowed(newurl, self.allowed)
        except MediaFetchError as exc:
            fp.close()
            raise MediaFetchError(f"Media URL {describe_url(req.full_url)} redirects (HTTP {code}) to a URL that is "
                                  f"not allowed: {exc}", parameter="multi_modal_data") from None
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class HttpFetcher:
    """Reads http(s) media for one :class:`~mmfront.media.MediaConnector`; thread-safe."""

    def __init__(self, allowed_domains: Sequence[str] | None, max_bytes: int) -> None:
        self.allowed_domains = allowed_domains
        self.max_bytes = max_bytes
        self._opener = urllib.request.build_opener(_AllowlistRedirectHandler(allowed_domains))

    def fetch(self, url: str, *, timeout: float) -> bytes:
        """The body of ``url``. ``timeout`` bounds each network wait and the whole download."""
        check_url_allowed(url, self.allowed_domains)
        request = urllib.request.Request(url, headers={"User-Agent": "mmfront", "Accept": "*/*"})
        deadline = time.monotonic() + timeout
        shown = describe_url(url)
        try:
            with self._opener.open(request, timeout=timeout) as response:
                return self._read_body(response, shown, deadline, timeout)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise _status_error(shown, exc.code, exc.reason) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise _timeout_error(shown, timeout) from None
            raise MediaFetchError(
                f"Could not connect to fetch media from {shown}: {exc.reason}. Check that the host is reachable "
                "from the server, then retry.",
                parameter="multi_modal_data",
                retryable=isinstance(exc.reason, ConnectionError),
            ) from None
        except TimeoutError:
            raise _timeout_error(shown, timeout) from None
        except (http.client.HTTPException, OSError) as exc:
            raise MediaFetchError(f"The download of media from {shown} broke off: {exc!r}. Retry the request.",
                                  parameter="multi_modal_data", retryable=True) from None

    def _read_body(self, response: Any, shown: str, deadline: float, timeout: float) -> bytes:
        length = response.headers.get("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > self.max_bytes:
            raise MediaTooLargeError(
                f"Media at {shown} is {int(length)} bytes (Content-Length), more than max_media_bytes="
                f"{self.max_bytes}. Send a smaller file, or raise max_media_bytes.",
                parameter="multi_modal_data",
            )
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = response.read(min(_CHUNK_BYTES, self.max_bytes + 1 - total))
            if not chunk:
                return b"".join(chunks)
            total += len(chunk)
            if total > self.max_bytes:
                raise MediaTooLargeError(
                    f"Media at {shown} is more than max_media_bytes={self.max_bytes} bytes. Send a smaller file, or "
                    "raise max_media_bytes.",
                    parameter="multi_modal_data",
                )
            chunks.append(chunk)
            if time.monotonic() > deadline:
                raise _timeout_error(shown, timeout)


def _status_error(shown: str, status: int, reason: object) -> MediaFetchError:
    retryable = status >= 500 or status in _RETRYABLE_4XX
    advice = ("This is temporary on the media host's side; retry later." if retryable
              else "Check that the URL is correct and publicly readable from the server.")
    return MediaFetchError(f"Fetching media from {shown} failed with HTTP {status} {reason}. {advice}",
                           parameter="multi_modal_data", retryable=retryable)


def _timeout_error(shown: str, timeout: float) -> MediaFetchError:
    return MediaFetchError(
        f"Fetching media from {shown} timed out after {timeout:g} s. Retry later, send the media inline as a data: "
        "URL, or raise image_fetch_timeout / audio_fetch_timeout.",
        parameter="multi_modal_data",
        retryable=True,
    )
