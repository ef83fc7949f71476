"""``mmfront serve`` as a user runs it, answered by OpenAI's own client: the command starts its
engine, serves chats (whole and streamed) under the served model name; a killed engine turns
``/health`` to 503 and fails the stream in flight at once (kept alive by
``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``: without it the server exits, tests/serve/test_launcher_start_stop.py); SIGTERM ends the server with status 0
and no engine left. One server (and one worker) for the module."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.servers import serve_process

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow

IMAGE = image_data_url(make_image(40, 32, seed=5))
CHAT: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE}},
                                                           {"type": "text", "text": "What is this?"}]}]


@dataclass
class Running:
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def status(self, path: str) -> int:
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as e:
            return e.code

    def children(self) -> list[int]:
        """The server's child processes (its engines and processing lanes)."""
        out = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                fields = stat.read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == self.process.pid and fields[0] != "Z":
                    out.append(int(stat.parent.name))
        return out


@pytest.fixture(scope="module")
def server(gemma3_weights_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve_process(gemma3_weights_dir, log, env={"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}) as (process, url):
        yield Running(process, url, log)


@pytest.fixture
def client(server: Running) -> Any:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def test_the_served_model_name_is_listed(client: Any) -> None:
    assert [m.id for m in client.models.list().data] == ["tiny"]


def test_a_chat_is_answered_whole_and_streamed_with_the_same_text(client: Any) -> None:
    whole = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, temperature=0)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 4
    chunks = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=4, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content


def test_a_killed_engine_fails_the_stream_in_flight_and_health_turns_503(server: Running, client: Any) -> None:
    [engine] = [pid for pid in server.children() if b"worker" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    stream = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=300, temperature=0, stream=True,
                                            extra_body={"ignore_eos": True})
    with pytest.raises((openai.APIError, openai.APIConnectionError)):
        for n, _ in enumerate(stream):
            if n == 1:
                os.kill(engine, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while server.status("/health") != 503:
        assert time.monotonic() < deadline, "the server did not notice its engine died"
        time.sleep(0.1)


def test_sigterm_ends_the_server_with_status_0_and_no_child_left(server: Running) -> None:
    children = server.children()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(60) == 0, server.log.read_text()
    assert [pid for pid in children if Path(f"/proc/{pid}").exists()] == []
