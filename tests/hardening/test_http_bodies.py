"""Issue 36, Build 2 and 5, on ``mmfront serve`` as a subprocess (its memory measured on its own):
request bodies are held once and within a budget across requests (503 before reading past it),
a chat request's message and part counts are refused before it is decoded into Python objects
and its text before the template renders it, and of two ``Authorization`` headers the first is
checked, as vLLM checks it. Memory is the server's peak RSS (``VmHWM``, reset before each case)
over its RSS before, bounded in proportion to the bytes sent. One server for the module."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mmfront.testing.servers import serve_process

pytestmark = pytest.mark.slow

KEY = "front-door-key"
MiB = 1 << 20
MAX_BODY = 48 * MiB
IN_FLIGHT = 64 * MiB


@dataclass
class Server:
    """The API server process (its pid, for its memory) and its port."""

    pid: int
    port: int

    def memory_kib(self, field: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(field)

    def reset_peak(self) -> int:
        """Reset the peak RSS to the RSS now; the RSS now, in bytes."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        return self.memory_kib("VmRSS") * 1024

    def peak(self) -> int:
        return self.memory_kib("VmHWM") * 1024

    def post(self, path: str, body: bytes, headers: dict[str, str] | None = None, *,
             timeout: float = 60) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", path, body, {"Content-Type": "application/json",
                                              "Authorization": f"Bearer {KEY}", **(headers or {})})
            answer = conn.getresponse()
            data = answer.read()
            return answer.status, json.loads(data) if data else None
        finally:
            conn.close()


@pytest.fixture(scope="module")
def server(gemma3_weights_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve_process(gemma3_weights_dir, log, "--api-key", KEY, "--max-body-bytes", str(MAX_BODY),
                       "--max-body-bytes-in-flight", str(IN_FLIGHT), "--body-read-timeout", "30",
                       "--max-model-len", "128") as (process, url):
        yield Server(process.pid, int(url.rsplit(":", 1)[1]))


def chat_body(messages: list[dict[str, Any]]) -> bytes:
    return json.dumps({"model": "tiny", "messages": messages, "max_tokens": 2, "temperature": 0}, separators=(",", ":")).encode()


def test_a_body_is_held_once_while_it_is_read(server: Server) -> None:
    """A 40 MiB body refused by the JSON decoder at its first byte: the server's peak is the body
    once (before: its parts and their join, twice: +80 MiB). First in the module, while the
    server's heap has no freed memory the parts could reuse unseen."""
    body = b"x" * (40 * MiB)
    before = server.reset_peak()
    status, answer = server.post("/v1/chat/completions", body)
    assert status == 400
    assert answer["error"]["message"].startswith("JSON decode error")
    assert server.peak() - before < 1.4 * len(body), (server.peak() - before) / MiB


def test_the_first_authorization_header_is_the_one_checked(server: Server) -> None:
    """vLLM reads ``request.headers.get("Authorization")``: the first of several."""
    def status(first: str, second: str) -> int:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.putrequest("GET", "/v1/models")
        conn.putheader("Authorization", first)
        conn.putheader("Authorization", second)
        conn.endheaders()
        answer = conn.getresponse()
        answer.read()
        conn.close()
        return answer.status

    assert status(f"Bearer {KEY}", "Bearer wrong") == 200
    assert status("Bearer wrong", f"Bearer {KEY}") == 401


def test_a_million_messages_are_refused_before_they_are_decoded(server: Server) -> None:
    """16 MB of ``{"role":"user"}``: before, no answer in 15 s and +1.5 GiB."""
    body = chat_body([{"role": "user"}] * 1_000_000)
    before = server.reset_peak()
    status, answer = server.post("/v1/chat/completions", body, timeout=30)
    assert (status, answer) == (400, {"error": {
        "message": "The request has 1000000 messages; the server's limit is 10000 (--max-chat-messages). "
                   "(parameter=messages)",
        "type": "BadRequestError", "param": "messages", "code": 400}})
    assert server.peak() - before < 6 * len(body), (server.peak() - before) / MiB


def test_a_content_of_another_kind_does_not_let_a_million_messages_through(server: Server) -> None:
    """One message whose content is a number made the counting decode fail, which skipped the
    bound: the million messages were decoded into a million dicts."""
    body = chat_body([{"role": "user", "content": "a"}] * 1_000_000 + [{"role": "user", "content": 5}])
    before = server.reset_peak()
    status, answer = server.post("/v1/chat/completions", body, timeout=30)
    assert (status, answer["error"]["param"]) == (400, "messages")
    assert answer["error"]["message"].startswith("The request has 1000001 messages; the server's limit is 10000 ")
    assert server.peak() - before < 6 * len(body), (server.peak() - before) / MiB


def test_a_million_text_parts_are_refused_before_they_are_decoded(server: Server) -> None:
    """One message of a million text parts: before, 400 after 7 s and +892 MiB."""
    body = chat_body([{"role": "user", "content": [{"type": "text", "text": "a"}] * 1_000_000}])
    before = server.reset_peak()
    status, answer = server.post("/v1/chat/completions", body, timeout=30)
    assert (status, answer) == (400, {"error": {
        "message": "The request's messages have 1000000 content parts; the server's limit is 10000 "
                   "(--max-content-parts). (parameter=messages)", "type": "BadRequestError", "param": "messages", "code": 400}})
    assert server.peak() - before < 6 * len(body), (server.peak() - before) / MiB
    status, answer = server.post("/tokenize", body, timeout=30)
    assert (status, answer["error"]["param"]) == (400, "messages")


def test_text_longer_than_any_prompt_is_refused_before_the_template(server: Server) -> None:
    """``--max-model-len 128``: no prompt longer than 128 x the longest token string is tokenized;
    messages holding more text than that are refused before they are rendered."""
    body = chat_body([{"role": "user", "content": "x" * 600_000},
                      {"role": "user", "content": [{"type": "text", "text": "y" * 600_000}]}])
    status, answer = server.post("/v1/chat/completions", body)
    assert status == 400
    assert answer["error"]["param"] == "messages"
    # 1,200,000 bytes of text hold at least 100,000 characters (12 bytes at most to one): over the bound, so
    # the 1.2 MB are refused from their length, never decoded into strings
    assert answer["error"]["message"].startswith("The messages hold at least 100000 characters of text; the longest "
                                                 "prompt the server tokenizes is ")


def test_bodies_in_flight_together_are_bounded(server: Server) -> None:
    """Six 20 MiB bodies at once under a 64 MiB budget: three are read, three are answered 503
    before a byte of their body is read; the server holds at most the budget."""
    size = 20 * MiB
    text = "z" * (size - len(chat_body([{"role": "user", "content": ""}])))
    body = chat_body([{"role": "user", "content": text}])
    assert len(body) == size
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {KEY}\r\nContent-Length: {size}\r\n\r\n").encode()
    before = server.reset_peak()
    socks = []
    for _ in range(6):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(head + body[:MiB])
        socks.append(sock)
        time.sleep(0.2)
    refused, held = [], []
    for sock in socks:
        sock.settimeout(2)
        try:
            refused.append((sock, sock.recv(65536)))
        except TimeoutError:
            held.append(sock)
    assert len(held) == 3 and len(refused) == 3
    for sock, response in refused:
        assert response.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
        error = json.loads(response.split(b"\r\n\r\n", 1)[1])["error"]
        assert error["type"] == "ServiceUnavailableError"
        assert error["message"].endswith("the limit is 67108864 bytes (--max-body-bytes-in-flight). The request is "
                                         "not at fault: retry it.")
        sock.close()
    for sock in held:
        sock.settimeout(60)
        sock.sendall(body[MiB:-1])
    time.sleep(1)
    assert server.peak() - before < 1.25 * IN_FLIGHT, (server.peak() - before) / MiB
    for sock in held:
        sock.sendall(body[-1:])
        response = sock.recv(65536)
        assert response.startswith(b"HTTP/1.1 400 Bad Request\r\n"), response[:200]
        sock.close()
    status, answer = server.post("/v1/chat/completions", chat_body([{"role": "user", "content": "Hi"}]))
    assert status == 200, answer
