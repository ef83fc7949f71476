"""The caller's view of the client, as vLLM's ``AsyncLLM`` gives it: a stream whose consumer goes
away aborts its request in the engine, a dead engine fails what waits on it and says so, and a
request too long for the engine is refused before it is sent."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from echo_link import EchoLinks
from test_engine_link import messages

from local_services import caller_id
from mmfront import MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.transports import PipeTransport
from mmfront.errors import EngineDeadError, ValidationError
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.wire import SamplingParams
from mmfront.wire.messages import ABORT, REQUEST, Direction, decode_message

STEPS = 100_000
"""Outputs the echo engine would send for each request: far more than a test waits for."""


@pytest.fixture
def echo(gemma3_dir: Path) -> Iterator[EchoLinks]:
    links = EchoLinks(gemma3_dir)
    yield links
    links.close()


def aborted(log: Path, timeout: float = 10.0) -> dict[str, int]:
    """What the echo engine aborted (the caller's request id -> outputs it had sent), once it has
    aborted any."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if log.exists() and log.read_text().endswith("\n"):
            return {caller_id(rid): int(sent) for rid, sent in (line.split() for line in log.read_text().splitlines())}
        time.sleep(0.02)
    return {}


@pytest.mark.parametrize("how", ["cancel", "aclose", "drop", "never_read"])
def test_a_consumer_that_goes_away_aborts_its_request_in_the_engine(echo: EchoLinks, tmp_path: Path, how: str) -> None:
    log = tmp_path / "aborts.log"
    client, _ = echo.start("--steps", str(STEPS), "--step-delay", "0.005", "--abort-log", str(log))

    async def main() -> int:
        stream = await client.add_request("r1", messages((0,), 1))
        got = 0
        if how == "cancel":
            async def consume() -> None:
                nonlocal got
                async for _ in stream:
                    got += 1

            task = asyncio.ensure_future(consume())
            while got < 3:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        elif how in ("aclose", "drop"):
            async for _ in stream:
                got += 1
                if got == 3:
                    break
            if how == "aclose":
                await stream.aclose()
            else:
                del stream
                gc.collect()
                await asyncio.sleep(0.1)  # the loop runs the dropped generator's finaliser
        else:
            await asyncio.sleep(0.2)
            del stream
            gc.collect()
        return got

    got = asyncio.run(main())
    stopped = aborted(log)
    assert list(stopped) == ["r1"]
    assert got <= stopped["r1"] < STEPS  # the engine stopped generating for it
    assert client.client.running == [] and client.client.in_flight == []
    time.sleep(0.2)
    assert aborted(log) == stopped  # aborted once


def test_leaving_the_blocking_clients_iterator_aborts_the_request(echo: EchoLinks, tmp_path: Path) -> None:
    log = tmp_path / "aborts.log"
    client, _ = echo.start("--steps", str(STEPS), "--step-delay", "0.005", "--abort-log", str(log), blocking=True)
    got = 0
    for _ in client.add_request("r1", messages((0,), 1)):
        got += 1
        if got == 3:
            break
    stopped = aborted(log)
    assert list(stopped) == ["r1"] and got <= stopped["r1"] < STEPS


def test_a_stream_read_to_its_end_is_not_aborted(echo: EchoLinks, tmp_path: Path) -> None:
    log = tmp_path / "aborts.log"
    client, _ = echo.start("--steps", "3", "--abort-log", str(log))

    async def main() -> int:
        stream = await client.add_request("r1", messages((0,), 1))
        count = len([output async for output in stream])
        del stream
        gc.collect()
        return count

    assert asyncio.run(main()) == 3
    assert aborted(log, timeout=0.5) == {}


def test_an_engine_that_dies_fails_what_waits_and_marks_the_client(echo: EchoLinks) -> None:
    client, proc = echo.start("--steps", str(STEPS), "--step-delay", "0.005", engine_timeout_s=1.0)

    async def main() -> None:
        stream = await client.add_request("r1", messages((0,), 1))
        await anext(stream)
        assert client.errored is False
        await client.check_health()
        proc.kill()
        proc.wait(10)
        started = time.monotonic()
        with pytest.raises(EngineDeadError, match=r"^Engine 0 sent nothing for 1 s \(no heartbeat\)"):
            async for _ in stream:
                pass
        assert time.monotonic() - started < 5
        assert client.errored is True
        with pytest.raises(EngineDeadError, match="sent nothing for 1 s"):
            await client.check_health()
        started = time.monotonic()
        with pytest.raises(EngineDeadError, match="sent nothing for 1 s"):
            await client.add_request("r2", messages((1,), 2))
        with pytest.raises(EngineDeadError, match="sent nothing for 1 s"):
            await client.is_sleeping()
        assert time.monotonic() - started < 0.5  # known dead: refused at once

    asyncio.run(main())


def test_a_request_that_cannot_fit_max_model_len_is_refused_before_it_is_sent(gemma3_dir: Path) -> None:
    chat = messages((0,), 1)
    measure = InputProcessor(InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processor_cache_gb=0)))
    prompt = len(measure.process_inputs("x", chat).prompt_token_ids or [])
    p0_end, p1_end = multiprocessing.Pipe()
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processor_cache_gb=0.02))
    client = AsyncEngineClient(InputProcessor(pre), PipeTransport(p0_end))

    async def main() -> None:
        client.max_model_len = prompt - 1
        with pytest.raises(ValidationError) as info:
            await client.add_request("r1", chat, SamplingParams(max_tokens=1))
        assert (info.value.parameter, info.value.value) == ("input_tokens", prompt)
        assert str(info.value) == (
            f"This model's maximum context length is {prompt - 1} tokens. However, your prompt contains {prompt} input "
            "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input "
            "prompt.")
        client.max_model_len = prompt  # no room for one output token: vLLM's server computes a budget of 0
        with pytest.raises(ValidationError) as info:
            await client.add_request("r1", chat)
        assert (info.value.parameter, info.value.value, str(info.value)) == (
            "max_tokens", 0, "max_tokens must be at least 1, got 0.")
        client.max_model_len = prompt + 5
        with pytest.raises(ValidationError) as info:
            await client.add_request("r1", chat, SamplingParams(max_tokens=prompt + 6))
        assert (info.value.parameter, info.value.value, str(info.value)) == (
            "max_tokens", prompt + 6, f"max_tokens={prompt + 6} cannot be greater than max_model_len={prompt + 5}. "
            "Please request fewer output tokens.")
        # A prompt and max_tokens that fit alone but not together: sent (the engine stops at the context)
        await client.add_request("r1", chat, SamplingParams(max_tokens=6))

    asyncio.run(main())
    engine = PipeTransport(p1_end)
    sent = []
    while (frames := engine.recv(1.0)) is not None:
        message = decode_message(frames, Direction.TO_ENGINE)
        sent.append((message.kind, message.body.request_id if message.kind == REQUEST else message.body[0]))
    # the refused ones never left; the one sent was aborted when its unread stream was dropped
    assert [(kind, caller_id(request_id)) for kind, request_id in sent] == [(REQUEST, "r1"), (ABORT, "r1")]
    assert sent[0][1] == sent[1][1]
    client.close_blocking()
