from __future__ import annotations

import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler

import pytest
from media_samples import PNG_32, SLOW_SECONDS, WAV_1S

from local_services import serve_http
from mmfront.config import MultiModalConfig
from mmfront.media import DecodeBudget


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return

    def _send(self, body: bytes, content_type: str = "application/octet-stream", *, length: int | None = None) -> None:
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body) if length is None else length))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path
        if path == "/ok.png":
            self._send(PNG_32, "image/png")
        elif path == "/ok.wav":
            self._send(WAV_1S, "audio/wav")
        elif path == "/slow.png":
            time.sleep(SLOW_SECONDS)
            self._send(PNG_32, "image/png")
        elif path == "/big":
            self.send_response(200)
            self.end_headers()  # no Content-Length: the body runs until the connection closes
            self.wfile.write(b"x" * 5000)
        elif path == "/biglen":
            self._send(b"abc", length=10**9)
        elif path == "/redirect-out":
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.server.server_address[1]}/ok.png")
            self.end_headers()
        elif path == "/redirect-in":
            self.send_response(302)
            self.send_header("Location", "/ok.png")
            self.end_headers()
        elif path.startswith("/status/"):
            self.send_error(int(path.rsplit("/", 1)[1]))
        else:
            self.send_error(404)


@pytest.fixture(scope="session")
def http_base() -> Iterator[str]:
    with serve_http(_Handler) as base:
        yield base


@pytest.fixture
def config() -> MultiModalConfig:
    return MultiModalConfig()


@pytest.fixture
def budget() -> DecodeBudget:
    return DecodeBudget(1 << 30)
