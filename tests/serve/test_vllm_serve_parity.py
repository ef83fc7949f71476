"""``mmfront serve`` and vLLM's own ``vllm serve`` side by side, each in front of a STOCK vLLM
0.33 engine core (``../shared/peer/stock_engine.py``: ``vllm serve --headless`` with the stub
executor, whose generated token k is 1000 + 10 * images + k), both API servers started with the
same flags and ``--data-parallel-size-local 0``: the same requests get the same answers, field by
field, with only what differs per request masked (``chatcmpl-``/``cmpl-``/``modelperm-`` ids,
``created``, ``system_fingerprint``).

Compared exactly: ``/health``, ``/v1/models``, chat completions (an image as a data URL and text,
two images, text only, a system message and earlier turns, ``max_tokens``,
``max_completion_tokens``, temperature 0, ``n=2``, every sampling field, ``cache_salt``,
``ignore_eos``, ``skip_special_tokens``, no ``model``, an unknown field, stop strings with and
without ``include_stop_str_in_output``, ``stop_token_ids``, both at once), text completions (one
prompt, a list of prompts, token ids, ``n=2``, stop strings and ids) and the request errors both
word alike (404 unknown model; 400 for ``max_tokens`` -1 and 0, ``temperature`` and ``top_p`` out of
range, ``top_logprobs`` without ``logprobs``, ``stream_options`` without ``stream``, ``max_tokens``
beyond the context, a completion without a prompt or with an empty one). With ``X-Request-Id``
both name the completion after it. Streams (chat and completion, ``n`` 1 and 2, with and without
``stream_options.include_usage``, a stop string) are compared by what does not depend on timing:
each chat choice's role chunk, each choice's concatenated text, its finish chunk less its text, the
usage chunk, the field names of every kind of chunk and the closing ``[DONE]``; where a server
cuts the text into chunks depends on when the engine's outputs reach it.

Differences, asserted only where the two agree (docs/serving.md, "Differences from vllm serve"):

* ``/version``: both answer ``{"version": str}``, each its own version.
* A body of the wrong shape (no ``messages``, ``messages`` not a list, JSON that does not parse):
  both 400 ``"Bad Request"``, with the same ``param`` for a field; the message is msgspec's words
  in mmfront and pydantic's in vLLM (and ``param`` ``body`` where vLLM says ``body.1``).
* A sampling value out of range (penalties, ``min_p``, ``top_k``, ``n``): both 400
  ``BadRequestError``; mmfront names the field in ``param`` where vLLM gives ``null``, and words
  two messages its own way.
* An image that does not decode, more images than ``--limit-mm-per-prompt``, an empty
  ``messages`` list, a completion ``suffix``: both 400 ``BadRequestError`` (the same ``param`` for
  the image limit and the suffix); mmfront's messages are its own, and it names
  ``multi_modal_data`` for a bad image where vLLM gives no param.
* mmfront answers ``X-Request-Id`` in a response header too (vLLM only with
  ``--enable-request-id-headers``).
* Not compared here: ``logprobs`` and ``echo`` (this stub executor computes no logprobs, and vLLM
  answers 500 without them; test_vllm_serve_logprobs.py compares them over an engine that sends
  logprobs), ``top_k: -1`` and ``chat_template_kwargs: {"add_generation_prompt": false}`` (vLLM
  answers 500).
* Both refuse more than ``--max-logprobs`` (20) top logprobs with the same 400.

Skipped where the peer venv, its model folder or ``../shared/peer`` is absent
(:mod:`mmfront.testing.peer`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from mmfront.network import get_open_ports_list
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_model_dir, vllm_peer_python

PEER = vllm_peer_python()
MODEL = None if PEER is None else vllm_peer_model_dir(PEER)
_BESIDE_CHECKOUT = Path(__file__).resolve().parents[3] / "shared" / "peer"
PEER_DIR = (_BESIDE_CHECKOUT if _BESIDE_CHECKOUT.is_dir() or PEER is None or not (PEER.parents[2] / "stock_engine.py").is_file()
            else PEER.parents[2])
"""The peer's scripts: beside the checkout, or (a checkout elsewhere, e.g. a git worktree) the folder
the peer venv was built in, ``../shared/peer/.venv-vllm``."""
LOG_STATS_ENGINE = Path(__file__).resolve().parent / "data" / "stock_engine_log_stats.py"
pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side,
              pytest.mark.skipif(PEER is None or MODEL is None or not PEER_DIR.is_dir(), reason=SKIP_REASON)]

SERVED = "tiny-gemma3"
SERVER_FLAGS = ["--max-model-len", "4096", "--limit-mm-per-prompt", '{"image": 4}', "--mm-processor-cache-gb", "4",
                "--uvicorn-log-level", "warning"]
"""The flags both API servers get (the stock engine's own equal them: stock_engine.py)."""
STARTUP_S = 600.0
"""Bound on the start of both engines and servers (a minute or two each on a small CPU host)."""
REQUEST_S = 120.0

IMAGE = image_data_url(make_image(40, 32, seed=3))
CHAT = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE}},
                                     {"type": "text", "text": "What is in this picture?"}]}]
"""With one image the stub generates 1010, 1011, ...: 'd,', ' no', 'linen', 'unt', 'num', ..."""


@dataclass
class Side:
    """One API server and the stock engine behind it; every process in its own session."""

    name: str
    url: str
    logs: dict[str, Path]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def tails(self, lines: int = 25) -> str:
        out = []
        for role, log in self.logs.items():
            with contextlib.suppress(OSError):
                text = log.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {self.name} {role} log ({log}) ---\n" + "\n".join(text))
        return "\n".join(out)

    def exited(self) -> str | None:
        for role, process in self.processes.items():
            if process.poll() is not None:
                return f"{self.name}: the {role} exited with status {process.returncode}"
        return None

    def stop(self) -> None:
        """SIGTERM each process group, then SIGKILL what is left of it."""
        for process in reversed(self.processes.values()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(30)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


def start_side(name: str, server: list[str], server_env: dict[str, str], folder: Path, *,
               model: Path | None = None, engine_args: Sequence[str] = (), engine_path: Sequence[Path] = (),
               server_args: Sequence[str] = (), engine_log_stats: bool = False) -> Side:
    """A stock engine (headless, tcp handshake) and ``server`` (an argv prefix taking the shared
    serve flags) pointed at each other through a free rpc port; ``engine_args`` go to the engine
    (a ``--distributed-executor-backend`` there wins over the stub's), ``engine_path`` on its
    ``PYTHONPATH``, ``server_args`` to the server after the shared flags. ``engine_log_stats``: the
    engine sends its statistics (data/stock_engine_log_stats.py), as a production engine does."""
    assert PEER is not None and MODEL is not None
    model = model or MODEL
    rpc, port = get_open_ports_list(2)
    side = Side(name, f"http://127.0.0.1:{port}", {"engine": folder / f"{name}.engine.log",
                                                    "server": folder / f"{name}.server.log"})
    vllm_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    vllm_env.update(VLLM_TARGET_DEVICE="cpu", OMP_NUM_THREADS="1")
    engine_env = {**vllm_env, "PYTHONPATH": os.pathsep.join(map(str, engine_path))} if engine_path else vllm_env
    with side.logs["engine"].open("wb") as log:
        side.processes["engine"] = subprocess.Popen(
            [str(PEER), *([str(LOG_STATS_ENGINE), str(PEER_DIR)] if engine_log_stats else [str(PEER_DIR / "stock_engine.py")]),
             str(model), f"tcp://127.0.0.1:{rpc}",
             "--", "--mm-processor-cache-gb", "4", *engine_args],
            cwd=PEER_DIR, stdout=log, stderr=subprocess.STDOUT, env=engine_env, start_new_session=True)
    argv = [*server, "serve", str(model), "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED,
            "--data-parallel-size", "1", "--data-parallel-size-local", "0", "--data-parallel-address", "127.0.0.1",
            "--data-parallel-rpc-port", str(rpc), *SERVER_FLAGS, *server_args]
    try:
        with side.logs["server"].open("wb") as log:
            side.processes["server"] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                                        env={**vllm_env, **server_env}, start_new_session=True)
    except BaseException:
        side.stop()
        raise
    return side


def wait_healthy(sides: list[Side]) -> None:
    deadline = time.monotonic() + STARTUP_S
    waiting = list(sides)
    while waiting:
        for side in list(waiting):
            gone = side.exited()
            assert gone is None, f"{gone}\n{side.tails()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(side.url + "/health", timeout=5).status_code == 200:
                    waiting.remove(side)
        assert time.monotonic() < deadline, (f"not healthy after {STARTUP_S:.0f}s: {[s.name for s in waiting]}\n"
                                             + "\n".join(s.tails() for s in waiting))
        time.sleep(0.5)


@dataclass
class Pair:
    vllm: Side
    mmfront: Side


@contextlib.contextmanager
def running_pair(folder: Path, *, server_args: Sequence[str] = (), engine_log_stats: bool = False,
                 env: dict[str, str] | None = None, model: Path | None = None, engine_args: Sequence[str] = (),
                 engine_path: Sequence[Path] = ()) -> Iterator[Pair]:
    """Both servers, each with ``server_args`` (and ``env``) in front of its own stock engine
    (serving ``model``, with :func:`start_side`'s ``engine_args`` and ``engine_path``), healthy;
    stopped on exit."""
    assert PEER is not None
    sides: list[Side] = []
    def start(name: str, server: list[str], server_env: dict[str, str]) -> None:
        sides.append(start_side(name, server, server_env, folder, model=model, engine_args=engine_args,
                                engine_path=engine_path, server_args=server_args, engine_log_stats=engine_log_stats))

    try:
        start("vllm", [str(PEER.parent / "vllm")], dict(env or {}))
        start("mmfront", [sys.executable, "-m", "mmfront.cli"],
              {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "VLLM_TARGET_DEVICE": "cpu", **(env or {})})
        wait_healthy(sides)
        yield Pair(*sides)
    finally:
        for side in sides:
            side.stop()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    if PEER is None or MODEL is None or not PEER_DIR.is_dir():  # modules that import this fixture too
        pytest.skip(SKIP_REASON)
    with running_pair(tmp_path_factory.mktemp("parity")) as both_servers:
        yield both_servers


@dataclass
class Answer:
    status: int
    text: str
    content_type: str | None = None

    def json(self) -> Any:
        return json.loads(self.text)


def ask(side: Side, method: str, path: str, body: Any = None, raw: bytes | None = None) -> Answer:
    content = raw if raw is not None else None if body is None else json.dumps(body).encode()
    try:
        answer = httpx.request(method, side.url + path, content=content, timeout=REQUEST_S,
                               headers={"Content-Type": "application/json"})
    except httpx.HTTPError as e:
        raise AssertionError(f"{side.name} {method} {path}: {e!r}\n{side.tails()}") from e
    return Answer(answer.status_code, answer.text, answer.headers.get("content-type"))


def both(pair: Pair, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[Answer, Answer]:
    return ask(pair.vllm, method, path, body, raw), ask(pair.mmfront, method, path, body, raw)


ID = re.compile(r"^(chatcmpl|cmpl|modelperm)-[0-9a-zA-Z-]+$")


def masked(value: Any) -> Any:
    """``value`` with what differs per request replaced: an id keeps its prefix."""
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key == "id" and isinstance(item, str) and ID.match(item):
                out[key] = item.split("-", 1)[0] + "-*"
            elif key in ("created", "system_fingerprint") and item is not None:
                out[key] = "*"
            else:
                out[key] = masked(item)
        return out
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def explain(pair: Pair, vllm: Answer, mmfront: Answer) -> str:
    text = f"\nvllm    {vllm.status}: {vllm.text[:3000]}\nmmfront {mmfront.status}: {mmfront.text[:3000]}"
    return text + ("" if vllm.status < 500 and mmfront.status < 500 else f"\n{pair.vllm.tails()}\n{pair.mmfront.tails()}")


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "messages": CHAT, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "prompt": "Hello there", **fields}


SAME: dict[str, tuple[str, str, Any]] = {
    "health": ("GET", "/health", None),
    "models": ("GET", "/v1/models", None),
    "chat": ("POST", "/v1/chat/completions", chat(max_tokens=3, temperature=0)),
    "chat_max_completion_tokens": ("POST", "/v1/chat/completions", chat(max_completion_tokens=2)),
    "chat_n2": ("POST", "/v1/chat/completions", chat(max_tokens=2, n=2, temperature=1.0)),
    "chat_two_images": ("POST", "/v1/chat/completions",
                        {"model": SERVED, "max_tokens": 3, "messages": [{"role": "user", "content": [
                            CHAT[0]["content"][0], CHAT[0]["content"][0], {"type": "text", "text": "Same?"}]}]}),
    "chat_text_only": ("POST", "/v1/chat/completions",
                       {"model": SERVED, "messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 3}),
    "chat_system_and_turns": ("POST", "/v1/chat/completions",
                              {"model": SERVED, "max_tokens": 3, "messages": [
                                  {"role": "system", "content": "Be brief."}, *CHAT,
                                  {"role": "assistant", "content": "A box."}, {"role": "user", "content": "Sure?"}]}),
    "chat_sampling_fields": ("POST", "/v1/chat/completions",
                             chat(max_tokens=2, seed=7, top_p=0.5, top_k=3, min_p=0.1, presence_penalty=0.5,
                                  frequency_penalty=0.2, repetition_penalty=1.1, ignore_eos=True,
                                  skip_special_tokens=False, cache_salt="salt")),
    "chat_model_omitted": ("POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2}),
    "chat_unknown_field_ignored": ("POST", "/v1/chat/completions", chat(max_tokens=2, foo_bar=1)),
    "chat_stop": ("POST", "/v1/chat/completions", chat(max_tokens=6, stop=["line"])),
    "chat_stop_included": ("POST", "/v1/chat/completions",
                           chat(max_tokens=6, stop=["line"], include_stop_str_in_output=True)),
    "chat_stops_first_wins": ("POST", "/v1/chat/completions", chat(max_tokens=6, stop=["no", "d,"])),
    "chat_stop_token_ids": ("POST", "/v1/chat/completions", chat(max_tokens=6, stop_token_ids=[1012])),
    "chat_stop_and_stop_token_ids": ("POST", "/v1/chat/completions",
                                     chat(max_tokens=6, stop=["unt"], stop_token_ids=[1014])),
    "chat_stop_token_before_stop": ("POST", "/v1/chat/completions",
                                    chat(max_tokens=6, stop=["unt"], stop_token_ids=[1012])),
    "chat_stop_missed": ("POST", "/v1/chat/completions", chat(max_tokens=4, stop=["zzz"], stop_token_ids=[1021])),
    "completion": ("POST", "/v1/completions", completion(max_tokens=3, temperature=0)),
    "completion_list": ("POST", "/v1/completions", completion(prompt=["Hello", "there"], max_tokens=2)),
    "completion_token_ids": ("POST", "/v1/completions", completion(prompt=[2, 1000, 1001], max_tokens=2)),
    "completion_n2": ("POST", "/v1/completions", completion(max_tokens=2, n=2)),
    "completion_stop": ("POST", "/v1/completions", completion(max_tokens=5, stop=[" 3"])),
    "completion_stop_token_included": ("POST", "/v1/completions",
                                       completion(max_tokens=4, stop_token_ids=[1001], include_stop_str_in_output=True)),
    "unknown_model": ("POST", "/v1/chat/completions", {**chat(max_tokens=3), "model": "nope"}),
    "max_tokens_negative": ("POST", "/v1/chat/completions", chat(max_tokens=-1)),
    "max_tokens_zero": ("POST", "/v1/chat/completions", chat(max_tokens=0)),
    "temperature_out_of_range": ("POST", "/v1/chat/completions", chat(temperature=5)),
    "top_p_out_of_range": ("POST", "/v1/chat/completions", chat(max_tokens=2, top_p=1.5)),
    "top_logprobs_without_logprobs": ("POST", "/v1/chat/completions", chat(max_tokens=2, top_logprobs=2)),
    "stream_options_without_stream": ("POST", "/v1/chat/completions",
                                      chat(max_tokens=2, stream_options={"include_usage": True})),
    "max_tokens_beyond_context": ("POST", "/v1/chat/completions", chat(max_tokens=100000)),
    "completion_without_prompt": ("POST", "/v1/completions", {"model": SERVED}),
    "completion_empty_prompt": ("POST", "/v1/completions", completion(prompt="", max_tokens=2)),
}


@pytest.mark.parametrize("case", SAME)
def test_the_same_request_gets_the_same_answer(pair: Pair, case: str) -> None:
    method, path, body = SAME[case]
    vllm, mmfront = both(pair, method, path, body)
    assert vllm.status == mmfront.status, explain(pair, vllm, mmfront)
    assert vllm.content_type == mmfront.content_type, explain(pair, vllm, mmfront)
    if vllm.text == "" or mmfront.text == "":
        assert vllm.text == mmfront.text, explain(pair, vllm, mmfront)
    else:
        assert masked(mmfront.json()) == masked(vllm.json()), explain(pair, vllm, mmfront)


@dataclass
class Stream:
    """What a stream says that does not depend on where its text was cut into chunks."""

    role: dict[int, Any] = field(default_factory=dict)
    """Each chat choice's first chunk, the one naming the role."""
    text: dict[int, str] = field(default_factory=dict)
    finish: dict[int, Any] = field(default_factory=dict)
    """Each choice's finish chunk, its text left out."""
    usage: list[Any] = field(default_factory=list)
    shapes: dict[str, set[tuple[Any, ...]]] = field(default_factory=dict)
    """Per kind of chunk, the field names of the chunk and of its choice."""
    done: bool = False


def read_stream(answer: Answer) -> Stream:
    assert answer.status == 200, answer.text
    stream = Stream()
    events = [e for e in answer.text.split("\n\n") if e.strip()]
    assert events and events[-1] == "data: [DONE]", answer.text
    stream.done = True
    for event in events[:-1]:
        assert event.startswith("data: "), event
        chunk = masked(json.loads(event.removeprefix("data: ")))
        if not chunk["choices"]:
            stream.usage.append(chunk)
            stream.shapes.setdefault("usage", set()).add(tuple(chunk))
            continue
        [choice] = chunk["choices"]
        index = choice["index"]
        key = "content" if "delta" in choice else "text"
        fields = choice.get("delta", choice)
        stream.text[index] = stream.text.get(index, "") + (fields.get(key) or "")
        if "role" in fields:
            kind = "role"
            assert index not in stream.role, f"two role chunks for choice {index}: {answer.text}"
            stream.role[index] = chunk
        elif choice["finish_reason"] is not None:
            kind = "finish"
            assert index not in stream.finish, f"two finish chunks for choice {index}: {answer.text}"
            without_text = json.loads(json.dumps(chunk))
            without_text["choices"][0].get("delta", without_text["choices"][0]).pop(key, None)
            stream.finish[index] = without_text
        else:
            kind = "text"
        stream.shapes.setdefault(kind, set()).add((tuple(chunk), tuple(choice), tuple(choice.get("delta", ()))))
    return stream


STREAMS: dict[str, tuple[str, Any]] = {
    "chat_with_usage": ("/v1/chat/completions", chat(max_tokens=3, stream_options={"include_usage": True})),
    "chat_without_usage": ("/v1/chat/completions", chat(max_tokens=2)),
    "chat_n2_with_usage": ("/v1/chat/completions", chat(max_tokens=3, n=2, stream_options={"include_usage": True})),
    "chat_stop": ("/v1/chat/completions", chat(max_tokens=6, stop=["line"], stream_options={"include_usage": True})),
    "completion_with_usage": ("/v1/completions", completion(max_tokens=3, stream_options={"include_usage": True})),
}


@pytest.mark.parametrize("case", STREAMS)
def test_a_stream_says_the_same(pair: Pair, case: str) -> None:
    path, body = STREAMS[case]
    vllm, mmfront = both(pair, "POST", path, {**body, "stream": True})
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    assert vllm.content_type == mmfront.content_type, explain(pair, vllm, mmfront)
    want, got = read_stream(vllm), read_stream(mmfront)
    for name in ("role", "text", "finish", "usage", "done"):
        assert getattr(got, name) == getattr(want, name), f"{name} differs" + explain(pair, vllm, mmfront)
    common = set(want.shapes) & set(got.shapes)
    assert want.finish and set(want.shapes) - {"text"} == set(got.shapes) - {"text"}, explain(pair, vllm, mmfront)
    for kind in common:
        assert got.shapes[kind] == want.shapes[kind], f"{kind} chunks' fields differ" + explain(pair, vllm, mmfront)


def error(answer: Answer) -> dict[str, Any]:
    body = answer.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, answer.text
    return dict(body["error"])


def test_version_has_the_same_shape_and_each_its_own_version(pair: Pair) -> None:
    vllm, mmfront = both(pair, "GET", "/version")
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    assert set(vllm.json()) == set(mmfront.json()) == {"version"}, explain(pair, vllm, mmfront)
    assert isinstance(vllm.json()["version"], str) and isinstance(mmfront.json()["version"], str)


def test_x_request_id_names_the_completion_in_both(pair: Pair) -> None:
    answers = [httpx.post(side.url + "/v1/chat/completions", json=chat(max_tokens=2), timeout=REQUEST_S,
                          headers={"X-Request-Id": "my-request-7"}) for side in (pair.vllm, pair.mmfront)]
    vllm, mmfront = (Answer(a.status_code, a.text) for a in answers)
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    assert vllm.json()["id"] == mmfront.json()["id"] == "chatcmpl-my-request-7", explain(pair, vllm, mmfront)
    assert masked(mmfront.json()) == masked(vllm.json()), explain(pair, vllm, mmfront)


@pytest.mark.parametrize("body", [{"model": SERVED}, {"model": SERVED, "messages": "hi"}, b"{not json"],
                         ids=["no_messages", "messages_not_a_list", "malformed_json"])
def test_a_body_of_the_wrong_shape_is_a_400_in_both(pair: Pair, body: Any) -> None:
    raw = body if isinstance(body, bytes) else None
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", None if raw else body, raw)
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    want, got = error(vllm), error(mmfront)
    assert (got["type"], got["code"]) == (want["type"], want["code"]) == ("Bad Request", 400), \
        explain(pair, vllm, mmfront)
    if raw is None:
        assert got["param"] == want["param"] == "body.messages", explain(pair, vllm, mmfront)


@pytest.mark.parametrize(("fields", "param"), [
    ({"presence_penalty": 3}, "presence_penalty"), ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"min_p": 2}, "min_p"), ({"top_k": -5}, "top_k"),
    ({"n": 0}, "n"), ({"n": 2, "temperature": 0}, "n"), ({"min_tokens": 5}, "min_tokens"),
], ids=["presence_penalty", "frequency_penalty", "repetition_penalty", "min_p", "top_k", "n_zero", "n_greedy",
        "min_tokens_above_max_tokens"])
def test_a_sampling_value_out_of_range_is_a_400_in_both_and_mmfront_names_it(
        pair: Pair, fields: dict[str, Any], param: str) -> None:
    """vLLM's words; vLLM's ``SamplingParams`` names no field for these, mmfront names it in
    ``param`` and at the message's end (docs/serving.md, "Differences")."""
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", chat(max_tokens=2, **fields))
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    want, got = error(vllm), error(mmfront)
    assert (got["type"], got["code"]) == (want["type"], want["code"]) == ("BadRequestError", 400), \
        explain(pair, vllm, mmfront)
    assert (want["param"], got["param"]) == (None, param), explain(pair, vllm, mmfront)
    assert got["message"].startswith(want["message"] + f" (parameter={param}"), explain(pair, vllm, mmfront)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", completion(max_tokens=2, suffix="x")),
], ids=["completion_suffix"])
def test_a_request_refused_in_other_words_is_a_400_in_both(pair: Pair, path: str, body: Any) -> None:
    vllm, mmfront = both(pair, "POST", path, body)
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    want, got = error(vllm), error(mmfront)
    assert (got["type"], got["code"]) == (want["type"], want["code"]) == ("BadRequestError", 400), \
        explain(pair, vllm, mmfront)


def test_more_top_logprobs_than_vllm_allows_is_refused_alike(pair: Pair) -> None:
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", chat(max_tokens=2, logprobs=True, top_logprobs=30))
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    assert masked(mmfront.json()) == masked(vllm.json()), explain(pair, vllm, mmfront)


def test_an_image_that_does_not_decode_is_a_400_in_both(pair: Pair) -> None:
    bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", {"model": SERVED, "messages": bad})
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    want, got = error(vllm), error(mmfront)
    assert (got["type"], got["code"]) == (want["type"], want["code"]) == ("BadRequestError", 400), \
        explain(pair, vllm, mmfront)
    assert got["param"] == "multi_modal_data", explain(pair, vllm, mmfront)


def test_more_images_than_the_limit_is_a_400_in_both(pair: Pair) -> None:
    five = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE}}] * 5}]
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", {"model": SERVED, "messages": five})
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    want, got = error(vllm), error(mmfront)
    assert (got["type"], got["code"]) == (want["type"], want["code"]) == ("BadRequestError", 400), \
        explain(pair, vllm, mmfront)
    assert got["param"] == want["param"] == "image", explain(pair, vllm, mmfront)


BODY, SAME_ERROR, KIND = "body", "error", "kind"
"""How :func:`assert_alike` compares two answers: the same 200 body (ids and times masked), the same
error (status, type, param, code and message) or the same kind of error (all but the message)."""


def assert_alike(pair: Pair, vllm: Answer, mmfront: Answer, compare: str) -> None:
    assert vllm.status == mmfront.status, explain(pair, vllm, mmfront)
    if compare == BODY:
        assert vllm.status == 200, explain(pair, vllm, mmfront)
        assert masked(mmfront.json()) == masked(vllm.json()), explain(pair, vllm, mmfront)
        return
    want, got = error(vllm), error(mmfront)
    assert (got["type"], got["param"], got["code"]) == (want["type"], want["param"], want["code"]), \
        explain(pair, vllm, mmfront)
    if compare == SAME_ERROR:
        assert got["message"] == want["message"], explain(pair, vllm, mmfront)
