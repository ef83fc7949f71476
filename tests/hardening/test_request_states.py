"""No request state a race can strand (issue 22, class 7), on both sides of the link.

Client: a reply for a request id that is still being prepared, a cancelled ``add_request_async``
waiting for the commit lane, a stream closed early whose id is reused at once. Receiver: an abort
followed at once by a request of the same id, two frontends sending the same id. Then a
hypothesis state machine over interleavings of add / cancel / abort / admit / output / stale reply
/ reuse checks that every request ends exactly once and no state is left behind.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mmfront import MultiModalConfig
from mmfront.engine.async_client import AsyncEngineClient
from mmfront.engine.client import EngineClient, RequestAdmitted, RequestFailed, RequestOutput
from mmfront.engine.receiver import EngineCoreReceiver
from mmfront.engine.transports import BaseTransport
from mmfront.errors import ValidationError
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.wire import SamplingParams
from mmfront.wire.codec import MsgpackDecoder, MsgpackEncoder
from mmfront.wire.messages import (
    ABORT,
    ADMITTED,
    ENGINE_OUTPUTS,
    REQUEST,
    Admitted,
    Direction,
    decode_message,
    encode_envelope,
)
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest, FinishReason
from toy_models import toy

ENC = MsgpackEncoder()
OUTPUTS = MsgpackDecoder(EngineCoreOutputs)


class Wire(BaseTransport):
    """Records what is sent; hands out what a test queues."""

    def __init__(self) -> None:
        self.sent: list[list[Any]] = []
        self.inbox: deque[list[Any]] = deque()

    def send(self, frames: Sequence[Any]) -> None:
        self.sent.append(list(frames))

    def recv(self, timeout: float | None = None) -> list[Any] | None:
        if self.inbox:
            return self.inbox.popleft()
        time.sleep(min(timeout or 0.0, 0.01))
        return None

    def close(self) -> None:
        pass

    def requests(self) -> list[str]:
        return [decode_message(f, Direction.TO_ENGINE).body.request_id for f in self.sent if bytes(f[0]) == REQUEST]


def toy_processor() -> InputProcessor:
    config = MultiModalConfig(mm_processor_cache_gb=0)
    return InputProcessor(InputPreprocessor("toy", config, processor=toy(config)))


def admitted(request_id: str) -> list[Any]:
    return encode_envelope(ADMITTED, ENC.encode(Admitted(request_id)))


def output(request_id: str, tokens: list[int], finished: bool = True, engine_index: int = 0) -> list[Any]:
    out = EngineCoreOutput(request_id, tokens, finish_reason=FinishReason.LENGTH if finished else None)
    return encode_envelope(ENGINE_OUTPUTS, ENC.encode(EngineCoreOutputs(engine_index=engine_index, outputs=[out])))


# --- the client ---------------------------------------------------------------------------------


def hold_preparation(client: EngineClient) -> tuple[threading.Event, threading.Event]:
    """Make ``client``'s preparations wait: the first event is set when one starts, and it goes
    on once the second is set."""
    preparing, go = threading.Event(), threading.Event()
    prepare = client.processor.prepare

    def slow_prepare(*args: Any, **kwargs: Any) -> Any:
        preparing.set()
        go.wait(10)
        return prepare(*args, **kwargs)

    client.processor.prepare = slow_prepare  # type: ignore[method-assign]
    return preparing, go


def test_an_admitted_for_a_request_still_being_prepared_does_not_drop_it() -> None:
    wire = Wire()
    client = EngineClient(toy_processor(), wire, stream_outputs=True)
    preparing, go = hold_preparation(client)
    adding = threading.Thread(target=client.add_request, args=("x", [1, 2, 3], SamplingParams(max_tokens=1)))
    adding.start()
    assert preparing.wait(10)
    assert client.handle_reply(admitted("x")) == []  # a reply to an earlier request of that id
    go.set()
    adding.join(10)
    assert wire.requests() == ["x"]  # it was sent all the same
    client.handle_reply(admitted("x"))
    [event] = client.handle_reply(output("x", [5]))
    assert isinstance(event, RequestOutput) and event.output.new_token_ids == [5]
    assert client.in_flight == [] and client.running == []


def test_a_cancelled_add_request_waiting_for_the_lane_frees_its_id() -> None:
    wire = Wire()
    client = EngineClient(toy_processor(), wire, stream_outputs=True)

    async def main() -> None:
        with client._lane:  # the lane is busy: the send waits
            task = asyncio.ensure_future(client.add_request_async("y", [1, 2, 3], SamplingParams(max_tokens=1)))
            for _ in range(200):
                await asyncio.sleep(0.01)
                if client.in_flight:
                    break
            await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        for _ in range(200):  # the lane drains: the id is free again (and nothing of it stays in the engine)
            if not client.in_flight and not client.running:
                break
            await asyncio.sleep(0.01)
        await client.add_request_async("y", [1, 2, 3], SamplingParams(max_tokens=1))

    asyncio.run(asyncio.wait_for(main(), 20))
    sent = [(bytes(f[0]), decode_message(f, Direction.TO_ENGINE).body) for f in wire.sent]
    # either the cancelled one never left, or it left and was aborted before the new one
    kinds = [kind for kind, _ in sent]
    assert kinds in ([REQUEST], [REQUEST, ABORT, REQUEST])


def test_a_processed_prompt_is_checked_in_the_lane_job_that_sends_it_and_a_token_prompt_on_the_pool() -> None:
    wire = Wire()
    client = EngineClient(toy_processor(), wire, stream_outputs=True)
    threads: list[str] = []
    prepare = client.processor.prepare

    def recording_prepare(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return prepare(*args, **kwargs)

    client.processor.prepare = recording_prepare  # type: ignore[method-assign]
    processed = client.processor.preprocessor.preprocess([1, 2, 3], request_id="p")
    asyncio.run(client.add_request_async("p", processed, SamplingParams(max_tokens=1)))
    asyncio.run(client.add_request_async("t", [1, 2, 3], SamplingParams(max_tokens=1)))
    assert [name.rsplit("_", 1)[0] for name in threads] == ["mmfront-commit-lane", "mmfront-prepare"]
    assert wire.requests() == ["p", "t"]


def test_a_processed_prompt_that_fails_its_checks_in_the_lane_frees_its_id_and_sends_nothing() -> None:
    wire = Wire()
    client = EngineClient(toy_processor(), wire, stream_outputs=True)
    processed = client.processor.preprocessor.preprocess([1, 2, 3], request_id="bad")
    bad = {**processed, "prompt_token_ids": [1, 1_000_000]}
    with pytest.raises(ValidationError) as caught:
        asyncio.run(client.add_request_async("bad", bad, SamplingParams(max_tokens=1)))
    assert str(caught.value) == "Token id 1000000 is out of vocabulary (vocabulary size 528)."
    assert wire.sent == [] and client.in_flight == [] and client.rank_of("bad") is None
    assert [rank.outstanding for rank in client.ranks] == [0]
    asyncio.run(client.add_request_async("bad", processed, SamplingParams(max_tokens=1)))  # the id is free again
    assert wire.requests() == ["bad"] and client.in_flight == ["bad"]


def test_a_processed_prompt_cancelled_before_its_lane_job_starts_is_never_sent_and_frees_its_id() -> None:
    wire = Wire()
    client = EngineClient(toy_processor(), wire, stream_outputs=True)
    processed = client.processor.preprocessor.preprocess([1, 2, 3], request_id="q")
    busy = threading.Event()
    client._lane_executor.submit(busy.wait, 10)  # the lane is busy: the job waits in its queue

    async def main() -> None:
        task = asyncio.ensure_future(client.add_request_async("q", processed, SamplingParams(max_tokens=1)))
        await asyncio.sleep(0.05)
        assert client.in_flight == ["q"]  # reserved
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(main(), 20))
    busy.set()
    client._lane_executor.submit(lambda: None).result(10)  # the lane drained
    assert wire.sent == [] and client.in_flight == [] and client.rank_of("q") is None
    assert [rank.outstanding for rank in client.ranks] == [0]


def test_a_processed_prompt_cancelled_while_its_lane_job_prepares_it_is_sent_then_aborted() -> None:
    wire = Wire()
    client = EngineClient(toy_processor(), wire, stream_outputs=True)
    processed = client.processor.preprocessor.preprocess([1, 2, 3], request_id="r")
    preparing, go = hold_preparation(client)

    async def main() -> None:
        task = asyncio.ensure_future(client.add_request_async("r", processed, SamplingParams(max_tokens=1)))
        while not preparing.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(main(), 20))
    go.set()
    client._lane_executor.submit(lambda: None).result(10)  # the lane drained: the send, then the abort
    sent = [(bytes(f[0]), decode_message(f, Direction.TO_ENGINE).body) for f in wire.sent]
    assert [kind for kind, _ in sent] == [REQUEST, ABORT]
    assert sent[0][1].request_id == "r" and sent[0][1].prompt_token_ids == [1, 2, 3] and sent[1][1] == ["r"]
    assert client.in_flight == [] and client.running == [] and client.rank_of("r") is None

class StreamingEngine:
    """An mmfront engine over a pipe that streams one token per step, the token being the number
    of requests it had admitted when it admitted this one (so each incarnation has its own)."""

    def __init__(self) -> None:
        import multiprocessing

        from mmfront.engine.transports import PipeTransport

        a, b = multiprocessing.Pipe()
        self.p0 = PipeTransport(a)
        self._engine = PipeTransport(b)
        self.aborted: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        admitted = 0
        running: dict[str, int] = {}
        with EngineCoreReceiver(self._engine, None) as receiver:
            while not self._stop.is_set():
                for request in receiver.poll(0.01):
                    admitted += 1
                    running[request.request_id] = admitted
                for request_id in receiver.take_aborted():
                    running.pop(request_id, None)
                    self.aborted.append(request_id)
                if running:
                    receiver.send([EngineCoreOutput(r, [n]) for r, n in running.items()])
                    time.sleep(0.01)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _second_gets_its_own_tokens_and_both_stop(client: AsyncEngineClient, engine: StreamingEngine,
                                              main: Callable[[], Awaitable[list[int]]]) -> None:
    """``main`` reads 20 tokens of the id's second request: they must be its own, and the engine
    must have stopped both incarnations of the id."""
    try:
        assert asyncio.run(asyncio.wait_for(main(), 20)) == [2] * 20
        deadline = time.monotonic() + 5
        while len(engine.aborted) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(engine.aborted) == 2 and len(set(engine.aborted)) == 2  # both incarnations stopped
    finally:
        client.close_blocking()
        engine.close()


def test_a_stream_closed_early_and_its_id_reused_gets_only_the_new_requests_outputs() -> None:
    engine = StreamingEngine()
    client = AsyncEngineClient(toy_processor(), engine.p0)

    async def main() -> list[int]:
        first = await client.add_request("r", [1, 2, 3], SamplingParams(max_tokens=100))
        assert (await anext(first)).new_token_ids == [1]
        await first.aclose()
        second = await client.add_request("r", [1, 2, 3], SamplingParams(max_tokens=100))
        got: list[int] = []
        for _ in range(20):
            got += (await anext(second)).new_token_ids
        await second.aclose()
        return got

    _second_gets_its_own_tokens_and_both_stop(client, engine, main)


def test_a_stream_dropped_before_its_first_read_frees_its_id_at_once() -> None:
    """A consumer that goes away before it reads (a client disconnecting at once) drops a stream
    whose generator never ran; its id is free as soon as it is dropped, not when the reader thread
    has aborted it (found by the soak's cancel storms)."""
    engine = StreamingEngine()
    client = AsyncEngineClient(toy_processor(), engine.p0)
    abort_abandoned = client._abort_abandoned
    client._abort_abandoned = lambda: None  # type: ignore[method-assign]  # the reader thread is slow to abort

    async def main() -> list[int]:
        first = await client.add_request("r", [1, 2, 3], SamplingParams(max_tokens=100))
        del first  # never read: its generator never ran, only its finalizer can tell the client
        gc.collect()
        second = await client.add_request("r", [1, 2, 3], SamplingParams(max_tokens=100))
        client._abort_abandoned = abort_abandoned  # type: ignore[method-assign]
        got: list[int] = []
        for _ in range(20):
            got += (await anext(second)).new_token_ids
        await second.aclose()
        return got

    _second_gets_its_own_tokens_and_both_stop(client, engine, main)


# --- the receiver --------------------------------------------------------------------------------


def request(request_id: str) -> EngineCoreRequest:
    return EngineCoreRequest(request_id, [1, 2, 3], None, SamplingParams(max_tokens=1), None, 0.0, None, None, None)


def test_an_abort_then_a_request_of_the_same_id_reaches_the_engine_in_that_order() -> None:
    wire = Wire()
    receiver = EngineCoreReceiver(wire, None)
    wire.inbox.append(encode_envelope(REQUEST, ENC.encode(request("z"))))
    assert [r.request_id for r in receiver.poll()] == ["z"]
    wire.inbox.extend([encode_envelope(ABORT, ENC.encode(["z"])), encode_envelope(REQUEST, ENC.encode(request("z")))])
    assert receiver.poll() == []  # the new one waits for the engine to take the abort
    assert receiver.take_aborted() == ["z"]
    assert [r.request_id for r in receiver.poll()] == ["z"]
    assert receiver.take_aborted() == []
    receiver.close()


def test_two_frontends_sending_one_id_the_second_gets_a_typed_refusal() -> None:
    first, second = Wire(), Wire()
    receiver = EngineCoreReceiver(first, None)
    receiver.add_frontend(second, None)
    client = EngineClient(toy_processor(), second, stream_outputs=True)
    first.inbox.append(encode_envelope(REQUEST, ENC.encode(request("same"))))
    assert [r.request_id for r in receiver.poll()] == ["same"]
    client.add_request("same", [1, 2, 3], SamplingParams(max_tokens=1))
    second.inbox.append(second.sent.pop())
    assert receiver.poll() == []
    [refusal] = [f for f in second.sent if bytes(f[0]) == ENGINE_OUTPUTS
                 and OUTPUTS.decode(f[2:]).outputs]
    [event] = client.handle_reply(refusal)
    assert isinstance(event, RequestFailed) and isinstance(event.error, ValidationError)
    assert event.error.parameter == "request_id" and "'same' is already running on engine 0" in str(event.error)
    assert client.in_flight == [] and client.running == []
    receiver.close()


def test_a_frontend_repeating_a_running_id_is_refused_each_time_and_logged_sparingly(
        caplog: pytest.LogCaptureFixture) -> None:
    """A rogue frontend sending one running id over and over (the soak's floods) gets a refusal
    naming it each time; the engine's log gets ten lines, not one per refusal."""
    first, second = Wire(), Wire()
    receiver = EngineCoreReceiver(first, None, heartbeat_s=60)
    receiver.add_frontend(second, None)
    first.inbox.append(encode_envelope(REQUEST, ENC.encode(request("same"))))
    assert [r.request_id for r in receiver.poll()] == ["same"]
    second.inbox.extend(encode_envelope(REQUEST, ENC.encode(request("same"))) for _ in range(500))
    with caplog.at_level(logging.WARNING, logger="mmfront.engine.receiver"):
        while second.inbox:
            assert receiver.poll() == []
    refusals = [f for f in second.sent if bytes(f[0]) == ENGINE_OUTPUTS and OUTPUTS.decode(f[2:]).outputs]
    assert len(refusals) == 500 and receiver.requests_refused == 500
    assert len([r for r in caplog.records if "refused request" in r.getMessage()]) == 10
    receiver.close()


# --- every interleaving --------------------------------------------------------------------------


class RequestLifecycles(RuleBasedStateMachine):
    """The client side of many requests under any order of events. The model: each caller id has
    at most one live incarnation (an engine id, as ``engine_request_id`` makes); the engine may admit it,
    stream outputs, finish it, or send replies for incarnations that are gone."""

    def __init__(self) -> None:
        super().__init__()
        self.wire = Wire()
        self.client = EngineClient(toy_processor(), self.wire, stream_outputs=True)
        self.live: dict[str, str] = {}  # caller id -> engine id
        self.admitted: set[str] = set()
        self.gone: list[str] = []  # engine ids that ended (finished, aborted, failed)
        self.ended: dict[str, int] = {}  # engine id -> how many terminal events it had
        self.count = 0

    def _apply(self, events: list[Any]) -> None:
        for event in events:
            engine_id = event.request_id
            assert engine_id not in self.gone, f"an event for {engine_id}, which had ended"
            if isinstance(event, RequestAdmitted):
                continue
            terminal = isinstance(event, RequestFailed) or event.output.finish_reason is not None
            if terminal:
                self.ended[engine_id] = self.ended.get(engine_id, 0) + 1
                self._forget(engine_id)

    def _forget(self, engine_id: str) -> None:
        caller = next(c for c, e in self.live.items() if e == engine_id)
        del self.live[caller]
        self.admitted.discard(engine_id)
        self.gone.append(engine_id)

    @rule(caller=st.sampled_from("abc"))
    def add(self, caller: str) -> None:
        if caller in self.live:
            return
        self.count += 1
        engine_id = f"{caller}-{self.count:08x}"  # as engine_request_id makes them, deterministic here
        self.client.add_request(engine_id, [1, 2, 3], SamplingParams(max_tokens=4))
        self.live[caller] = engine_id

    @precondition(lambda self: bool(self.live))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        caller = data.draw(st.sampled_from(sorted(self.live)))
        engine_id = self.live[caller]
        self.client.abort_request(engine_id)
        self._forget(engine_id)

    @precondition(lambda self: any(e not in self.admitted for e in self.live.values()))
    @rule(data=st.data())
    def admit(self, data: st.DataObject) -> None:
        engine_id = data.draw(st.sampled_from(sorted(e for e in self.live.values() if e not in self.admitted)))
        self._apply(self.client.handle_reply(admitted(engine_id)))
        self.admitted.add(engine_id)

    @precondition(lambda self: bool(self.admitted))
    @rule(data=st.data(), finished=st.booleans())
    def step(self, data: st.DataObject, finished: bool) -> None:
        engine_id = data.draw(st.sampled_from(sorted(self.admitted)))
        self._apply(self.client.handle_reply(output(engine_id, [7], finished)))

    @precondition(lambda self: bool(self.gone))
    @rule(data=st.data(), kind=st.sampled_from(["admitted", "output", "finished"]))
    def stale_reply(self, data: st.DataObject, kind: str) -> None:
        engine_id = data.draw(st.sampled_from(self.gone))
        frames = admitted(engine_id) if kind == "admitted" else output(engine_id, [9], kind == "finished")
        assert self.client.handle_reply(frames) == []

    @invariant()
    def tracked_is_live(self) -> None:
        tracked = {*self.client.in_flight, *self.client.running}
        assert tracked == set(self.live.values())
        assert sum(rank.outstanding for rank in self.client.ranks) == len(self.live)
        assert all(count == 1 for count in self.ended.values())


TestRequestLifecycles = RequestLifecycles.TestCase
TestRequestLifecycles.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
