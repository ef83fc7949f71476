"""Utility calls (vLLM's UTILITY requests): their bytes on vLLM's sockets, their answers from an
engine process built on ``EngineCoreReceiver``, and the errors a caller sees."""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from echo_link import EchoLinks
from test_engine_link import Expected, messages
from test_frontends import _stop

from local_services import start_worker_command
from mmfront import MultiModalConfig
from mmfront.engine.async_client import FIRST_CALL_ID, AsyncEngineClient
from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.transports import PipeTransport
from mmfront.engine.transports.zmq import ZmqFrontendTransport
from mmfront.engine.transports.zmq_frames import envelope_from_request_frames, request_frames
from mmfront.errors import DecodeError, EngineDeadError, UnknownUtilityError, UtilityCallError
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python
from mmfront.wire import SamplingParams
from mmfront.wire.codec import MsgpackDecoder, MsgpackEncoder
from mmfront.wire.messages import (
    UTILITY,
    Direction,
    UtilityCall,
    decode_message,
    encode_envelope,
    utility_result,
    utility_value,
)
from mmfront.wire.structs import EngineCoreOutputs, FinishReason, UtilityOutput

ENC = MsgpackEncoder()
PEER = vllm_peer_python()
PEER_SCRIPT = Path(__file__).parent / "data" / "vllm_utility_peer.py"


@pytest.fixture
def echo(gemma3_dir: Path) -> Iterator[EchoLinks]:
    links = EchoLinks(gemma3_dir)
    yield links
    links.close()


# --- the wire ---------------------------------------------------------------------------------


def test_a_call_travels_as_vllms_utility_request_and_back() -> None:
    call = UtilityCall(7, "sleep", (1, "abort"))
    frames = request_frames(encode_envelope(UTILITY, ENC.encode(call)), call_ids=itertools.count(), client_index=2)
    assert [bytes(f) for f in frames] == [b"\x03", msgspec.msgpack.encode([2, 7, "sleep", [1, "abort"]]), b""]
    message = decode_message(envelope_from_request_frames(frames), Direction.TO_ENGINE)
    assert (message.kind, message.stamp, message.body) == (UTILITY, None, call)


def test_a_call_of_a_method_mmfront_engines_lack_is_refused_with_its_call_id() -> None:
    frames = [b"\x03", msgspec.msgpack.encode([0, 9, "collective_rpc", ["x"]]), b""]
    with pytest.raises(UnknownUtilityError, match=r"^Unknown utility call 'collective_rpc' with 1 arguments") as info:
        envelope_from_request_frames(frames)
    assert info.value.call_id == 9
    assert isinstance(info.value, DecodeError)


def test_results_travel_as_vllms_type_info_and_value() -> None:
    assert utility_result(("generate",)) == [None, ("generate",)]
    assert utility_value([None, ["generate"]]) == ["generate"]
    assert utility_value([None, None]) is None
    with pytest.raises(DecodeError, match="typed utility result"):
        utility_value([["vllm.lora.request", "LoRARequest"], {}])
    with pytest.raises(DecodeError, match=r"is \[type info, value\], got None"):
        utility_value(None)


@pytest.mark.slow
@pytest.mark.skipif(PEER is None, reason=SKIP_REASON)
def test_vllms_codec_reads_mmfronts_calls_and_answers_and_mmfront_reads_vllms() -> None:
    assert PEER is not None
    call = request_frames(encode_envelope(UTILITY, ENC.encode(UtilityCall(1 << 40, "wake_up", (["weights"],)))),
                          call_ids=itertools.count(), client_index=3)
    assert bytes(call[0]) == b"\x03"
    answer = ENC.encode(EngineCoreOutputs(utility_output=UtilityOutput(5, None, utility_result(("generate",)))))
    given = {"call": [bytes(f).hex() for f in call[1:-1]], "answer": [bytes(memoryview(f)).hex() for f in answer]}
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([str(PEER), str(PEER_SCRIPT)], input=json.dumps(given), capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["call"] == [3, 1 << 40, "wake_up", [["weights"]]]
    assert seen["answer"] == [5, None, ["generate"]]
    vllm_answer = MsgpackDecoder(EngineCoreOutputs).decode([bytes.fromhex(f) for f in seen["vllm_answer"]])
    assert vllm_answer.utility_output is not None
    assert (vllm_answer.utility_output.call_id, utility_value(vllm_answer.utility_output.result)) == (7, ["generate"])


# --- the engine side, in process ----------------------------------------------------------------


def test_the_receiver_answers_each_call_as_vllms_engine_does() -> None:
    p0_end, p1_end = multiprocessing.Pipe()
    p0, p1 = PipeTransport(p0_end), PipeTransport(p1_end)
    calls: list[tuple[Any, ...]] = []

    def sleep(level: int = 1, mode: str = "abort") -> None:
        calls.append(("sleep", level, mode))
        if mode == "nap":
            raise ValueError(f"Invalid pause mode: {mode}")

    receiver = EngineCoreReceiver(p1, utilities={"sleep": sleep, "get_supported_tasks": lambda: ("generate",)})
    decode = MsgpackDecoder(EngineCoreOutputs).decode
    for call in [UtilityCall(5, "get_supported_tasks"), UtilityCall(6, "sleep", (0, "keep")),
                 UtilityCall(7, "sleep", (1, "nap")), UtilityCall(8, "wake_up"), UtilityCall(9, "reset_mm_cache")]:
        p0.send(encode_envelope(UTILITY, ENC.encode(call)))
    assert receiver.poll(0.5) == []
    answers = []
    while (frames := p0.recv(0.5)) is not None:
        message = decode_message(frames, Direction.TO_FRONTEND)
        if message.body.__class__ is EngineCoreOutputs and message.body.utility_output is not None:
            answers.append(message.body.utility_output)
    assert answers == [
        UtilityOutput(5, None, [None, ["generate"]]),
        UtilityOutput(6, None, [None, None]),
        UtilityOutput(7, "Call to sleep method failed: Invalid pause mode: nap"),
        UtilityOutput(8, "Call to wake_up method failed: engine 0 has no method 'wake_up'"),
        UtilityOutput(9, None, [None, None]),  # the receiver's own, even without the engine's
    ]
    assert calls == [("sleep", 0, "keep"), ("sleep", 1, "nap")]
    assert decode(ENC.encode(EngineCoreOutputs(utility_output=answers[0]))).utility_output == answers[0]
    receiver.close()
    p0.close()


def test_a_call_pending_when_the_link_breaks_fails_with_engine_dead(gemma3_dir: Path) -> None:
    p0_end, p1_end = multiprocessing.Pipe()
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processor_cache_gb=0))
    client = AsyncEngineClient(InputProcessor(pre), PipeTransport(p0_end))

    async def main() -> None:
        call = asyncio.ensure_future(client.call_utility("is_sleeping"))
        await asyncio.sleep(0.2)
        sent = decode_message(PipeTransport(p1_end).recv(1) or [], Direction.TO_ENGINE)
        assert (sent.kind, sent.body) == (UTILITY, UtilityCall(FIRST_CALL_ID, "is_sleeping"))
        assert not call.done()
        threading.Timer(0.1, p1_end.close).start()
        started = time.monotonic()
        with pytest.raises(EngineDeadError, match=r"^The engine link broke"):
            await call
        assert time.monotonic() - started < 2
        assert client.errored
        with pytest.raises(EngineDeadError, match=r"^The engine link broke"):
            await client.check_health()
        started = time.monotonic()
        with pytest.raises(EngineDeadError, match=r"^The engine link broke"):
            await client.get_supported_tasks()
        assert time.monotonic() - started < 0.1

    asyncio.run(main())
    client.close_blocking()


# --- an engine process -----------------------------------------------------------------------


def test_every_named_call_against_an_engine_process(echo: EchoLinks) -> None:
    client, _ = echo.start()

    async def main() -> None:
        assert await client.get_supported_tasks() == ("generate",)
        assert await client.call_utility("get_supported_tasks") == ["generate"]  # plain msgpack, as vLLM's
        assert await client.is_sleeping() is False
        assert await client.sleep(1) is None
        assert await client.is_sleeping() is True
        assert await client.wake_up(["weights"]) is True
        assert await client.is_sleeping() is False
        assert await client.reset_prefix_cache() is True
        assert await client.reset_encoder_cache() is None
        assert await client.reset_mm_cache() is None
        assert await asyncio.gather(*(client.is_sleeping() for _ in range(20))) == [False] * 20
        with pytest.raises(UtilityCallError, match=r"^Call to sleep method failed: Invalid pause mode: nap$") as info:
            await client.sleep(1, "nap")
        assert info.value.method == "sleep"
        with pytest.raises(UtilityCallError, match=r"^DecodeError: Unknown utility call 'collective_rpc' with 1 "):
            await client.call_utility("collective_rpc", "x")

    asyncio.run(main())


def test_reset_mm_cache_clears_both_sides(echo: EchoLinks, gemma3_dir: Path) -> None:
    client, _ = echo.start()
    expected = Expected(gemma3_dir)
    stats = client.client.processor.preprocessor.stats

    async def answer(request_id: str) -> list[list[int]]:
        stream = await client.add_request(request_id, messages((0, 1), 1))
        return [output.new_token_ids async for output in stream]

    async def main() -> list[int]:
        hits = [stats.hits]
        for request_id in ("r1", "r2"):
            assert await answer(request_id) == [[expected((0, 1))]]
            hits.append(stats.hits)
        await client.reset_mm_cache()
        assert await answer("r3") == [[expected((0, 1))]]  # P1 was cleared too: this one had to carry its data
        hits.append(stats.hits)
        assert await answer("r4") == [[expected((0, 1))]]
        hits.append(stats.hits)
        return hits

    hits = asyncio.run(main())
    assert [b - a for a, b in itertools.pairwise(hits)] == [0, 2, 0, 2]
    assert client.stats.resends == 0


def test_the_blocking_client_calls_the_same(echo: EchoLinks) -> None:
    client, _ = echo.start(blocking=True)
    assert client.get_supported_tasks() == ("generate",)
    client.sleep(0)
    assert client.is_sleeping() is True
    assert client.wake_up() is True
    assert client.call_utility("is_sleeping") is False
    client.reset_mm_cache()
    assert client.reset_prefix_cache(True) is True
    with pytest.raises(UtilityCallError, match="Invalid pause mode: nap"):
        client.sleep(2, "nap")
    assert client.errored is False
    client.check_health()


@pytest.mark.slow
def test_mmfront_worker_answers_the_calls_with_vllms_meaning(gemma3_weights_dir: Path) -> None:
    config = MultiModalConfig(mm_processor_cache_gb=0.02)
    transport = ZmqFrontendTransport("ipc")
    worker = start_worker_command(gemma3_weights_dir, transport.addresses.input, transport.addresses.output,
                                  config.mm_processor_cache_gb)
    client = None
    try:
        transport.wait_for_engines([0], 120)
        client = AsyncEngineClient(InputProcessor(InputPreprocessor(gemma3_weights_dir, config)), transport,
                                   engine_timeout_s=120)

        async def main(client: AsyncEngineClient) -> None:
            assert await client.get_supported_tasks() == ("generate",)
            assert await client.is_sleeping() is False
            running = await client.add_request("running", messages((0,), 1),
                                               SamplingParams(max_tokens=100_000, ignore_eos=True, temperature=0.0))
            await anext(running)
            await client.sleep(1)  # mode "abort": what runs is aborted
            assert [o.finish_reason async for o in running][-1] == FinishReason.ABORT
            assert await client.is_sleeping() is True
            held = await client.add_request("held", messages((1,), 2), SamplingParams(max_tokens=2, ignore_eos=True, temperature=0.0))
            first = asyncio.ensure_future(anext(held))
            await asyncio.sleep(1.0)
            assert not first.done()  # taken, and held while the engine sleeps
            assert await client.wake_up(["scheduling"]) is False  # level 1: weights and KV cache still sleep
            assert await client.is_sleeping() is True
            assert await client.wake_up() is True
            assert len((await first).new_token_ids) == 1
            assert [o.finish_reason async for o in held] == [FinishReason.LENGTH]
            assert await client.reset_prefix_cache() is True
            assert await client.reset_encoder_cache() is None
            assert await client.reset_mm_cache() is None
            kept = await client.add_request("kept", messages((0,), 3),
                                            SamplingParams(max_tokens=100_000, ignore_eos=True, temperature=0.0))
            outputs: list[Any] = []

            async def consume() -> None:
                async for output in kept:
                    outputs.append(output)

            consumer = asyncio.ensure_future(consume())
            while not outputs:
                await asyncio.sleep(0.01)
            await client.sleep(0, "keep")  # level 0, "keep": the request stays, and waits
            await asyncio.sleep(0.3)  # the outputs of steps before the pause arrive
            before = len(outputs)
            await asyncio.sleep(1.0)
            assert len(outputs) == before and not consumer.done()  # no step while asleep, nothing aborted
            assert await client.is_sleeping() is True
            assert await client.wake_up(["scheduling"]) is True  # level 0: scheduling is all that slept
            while len(outputs) == before:
                await asyncio.sleep(0.01)
            await client.abort("kept")
            await consumer
            with pytest.raises(UtilityCallError, match=r"^Call to sleep method failed: sleep mode 'wait': mmfront "
                                                       r"worker sleeps with 'abort' or 'keep'\.$"):
                await client.sleep(0, "wait")
            assert await client.is_sleeping() is False

        asyncio.run(main(client))
    finally:
        if client is not None:
            client.close_blocking()
        _stop(worker)
        transport.close()
