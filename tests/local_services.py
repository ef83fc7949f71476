"""What several test modules start inside a test: a loopback HTTP server, a fresh interpreter that
measures one image decode's peak memory, a worker, and an in-memory transport end (:class:`Inbox`)."""

from __future__ import annotations

import socketserver
import subprocess
import sys
import textwrap
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mmfront.engine.transports import BaseTransport
from preloaded import Preloaded, popen


class _QuietServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: object, client_address: object) -> None:
        return  # clients that time out or hang up on purpose leave broken pipes behind


@contextmanager
def serve_http(handler: type[socketserver.BaseRequestHandler]) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` served by ``handler`` on a thread until the block ends."""
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


_MEASURE = textwrap.dedent("""
    import re, sys
    import isal.isal_zlib  # loaded by the first PNG decode; a serving process has it already
    import mmfront.preprocess  # as is all a serving process imports (the mmfront package imports lazily)
    from mmfront.config import MultiModalConfig
    from mmfront.media import DecodeBudget, load_image_bytes

    def kib(field):
        return int(re.search(field + r":\\s+(\\d+)", open("/proc/self/status").read()).group(1))

    payload = open(sys.argv[1], "rb").read()
    budget = DecodeBudget(1 << 34)
    item = load_image_bytes(payload, config=MultiModalConfig(), budget=budget)
    open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
    before = kib("VmRSS")
    item.media
    print(budget.used_bytes, (kib("VmHWM") - before) * 1024)
""")


DECODER_FIXED_BYTES = 1 << 20
"""What a decode's peak may exceed its charge by whatever the image's size: the decoder's own
working memory (inflate state, PIL's decoder). Measured in a fresh interpreter whose modules load
from ``.pyc`` files: 0.56 to 0.62 MB over the charge for RGB PNGs of 1200x1000 to 4800x4000; with
no ``.pyc`` files, the compiler's freed memory absorbs most of it (0.12 to 0.15 MB)."""


def within_decode_charge(charged: int, measured: int) -> bool:
    """Whether a measured decode peak stays within its charge: 2% over it, plus the decoder's
    fixed working memory."""
    return measured <= charged * 1.02 + DECODER_FIXED_BYTES


def measure_decode_peak(path: Path) -> tuple[int, int]:
    """Decoding the image file ``path`` in a fresh interpreter: the bytes the decode budget
    charged for it, and the growth of the peak RSS the decode itself caused (Linux only)."""
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(path)], capture_output=True, text=True, check=True,
                         timeout=120)
    charged, measured = map(int, out.stdout.split())
    return charged, measured


def start_worker_command(model_dir: Path, input_address: str, output_address: str,
                         cache_gb: float) -> Preloaded:
    """``mmfront worker`` as a user starts it, on a frontend's ZMQ addresses, printing its
    statistics as JSON when it stops (from the preloaded interpreter: :mod:`preloaded`)."""
    return popen(
        [sys.executable, "-m", "mmfront.cli", "worker", str(model_dir), "--input", input_address,
         "--output", output_address, "--cache-gb", str(cache_gb), "--json"],
        stdout=subprocess.PIPE, text=True)


def greedy_answers(model_dir: Path, prompts: list[Any], max_tokens: int) -> list[list[int]]:
    """What the model in ``model_dir`` answers to each prompt (chat messages, a string, token
    ids), greedy and in-process: mmfront's processing with no cache and no wire, then
    :class:`~mmfront.engine.runner.ModelRunner`. What every engine link must reproduce."""
    from mmfront import InputPreprocessor, InputProcessor, MultiModalConfig
    from mmfront.engine.runner import ModelRunner
    from mmfront.wire import SamplingParams

    processor = InputProcessor(InputPreprocessor(model_dir, MultiModalConfig(mm_processor_cache_gb=0)))
    runner = ModelRunner(model_dir)
    for n, prompt in enumerate(prompts):
        runner.add(processor.process_inputs(str(n), prompt, SamplingParams(max_tokens=max_tokens)))
    answers: list[list[int]] = [[] for _ in prompts]
    while runner.has_unfinished_requests:
        for output in runner.step():
            answers[int(output.request_id)] += output.new_token_ids
    return answers


def caller_id(engine_id: str) -> str:
    """The caller's request id inside the id the engine got from the async client
    (``engine_request_id``: the caller's id, a dash, 8 random hex characters)."""
    caller, dash, suffix = engine_id.rpartition("-")
    assert dash and len(suffix) == 8 and all(c in "0123456789abcdef" for c in suffix), engine_id
    return caller


class Inbox(BaseTransport):
    """An in-memory transport end: hands out the messages it was given, in order, and records
    what is sent (tests that drive a receiver or a client message by message)."""

    def __init__(self, *messages: list[Any]) -> None:
        self.inbox = deque(messages)
        self.sent: list[list[Any]] = []

    def send(self, frames: Sequence[Any]) -> None:
        self.sent.append(list(frames))

    def recv(self, timeout: float | None = None) -> list[Any] | None:
        return self.inbox.popleft() if self.inbox else None

    def close(self) -> None:
        self.inbox.clear()
