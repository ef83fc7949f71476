"""Issue 13, class 4: one total deadline per fetch, enforced on the socket.

A local server trickles its answer (a byte every 0.2 s), which a per-read timeout never catches.
The bound asserted (deadline + 1 s) is a correctness bound, not a speed measurement: before the
fix these fetches ran for the whole trickle (seconds) or succeeded.
"""

from __future__ import annotations

import socketserver
import time
from collections.abc import Iterator

import pytest

from local_services import serve_http
from mmfront.config import MultiModalConfig
from mmfront.errors import MediaFetchError
from mmfront.media import MediaConnector

DEADLINE = 0.5
BYTE_EVERY = 0.2
TRICKLE_BYTES = 40  # 8 s of trickling: far past the deadline, yet finite if a client never gives up
BODY = b"0123456789" * 4
HEADERS = f"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {len(BODY)}\r\n\r\n".encode()


class _TrickleHandler(socketserver.StreamRequestHandler):
    """Answers by path: trickled headers, trickled body, and redirect chains whose every hop is
    within the deadline while the chain is not."""

    def handle(self) -> None:
        path = self.rfile.readline().split()[1].decode()
        while self.rfile.readline() not in (b"\r\n", b""):
            pass
        try:
            if path == "/slow-headers":
                self._trickle(HEADERS + BODY)
            elif path == "/slow-body":
                self.wfile.write(HEADERS)
                self._trickle(BODY)
            elif path == "/slow-redirect-body":
                self.wfile.write(b"HTTP/1.1 302 Found\r\nLocation: /fast\r\nContent-Length: 40\r\n\r\n")
                self._trickle(BODY)
            elif path.startswith("/hop/"):
                left = int(path.rsplit("/", 1)[1])
                time.sleep(0.3)
                if left:
                    self.wfile.write(f"HTTP/1.1 302 Found\r\nLocation: /hop/{left - 1}\r\nContent-Length: 0\r\n\r\n"
                                     .encode())
                else:
                    self.wfile.write(HEADERS + BODY)
            elif path == "/fast":
                self.wfile.write(HEADERS + BODY)
        except OSError:
            return  # the client hung up: the point of these tests

    def _trickle(self, data: bytes) -> None:
        for byte in data[:TRICKLE_BYTES]:
            self.wfile.write(bytes([byte]))
            self.wfile.flush()
            time.sleep(BYTE_EVERY)


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with serve_http(_TrickleHandler) as url:
        yield url


@pytest.fixture
def connector() -> MediaConnector:
    return MediaConnector(MultiModalConfig(allowed_media_domains=("127.0.0.1",)))


@pytest.mark.parametrize("path", ["/slow-headers", "/slow-body", "/slow-redirect-body", "/hop/2"])
def test_a_trickling_answer_times_out_at_the_deadline(base: str, connector: MediaConnector, path: str) -> None:
    start = time.monotonic()
    with pytest.raises(MediaFetchError, match=r"timed out after 0\.5 s \(one deadline") as info:
        connector.fetch_bytes(base + path, timeout=DEADLINE)
    elapsed = time.monotonic() - start
    assert elapsed < DEADLINE + 1.0
    assert info.value.retryable is True
    assert info.value.parameter == "multi_modal_data"


def test_each_redirect_hop_alone_fits_the_deadline(base: str, connector: MediaConnector) -> None:
    """The control for ``/hop/2``: one 0.3 s hop passes a 0.5 s deadline, so it is the shared
    deadline, not a per-hop one, that stops the chain above."""
    assert connector.fetch_bytes(f"{base}/hop/0", timeout=DEADLINE) == BODY


def test_a_fast_answer_after_a_redirect_arrives_whole(base: str, connector: MediaConnector) -> None:
    assert connector.fetch_bytes(f"{base}/fast", timeout=DEADLINE) == BODY


def test_an_exhausted_deadline_is_refused_before_connecting(base: str, connector: MediaConnector) -> None:
    with pytest.raises(MediaFetchError, match="timed out after 0 s") as info:
        connector.fetch_bytes(f"{base}/fast", timeout=0)
    assert info.value.retryable is True
