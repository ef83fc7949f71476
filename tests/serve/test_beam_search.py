"""Beam search's scoring, selection and engine requests (mmfront.serve.beam_search), with exact
values (dyadic logprobs, so sums are exact) and a fake engine client; the answers against
``vllm serve`` are tests/serve/test_vllm_serve_beam_search.py."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mmfront.errors import GenerationError, ValidationError
from mmfront.inputs import MultiModalInputs
from mmfront.preprocess import RequestOptions
from mmfront.serve.beam_search import (
    Beam,
    BeamSearch,
    BeamSearchParams,
    answer,
    beam_score,
    beam_search_params,
    best_beams,
    end_of_sequence_ids,
    grow,
)
from mmfront.serve.output import Logprob, PositionLogprobs
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest
from mmfront.wire import SamplingParams
from mmfront.wire.structs import EngineCoreOutput, FinishReason, LogprobsLists, RequestError

EOS = 2


def position(**logprobs: float) -> PositionLogprobs:
    return {int(t.removeprefix("t")): Logprob(lp) for t, lp in logprobs.items()}


def test_the_score_divides_by_the_length_to_the_penalty() -> None:
    assert beam_score(4, -2.0, 1.0) == -0.5
    assert beam_score(2, -2.0, 2.0) == -0.5
    assert beam_score(4, -2.0, 0.0) == -2.0
    assert beam_score(0, -1.0, 2.0) == -1.0  # an aborted beam of no tokens counts one


def test_the_request_log_prints_vllms_repr() -> None:
    """``--enable-log-requests`` prints the parameters as vLLM prints its ``BeamSearchParams``
    (side by side: test_vllm_serve_beam_search.py)."""
    assert repr(BeamSearchParams(3, 4, temperature=0.5, allowed_token_ids=[7])) == (
        "BeamSearchParams(beam_width=3, max_tokens=4, ignore_eos=False, temperature=0.5, length_penalty=1.0, "
        "include_stop_str_in_output=False, structured_outputs=None, skip_special_tokens=True, watermarking=None, "
        "allowed_token_ids=[7])")


def test_a_step_keeps_the_best_extensions_and_sets_aside_finished_beams() -> None:
    params = BeamSearchParams(beam_width=2, max_tokens=4)
    a, b = Beam([5], [position(t5=-0.5)], -0.5), Beam([6], [position(t6=-1.0)], -1.0)
    step_a, step_b = position(t7=-0.25, t2=-0.125, t8=-2.0), position(t9=-0.0625, t10=-0.5)
    live, finished = grow([a, b], [step_a, step_b], params, {EOS})
    assert [(x.token_ids, x.cum_logprob) for x in live] == [([5, 7], -0.75), ([6, 9], -1.0625)]
    assert live[0].logprobs == [*a.logprobs, step_a] and live[1].logprobs == [*b.logprobs, step_b]
    [done] = finished
    assert (done.token_ids, done.cum_logprob, done.finish_reason, done.stop_reason) == ([5], -0.625, "stop", EOS)
    assert done.logprobs == [*a.logprobs, step_a]  # the EOS position counts for the score


def test_include_stop_str_in_output_keeps_the_eos_token_and_ignore_eos_extends_it() -> None:
    a = Beam([5], [position(t5=-0.5)], -0.5)
    step = position(t7=-0.25, t2=-0.125)
    _, [done] = grow([a], [step], BeamSearchParams(2, 4, include_stop_str_in_output=True), {EOS})
    assert done.token_ids == [5, EOS]
    live, finished = grow([a], [step], BeamSearchParams(2, 4, ignore_eos=True), {EOS})
    assert finished == [] and [(x.token_ids, x.cum_logprob) for x in live] == [([5, EOS], -0.625), ([5, 7], -0.75)]


def test_ties_keep_the_candidates_order() -> None:
    live, _ = grow([Beam()], [position(t1=-1.0, t3=-1.0, t4=-1.0)], BeamSearchParams(2, 4), {EOS})
    assert [x.token_ids for x in live] == [[1], [3]]


def test_the_length_penalty_ranks_the_answers() -> None:
    short, long = Beam([5], [{}], -1.0), Beam([5, 6, 7, 8], [{}, {}, {}, {}], -2.0)
    assert best_beams([short, long], BeamSearchParams(1, 4, length_penalty=1.0)) == [long]  # -0.5 over -1.0
    assert best_beams([short, long], BeamSearchParams(1, 4, length_penalty=0.0)) == [short]  # -1.0 over -2.0


@dataclass
class JoinTokenizer:
    eos_token_id: int = EOS

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        return "|".join(str(t) for t in token_ids if not (skip_special_tokens and t == EOS))


def test_an_answer_hides_a_final_eos_from_its_text_only() -> None:
    beam = Beam([5, EOS], [{}, {}], -1.0, "stop", EOS)
    whole = answer(beam, BeamSearchParams(2, 4, include_stop_str_in_output=True, skip_special_tokens=False), {EOS},
                   JoinTokenizer())
    assert (whole.text, whole.token_ids, whole.finish_reason, whole.stop_reason) == ("5", [5, EOS], "stop", EOS)
    whole = answer(Beam([5, EOS], [{}, {}], -1.0), BeamSearchParams(2, 4, ignore_eos=True, skip_special_tokens=False),
                   {EOS}, JoinTokenizer())
    assert (whole.text, whole.finish_reason) == ("5|2", "length")


def test_the_end_of_sequence_is_the_tokenizers_and_the_generation_configs() -> None:
    assert end_of_sequence_ids({"eos_token_id": [106, 1]}, 1) == {1, 106}
    assert end_of_sequence_ids({}, None) == frozenset()


def test_the_request_fields_become_the_search_parameters() -> None:
    chat = ChatCompletionRequest(messages=[], use_beam_search=True, n=3, length_penalty=0.5, ignore_eos=True)
    assert beam_search_params(chat, 7) == BeamSearchParams(3, 7, ignore_eos=True, temperature=1.0, length_penalty=0.5)
    assert BeamSearchParams(3, 7).step_params().logprobs == 6
    completion = CompletionRequest(prompt="x", use_beam_search=True, temperature=0.0, skip_special_tokens=False)
    assert beam_search_params(completion, 2) == BeamSearchParams(1, 2, temperature=0.0, skip_special_tokens=False)
    with pytest.raises(ValidationError, match=r"^beam_width must be at least 1, got 0\.$") as caught:
        beam_search_params(ChatCompletionRequest(messages=[], n=0), 2)
    assert caught.value.parameter is None
    with pytest.raises(ValidationError, match="beam_width must be at most 16384, got 16385"):
        beam_search_params(ChatCompletionRequest(messages=[], n=16385), 2)


# --- the search over an engine client ---------------------------------------------------------------


def table(last: int) -> tuple[list[int], list[float]]:
    """The fake engine's row after ``last``: the sampled token, then the top four, as vLLM's runner
    lays it out (the sampled token again first among them)."""
    return [last + 1, last + 1, last + 2, EOS, last + 3], [-0.25, -0.25, -0.5, -1.0, -2.0]


def step_output(request_id: str, prompt: list[int]) -> EngineCoreOutput:
    """The fake engine's answer to a step: one token, its candidates (``table``), finished."""
    ids, lps = table(prompt[-1])
    return EngineCoreOutput(request_id, [ids[0]], LogprobsLists(
        np.array([ids]), np.array([lps], dtype=np.float32), np.array([1])), finish_reason=FinishReason.LENGTH)


@dataclass
class FakeClient:
    """An engine client that answers each request with one token and its candidates (``table``);
    ``hold_after``: requests of longer prompts never answer (a slow engine)."""

    hold_after: int | None = None
    error_on: int | None = None
    sent: list[tuple[str, list[int], SamplingParams]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    started: asyncio.Event = field(default_factory=asyncio.Event)

    async def add_request(self, request_id: str, inputs: MultiModalInputs, params: SamplingParams, *,
                          options: RequestOptions | None = None) -> AsyncIterator[EngineCoreOutput]:
        prompt = list(inputs["prompt_token_ids"])
        self.sent.append((request_id, prompt, params))
        return self._stream(request_id, prompt)

    async def _stream(self, request_id: str, prompt: list[int]) -> AsyncIterator[EngineCoreOutput]:
        try:
            if self.hold_after is not None and len(prompt) > self.hold_after:
                self.started.set()
                await asyncio.Event().wait()
            if prompt[-1] == self.error_on:
                yield EngineCoreOutput(request_id, [], finish_reason=FinishReason.ERROR,
                                       error=RequestError("EngineError", "the step failed"))
                return
            yield step_output(request_id, prompt)
        finally:
            self.closed.append(request_id)


def search(client: FakeClient | ScheduledClient, width: int = 2, max_tokens: int = 2, **fields: Any) -> Any:
    inputs = MultiModalInputs(type="multimodal", prompt_token_ids=[10], mm_kwargs={}, mm_hashes={},  # type: ignore[typeddict-item]
                              mm_placeholders={})
    runner = BeamSearch(client, JoinTokenizer(), frozenset({EOS}))  # type: ignore[arg-type]
    return runner.run("cmpl-1", inputs, RequestOptions(), BeamSearchParams(width, max_tokens, **fields))


def test_each_step_asks_one_token_per_beam_and_the_best_beams_answer() -> None:
    client = FakeClient()
    found = asyncio.run(search(client))
    # step 1 from [10]: 11 (-0.25), 12 (-0.5), EOS (-1.0: finished, empty); step 2 from [11] and [12]:
    # [11, 12] -0.5, [11, 13] -0.75 (ties [12, 13], listed later), EOS after [11] -1.25, after [12] -1.5
    assert [(w.text, w.token_ids, w.finish_reason) for w in found] == [("11|12", [11, 12], "length"),
                                                                      ("11|13", [11, 13], "length")]
    assert [prompt for _, prompt, _ in client.sent] == [[10], [10, 11], [10, 12]]
    assert all(p.max_tokens == 1 and p.logprobs == 4 and p.temperature == 1.0 and not p.detokenize
               for _, _, p in client.sent)
    first, second, third = (request_id for request_id, _, _ in client.sent)
    assert first.startswith("cmpl-1-") and first.endswith("-beam-0")
    assert second.endswith("-beam-0") and third == second.removesuffix("0") + "1"
    assert sorted(client.closed) == sorted(r for r, _, _ in client.sent)
    assert [lp[12].logprob for lp in (found[0].logprobs[1],)] == [-0.25]


def test_a_finished_beam_answers_when_it_ranks_best() -> None:
    """A negative length penalty favours short beams: the EOS of the first step (-1.0 over one
    token) beats [11, 12] (-0.5 * 2 ** 4) and the EOS after [11] (-1.25 * 2 ** 4)."""
    found = asyncio.run(search(FakeClient(), length_penalty=-4.0))
    assert [(w.text, w.token_ids, w.finish_reason, w.stop_reason) for w in found] == [
        ("", [], "stop", EOS), ("11|12", [11, 12], "length", None)]
    found = asyncio.run(search(FakeClient(), length_penalty=-4.0, include_stop_str_in_output=True))
    assert (found[0].text, found[0].token_ids) == ("", [EOS])
    assert len(found[0].logprobs) == 1 and found[0].logprobs[0][EOS].logprob == -1.0


def test_no_steps_answer_one_empty_beam() -> None:
    client = FakeClient()
    found = asyncio.run(search(client, width=3, max_tokens=0))
    assert [(w.text, w.token_ids, w.finish_reason) for w in found] == [("", [], "length")]
    assert client.sent == []


def test_a_failed_step_fails_the_search_and_aborts_its_other_beams() -> None:
    client = FakeClient(error_on=12)
    with pytest.raises(GenerationError):
        asyncio.run(search(client, max_tokens=3))
    assert sorted(client.closed) == sorted(r for r, _, _ in client.sent)


def test_a_search_given_up_closes_every_step_request() -> None:
    """The client left mid-search: each open step request is closed (the engine client aborts
    a request whose stream closes before its end), none is left running."""
    async def leave() -> FakeClient:
        client = FakeClient(hold_after=1)
        task = asyncio.ensure_future(search(client, width=4, max_tokens=50))
        await client.started.wait()
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return client

    client = asyncio.run(leave())
    assert len(client.sent) == 1 + 3  # the first step, then the second of the three beams it left
    assert sorted(client.closed) == sorted(r for r, _, _ in client.sent)


@dataclass
class ScheduledClient:
    """An engine client that keeps :class:`~mmfront.engine.async_client.AsyncEngineClient`'s
    promises with each wait ``delays`` loop turns long: ``add_request`` prepares (cancelled then,
    nothing is sent), sends, then waits for the commit lane (cancelled then, what was sent is
    aborted: the abort queued behind the send); a stream answers after a wait, and closed before
    its answer it aborts. ``ended``: each sent request's end; ``left``: the search was cancelled."""

    delays: Iterator[int]
    sent: list[str] = field(default_factory=list)
    ended: dict[str, str] = field(default_factory=dict)
    added_after_leaving: list[str] = field(default_factory=list)
    left: bool = False

    async def wait(self) -> None:
        for _ in range(next(self.delays, 0)):
            await asyncio.sleep(0)

    async def add_request(self, request_id: str, inputs: MultiModalInputs, params: SamplingParams, *,
                          options: RequestOptions | None = None) -> ScheduledStream:
        if self.left:
            self.added_after_leaving.append(request_id)
        await self.wait()
        self.sent.append(request_id)
        try:
            await self.wait()
        except asyncio.CancelledError:
            self.ended[request_id] = "aborted"
            raise
        return ScheduledStream(self, request_id, list(inputs["prompt_token_ids"]))


@dataclass
class ScheduledStream:
    client: ScheduledClient
    request_id: str
    prompt: list[int]

    def __aiter__(self) -> ScheduledStream:
        return self

    async def __anext__(self) -> EngineCoreOutput:
        if self.request_id in self.client.ended:
            raise StopAsyncIteration
        await self.client.wait()
        self.client.ended[self.request_id] = "answered"
        return step_output(self.request_id, self.prompt)

    async def aclose(self) -> None:
        self.client.ended.setdefault(self.request_id, "aborted")


@settings(max_examples=300, deadline=None)
@given(delays=st.lists(st.integers(0, 3), max_size=300), leave_after=st.integers(0, 80), width=st.integers(1, 4))
@example(delays=[0, 2], leave_after=2, width=1)  # left mid-send: the first step is sent, the lane not back
@example(delays=[0, 0, 2], leave_after=3, width=1)  # left as the first step's answer is on its way
@example(delays=[0, 0, 0] + [0, 0, 1] * 4, leave_after=5, width=4)  # the second step's three beams sent, unanswered
def test_a_client_that_leaves_at_any_turn_leaves_no_step_request_running(
        delays: list[int], leave_after: int, width: int) -> None:
    """Whatever each step request is doing when its search is given up (preparing, being sent,
    sent and waiting for the lane, answered, its answer on its way), no step request is made
    after, and every one sent ends: answered, or aborted (its stream closed, or its send
    cancelled)."""
    async def leave() -> ScheduledClient:
        client = ScheduledClient(iter(delays))
        task = asyncio.ensure_future(search(client, width=width, max_tokens=30))
        for _ in range(leave_after):
            await asyncio.sleep(0)
        client.left = True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await asyncio.gather(*asyncio.all_tasks() - {asyncio.current_task()}, return_exceptions=True)
        return client

    client = asyncio.run(leave())
    assert client.added_after_leaving == []
    assert sorted(client.ended) == sorted(client.sent), sorted(set(client.sent) - set(client.ended))
