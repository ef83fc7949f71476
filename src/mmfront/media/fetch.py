"""Fetching media over http(s), from public addresses or allowed hosts, under one deadline and
a size cap.

The stdlib ``urllib`` does the work (no new dependency). Every URL, the first and each redirect
target, is checked and rewritten into the exact ASCII form that goes on the wire (IDNA host,
percent-encoded path) before the allowlist sees it, so the host that was allowed is the host
that is contacted.

As ``vllm serve``, any http(s) host is fetched by default, but only at a public address: the
host name is resolved once, every address it gives is checked, and the connection goes to a
checked address (no second lookup a rebinding DNS server could answer differently). Loopback,
private, link-local, multicast and reserved addresses, and this server's own (a connection
whose two ends are the same address), are refused unless ``--allowed-media-domains`` names the
host, so a request cannot make the server reach a metadata service, its own API or the
internal network. Redirect targets pass the same checks, at connect time too. Proxies from the
environment (``HTTP_PROXY``) are not used: through a proxy, the address contacted would not be
the one checked.

One monotonic deadline covers a whole fetch: connect, TLS handshake, request, status line,
headers, body, and every redirect hop. urllib's own ``timeout`` applies per socket operation,
so a server sending a byte every second would hold a request forever; here each socket
operation first sets the socket's timeout to the time *left*. Only the name lookup is not
covered (``getaddrinfo`` takes no timeout).

The body is read in chunks and abandoned as soon as it passes ``max_media_bytes``; a
``Content-Length`` over the cap is refused before reading anything, and one that is not a plain
decimal number is refused outright.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  # now, not on the first request: its import needs a free descriptor
import functools
import http.client
import io
import ipaddress
import re
import socket
import string
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from typing import IO, Any, cast
from urllib.parse import quote, urlsplit

from mmfront.errors import MediaFetchError, MediaTooLargeError, MediaURLNotAllowedError, MMFrontError, resource_error

_CHUNK_BYTES = 1 << 16
_RETRYABLE_4XX = frozenset({408, 429})
_HEADERS = {"User-Agent": "mmfront", "Accept": "*/*"}
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_ASCII_HOST = re.compile(r"[a-z0-9_.-]+")
_DECIMAL = re.compile(r"[0-9]+")
_MAX_HOST_CHARS = 253


def describe_url(url: str, limit: int = 200) -> str:
    """``url`` shortened for an error message (data URLs can be megabytes long); escapes make
    control characters and lone surrogates printable."""
    shown = url if len(url) <= limit else f"{url[:limit]}... ({len(url)} characters)"
    return shown if shown.isprintable() else shown.encode("unicode_escape").decode("ascii")


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


def check_url_allowed(url: str, allowed: Sequence[str] | None) -> str:
    """Refuse ``url`` unless it is a well-formed http(s) URL whose host ``allowed`` lets in
    (``None``: any host); return it as sent on the wire (ASCII host, non-ASCII path and query
    percent-encoded as UTF-8, no fragment). The host is matched in its ASCII (IDNA) form, the
    name actually resolved. Its addresses are checked when it is contacted (:func:`connect_checked`)."""
    scheme, host, port, target = _split_url(url)
    if allowed is not None and not is_domain_allowed(host.strip("[]"), _ascii_patterns(tuple(allowed))):
        raise MediaURLNotAllowedError(
            f"The host {host!r} of media URL {describe_url(url)} is not in --allowed-media-domains. Host the media "
            "on an allowed domain, send it inline as a data: URL, or add the host to --allowed-media-domains.",
            parameter="multi_modal_data",
        )
    return f"{scheme}://{host}{'' if port is None else f':{port}'}{target}"


def is_named(host: str, allowed: Sequence[str] | None) -> bool:
    """Whether ``allowed`` names ``host`` itself (exactly or as ``*.example.com``; ``*`` names
    no host): only a named host may be fetched at a non-public address."""
    named = tuple(p for p in allowed or () if p != "*")
    return is_domain_allowed(host.strip("[]"), _ascii_patterns(named))


_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def address_kind(ip: str) -> str | None:
    """What kind of non-public address ``ip`` is (``"loopback"``, ``"private"``, ...), or
    ``None`` for a public one. IPv4 addresses written in IPv6 (mapped, NAT64) are judged as IPv4."""
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        elif address in _NAT64:
            address = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    for kind in ("loopback", "link_local", "private", "multicast", "unspecified", "reserved"):
        if getattr(address, f"is_{kind}"):
            return kind.replace("_", "-")
    return None if address.is_global else "non-public"


def _refused_address(host: str, ip: str, kind: str) -> MediaURLNotAllowedError:
    return MediaURLNotAllowedError(
        f"The media host {host!r} is at {ip}, {'this server' if kind == 'own' else f'a {kind} address'}, which "
        "mmfront does not fetch from unless --allowed-media-domains names the host (e.g. --allowed-media-domains "
        f"{host.strip('[]')}). Send the media inline as a data: URL, or name the host in --allowed-media-domains.",
        parameter="multi_modal_data",
    )


def connect_checked(host: str, port: int, timeout: float, allowed: Sequence[str] | None) -> socket.socket:
    """A connected socket to ``host``: its name is resolved once, and only addresses that pass
    (public ones, or any when ``allowed`` names the host) are tried, so the address contacted is
    the address checked. A connection that reaches this server itself (both ends the same
    address) is closed and refused unless the host is named."""
    named = is_named(host, allowed)
    found = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    refused: tuple[str, str] | None = None
    last_error: OSError | None = None
    for family, kind, proto, _, address in found:
        ip = str(address[0])
        if not named and (what := address_kind(ip)) is not None:
            refused = refused or (ip, what)
            continue
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            if not named and sock.getsockname()[0] == sock.getpeername()[0]:
                refused = (ip, "own")
                sock.close()
                continue
            return sock
        except OSError as exc:
            sock.close()
            last_error = exc
    if refused is not None and last_error is None:
        raise _refused_address(host, *refused)
    raise last_error or OSError(f"no address found for {host!r}")


def _split_url(url: str) -> tuple[str, str, int | None, str]:
    """``(scheme, wire host, port, path?query)`` of ``url``, or a typed error saying what is wrong."""
    shown = describe_url(url)

    def bad(problem: str) -> MediaFetchError:
        return MediaFetchError(f"Media URL {shown} is malformed: {problem}.", parameter="multi_modal_data")

    if _CONTROL_CHARS.search(url):
        raise bad("it contains control characters (tab, line break, ...); percent-encode them")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a bad IPv6 literal, a port that is not a number in 0..65535
        raise bad(str(exc)) from None
    if parts.scheme not in ("http", "https"):
        raise MediaURLNotAllowedError(f"Media URL {shown} uses the unsupported scheme {parts.scheme!r}; use "
                                      "http(s)://, file://, a data: URL or base64.", parameter="multi_modal_data")
    if "@" in parts.netloc:
        raise bad("it carries credentials (user@host), which media URLs may not; remove them")
    host = parts.hostname
    if not host:
        raise MediaFetchError(f"Media URL {shown} has no host name; send a full http(s) URL.",
                              parameter="multi_modal_data")
    if parts.netloc.startswith("["):
        try:
            host = f"[{ipaddress.IPv6Address(host).compressed}]"
        except ValueError as exc:
            raise bad(str(exc)) from None
    else:
        host = _ascii_host(host, bad)
    target = parts.path or "/"
    if parts.query:
        target += f"?{parts.query}"
    try:
        target = quote(target, safe=string.punctuation)
    except UnicodeEncodeError:
        raise bad("its path or query holds a lone surrogate, which is not valid Unicode text") from None
    return parts.scheme, host, port, target


def _ascii_host(host: str, bad: Callable[[str], MediaFetchError]) -> str:
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise bad(f"the host name {host!r} is not a valid domain name (a label is empty, longer than 63 "
                  "characters, or not valid Unicode)") from None
    if len(ascii_host.rstrip(".")) > _MAX_HOST_CHARS:
        raise bad(f"the host name is {len(ascii_host)} characters long in its ASCII form, more than the "
                  f"{_MAX_HOST_CHARS} DNS allows")
    if not _ASCII_HOST.fullmatch(ascii_host.lower()):
        raise bad(f"the host name {host!r} holds characters no domain name has")
    return ascii_host.lower()


@functools.lru_cache(maxsize=64)
def _ascii_patterns(allowed: tuple[str, ...]) -> tuple[str, ...]:
    """``allowed`` with internationalized names in their IDNA form, as hosts are matched;
    a pattern with no valid IDNA form can match no valid host, so it is dropped."""
    out = []
    for pattern in allowed:
        try:
            out.append(pattern if pattern.isascii() else pattern.encode("idna").decode("ascii"))
        except UnicodeError:
            continue
    return tuple(out)


class _Deadline:
    """The monotonic instant a fetch must be done by."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the {self.seconds:g} s fetch deadline passed")
        return left


class _DeadlineReader(io.RawIOBase):
    """The response's byte stream: every receive waits at most until the deadline."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self._sock = sock
        self._stream = sock.makefile("rb", buffering=0)
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:
        self._sock.settimeout(self._deadline.remaining())
        return self._stream.readinto(buffer)

    def fileno(self) -> int:
        return self._stream.fileno()

    def close(self) -> None:
        if not self.closed:
            self._stream.close()
        super().close()


class _DeadlineSocket:
    """Stands in for a connection's socket toward ``http.client``: it sends with the time left
    and hands out a reader that receives with the time left."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock = sock
        self._deadline = deadline

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(self._deadline.remaining())
        self._sock.sendall(data)

    def makefile(self, mode: str = "rb") -> IO[bytes]:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def close(self) -> None:
        self._sock.close()


def _checked_connector(connection: http.client.HTTPConnection, deadline: _Deadline,
                       allowed: Sequence[str] | None) -> Callable[..., socket.socket]:
    """What ``http.client`` calls to open its socket (its ``_create_connection``), for
    :func:`connect_checked`; the TLS handshake of https then runs on that socket, with the host's name."""

    def create(address: tuple[str, int], timeout: float, source_address: Any = None) -> socket.socket:
        return connect_checked(connection.host, address[1], deadline.remaining(), allowed)
    return create


class _DeadlineHTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, *, deadline: _Deadline, allowed: Sequence[str] | None, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self.deadline = deadline
        self._create_connection = _checked_connector(self, deadline, allowed)

    def connect(self) -> None:
        self.timeout = self.deadline.remaining()
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self.deadline)


class _DeadlineHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, *, deadline: _Deadline, allowed: Sequence[str] | None, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self.deadline = deadline
        self._create_connection = _checked_connector(self, deadline, allowed)

    def connect(self) -> None:
        self.timeout = self.deadline.remaining()  # the TLS handshake takes it as one budget
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self.deadline)


class _FetchRequest(urllib.request.Request):
    """A GET carrying its fetch's deadline through urllib's handlers to the connection."""

    def __init__(self, url: str, deadline: _Deadline) -> None:
        super().__init__(url, headers=_HEADERS)
        self.deadline = deadline


class _DeadlineHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, allowed: Sequence[str] | None) -> None:
        super().__init__()
        self.allowed = allowed

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        deadline = cast(_FetchRequest, req).deadline
        return self.do_open(functools.partial(_DeadlineHTTPConnection, deadline=deadline, allowed=self.allowed), req)


class _DeadlineHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, allowed: Sequence[str] | None) -> None:
        super().__init__()
        self.allowed = allowed

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        deadline = cast(_FetchRequest, req).deadline
        return self.do_open(functools.partial(_DeadlineHTTPSConnection, deadline=deadline, allowed=self.allowed),
                            req)


class _AllowlistRedirectHandler(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only when its target passes the same checks as the first URL, under
    the first URL's deadline."""

    def __init__(self, allowed: Sequence[str] | None) -> None:
        super().__init__()
        self.allowed = allowed

    def redirect_request(  # noqa: PLR0917 (urllib calls it with these six positional arguments)
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: Any, newurl: str
    ) -> urllib.request.Request | None:
        try:
            target = check_url_allowed(newurl, self.allowed)
        except MediaFetchError as exc:
            fp.close()
            raise MediaFetchError(f"Media URL {describe_url(req.full_url)} redirects (HTTP {code}) to a URL that is "
                                  f"not allowed: {exc}", parameter="multi_modal_data") from None
        return _FetchRequest(target, cast(_FetchRequest, req).deadline)


class HttpFetcher:
    """Reads http(s) media for one :class:`~mmfront.media.MediaConnector`; thread-safe."""

    def __init__(self, allowed_domains: Sequence[str] | None, max_bytes: int) -> None:
        self.allowed_domains = allowed_domains
        self.max_bytes = max_bytes
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), _DeadlineHTTPHandler(allowed_domains), _DeadlineHTTPSHandler(allowed_domains),
            _AllowlistRedirectHandler(allowed_domains))

    def fetch(self, url: str, *, timeout: float) -> bytes:
        """The body of ``url``; ``timeout`` seconds bound the whole fetch, redirects included."""
        request = _FetchRequest(check_url_allowed(url, self.allowed_domains), _Deadline(timeout))
        shown = describe_url(url)
        try:
            with self._opener.open(request) as response:
                return self._read_body(response, shown)
        except MMFrontError:
            raise  # already typed (refused redirect, size cap); must not fall into the ValueError branch
        except urllib.error.HTTPError as exc:
            exc.close()
            raise _status_error(shown, exc.code, exc.reason) from None
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise _timeout_error(shown, timeout) from None
            found = resource_error(exc.reason if isinstance(exc.reason, BaseException) else exc,
                                   doing=f"Fetching media from {shown}")
            if found is not None:
                raise found from None
            raise MediaFetchError(
                f"Could not connect to fetch media from {shown}: {exc.reason}. Check that the host is reachable "
                "from the server, then retry.",
                parameter="multi_modal_data",
                retryable=isinstance(exc.reason, ConnectionError),
            ) from None
        except TimeoutError:
            raise _timeout_error(shown, timeout) from None
        except (http.client.HTTPException, OSError) as exc:
            raise resource_error(exc, doing=f"Fetching media from {shown}") or MediaFetchError(f"The download of media from {shown} broke off: {exc!r}. Retry the request.",
                                  parameter="multi_modal_data", retryable=True) from None
        except ValueError as exc:  # urllib parsing what the host sent, e.g. a redirect to "http://[::g]/"
            raise MediaFetchError(f"The media host's answer for {shown} is malformed ({exc}). Fix the server, or send "
                                  "the media inline as a data: URL.", parameter="multi_modal_data") from None

    def _read_body(self, response: Any, shown: str) -> bytes:
        length = _content_length(response.headers.get_all("Content-Length"), shown)
        if length is not None and length > self.max_bytes:
            raise MediaTooLargeError(
                f"Media at {shown} is {length} bytes (Content-Length), more than max_media_bytes="
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


def _content_length(values: list[str] | None, shown: str) -> int | None:
    """The declared body size: ASCII digits only (RFC 9110), repeats allowed if they agree.
    ``http.client`` would read ``"0x10"`` or ``"-1"`` as "until the connection closes" and
    Arabic-Indic digits as a number; a host sending either is refused instead."""
    if not values:
        return None
    declared = {part.strip() for value in values for part in value.split(",")}
    if len(declared) != 1 or not _DECIMAL.fullmatch(next(iter(declared))):
        raise MediaFetchError(
            f"The media host sent an invalid Content-Length for {shown} ({', '.join(map(repr, values))}); it must be "
            "one decimal number. Fix the server, or send the media inline as a data: URL.",
            parameter="multi_modal_data",
        )
    digits = next(iter(declared)).lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else 10**18  # a longer number passes any cap; int() of it may refuse


def _status_error(shown: str, status: int, reason: object) -> MediaFetchError:
    retryable = status >= 500 or status in _RETRYABLE_4XX
    advice = ("This is temporary on the media host's side; retry later." if retryable
              else "Check that the URL is correct and publicly readable from the server.")
    return MediaFetchError(f"Fetching media from {shown} failed with HTTP {status} {reason}. {advice}",
                           parameter="multi_modal_data", retryable=retryable)


def _timeout_error(shown: str, timeout: float) -> MediaFetchError:
    return MediaFetchError(
        f"Fetching media from {shown} timed out after {timeout:g} s (one deadline for connect, headers and body). "
        "Retry later, send the media inline as a data: URL, or raise image_fetch_timeout / audio_fetch_timeout / video_fetch_timeout.",
        parameter="multi_modal_data",
        retryable=True,
    )
