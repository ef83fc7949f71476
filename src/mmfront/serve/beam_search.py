"""Beam search (``use_beam_search``) as vLLM 0.33's API server runs it: the engine knows nothing
of beams, so the server grows ``n`` of them a token at a time. Each step sends every live beam
to the engine as a request of its own for one token with ``2 * n`` logprobs (the prompt and the
beam's tokens as its prompt, the request's media as they were prepared), scores each candidate
by the beam's cumulative logprob plus the candidate's, keeps the ``n`` best, and sets aside a
beam that reached an end-of-sequence token as finished. After ``max_tokens`` steps the finished
and the live beams are ranked by their length-normalised score, and the best ``n`` answer.

Sending each step through :class:`~mmfront.engine.async_client.AsyncEngineClient` with the
request's prepared inputs commits them to the processor cache like any request: an image's
data goes to the engine once, later steps name it by its hash (and a step that finds it evicted
sends it again). A search given up (its client left) cancels its step requests, and the client
aborts each in the engine.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmfront.engine.async_client import AsyncEngineClient
from mmfront.errors import ValidationError
from mmfront.inputs import MultiModalInputs
from mmfront.preprocess import RequestOptions
from mmfront.serve.errors import engine_error
from mmfront.serve.iteration_stats import StatsRecorder
from mmfront.serve.output import PositionLogprobs, WholeOutput, position_logprobs
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest
from mmfront.wire import SamplingParams
from mmfront.wire.params import max_n_sequences
from mmfront.wire.structs import EngineCoreOutput, FinishReason


@dataclass(frozen=True)
class BeamSearchParams:
    """What a beam search reads from its request (vLLM's ``BeamSearchParams``)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 1.0
    length_penalty: float = 1.0
    """Exponent of the generated length (an end-of-sequence token counted) that divides a
    beam's cumulative logprob when beams are ranked: above 0 favours longer beams."""
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    watermarking: bool | None = None
    allowed_token_ids: list[int] | None = None

    def __repr__(self) -> str:
        """vLLM's ``BeamSearchParams`` repr (its request log prints it), with its
        ``structured_outputs``, which a request never sets for a beam search."""
        return (f"BeamSearchParams(beam_width={self.beam_width}, max_tokens={self.max_tokens}, "
                f"ignore_eos={self.ignore_eos}, temperature={self.temperature}, "
                f"length_penalty={self.length_penalty}, include_stop_str_in_output={self.include_stop_str_in_output}, "
                f"structured_outputs=None, skip_special_tokens={self.skip_special_tokens}, "
                f"watermarking={self.watermarking}, allowed_token_ids={self.allowed_token_ids})")

    @property
    def step_logprobs(self) -> int:
        """Candidates each step asks the engine for, per beam."""
        return 2 * self.beam_width

    def step_params(self) -> SamplingParams:
        """The parameters of every step's engine requests: one token, its top candidates (a
        temperature out of range is refused as vLLM's ``SamplingParams`` refuses it)."""
        return SamplingParams(max_tokens=1, temperature=self.temperature, logprobs=self.step_logprobs,
                              detokenize=False)


def beam_search_params(request: ChatCompletionRequest | CompletionRequest, max_tokens: int) -> BeamSearchParams:
    """vLLM's ``to_beam_search_params``: ``n`` is the beam width; unset fields take vLLM's defaults."""
    width = 1 if request.n is None else request.n
    if width < 1:
        raise ValidationError(f"beam_width must be at least 1, got {width}.")
    if width > (most := max_n_sequences()):
        raise ValidationError(f"beam_width must be at most {most}, got {width}. To increase this limit, set the "
                              "VLLM_MAX_N_SEQUENCES environment variable.")
    return BeamSearchParams(
        beam_width=width, max_tokens=max_tokens, ignore_eos=request.ignore_eos,
        temperature=1.0 if request.temperature is None else request.temperature,
        length_penalty=request.length_penalty, include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=True if request.skip_special_tokens is None else request.skip_special_tokens,
        watermarking=request.watermarking, allowed_token_ids=request.allowed_token_ids)


def end_of_sequence_ids(generation_config: Mapping[str, Any], eos_token_id: int | None) -> frozenset[int]:
    """The tokens that finish a beam: the tokenizer's EOS and the generation config's, as the
    engine would stop a request on them."""
    params = SamplingParams()
    params.update_from_generation_config(generation_config, eos_token_id)
    return params.all_stop_token_ids


@dataclass
class Beam:
    """One hypothesis: its generated tokens, the candidates of each step it took (one more than
    its tokens where a hidden end-of-sequence token finished it), and their summed logprob."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    cum_logprob: float = 0.0
    finish_reason: str | None = None
    stop_reason: int | None = None


def beam_score(num_generated_tokens: int, cum_logprob: float, length_penalty: float) -> float:
    """A beam's rank: its cumulative logprob over its length to the ``length_penalty`` (an
    end-of-sequence token counted, as Transformers counts it; a beam of no tokens counts 1)."""
    return cum_logprob / (max(num_generated_tokens, 1) ** length_penalty)


def grow(beams: Sequence[Beam], steps: Sequence[PositionLogprobs], params: BeamSearchParams,
         eos_token_ids: Collection[int]) -> tuple[list[Beam], list[Beam]]:
    """One step: ``steps[i]`` is beam ``i``'s candidates. Returns the next live beams (at most
    ``beam_width``, best first) and the beams an end-of-sequence candidate finished.

    Candidates are ranked by their cumulative logprob, in the order beam by beam, candidate by
    candidate; ties are broken as numpy's ``argpartition`` then ``argsort`` break them, which is
    what vLLM's server does, so the same engine answers give the same beams."""
    finished: list[Beam] = []
    scores: list[float] = []
    extensions: list[tuple[Beam, int, PositionLogprobs]] = []
    for beam, step in zip(beams, steps):
        for token_id, candidate in step.items():
            score = beam.cum_logprob + candidate.logprob
            if token_id in eos_token_ids and not params.ignore_eos:
                tokens = [*beam.token_ids, token_id] if params.include_stop_str_in_output else list(beam.token_ids)
                finished.append(Beam(tokens, [*beam.logprobs, step], score, "stop", token_id))
            else:
                scores.append(score)
                extensions.append((beam, token_id, step))
    order = _best_first(np.asarray(scores, dtype=np.float64), params.beam_width)
    live = [Beam([*beam.token_ids, token_id], [*beam.logprobs, step], scores[i])
            for i in order for beam, token_id, step in (extensions[i],)]
    return live, finished


def _best_first(scores: np.ndarray, keep: int) -> list[int]:
    """The indices of the ``keep`` highest ``scores``, highest first."""
    if len(scores) <= keep:
        return [int(i) for i in np.argsort(-scores)]
    top = np.argpartition(-scores, keep - 1)[:keep]
    return [int(i) for i in top[np.argsort(-scores[top])]]


def best_beams(beams: Sequence[Beam], params: BeamSearchParams) -> list[Beam]:
    """The ``beam_width`` best of ``beams`` by :func:`beam_score`, best first (a stable sort)."""
    ranked = sorted(beams, key=lambda b: beam_score(len(b.logprobs), b.cum_logprob, params.length_penalty),
                    reverse=True)
    return ranked[:params.beam_width]


def answer(beam: Beam, params: BeamSearchParams, eos_token_ids: Collection[int], tokenizer: Any) -> WholeOutput:
    """A finished search's beam as its choice: the text decoded at once from its tokens (without
    a final end-of-sequence token, which ``include_stop_str_in_output`` keeps in the ids only)."""
    shown = beam.token_ids
    if shown and shown[-1] in eos_token_ids and not params.ignore_eos:
        shown = shown[:-1]
    text = str(tokenizer.decode(shown, skip_special_tokens=params.skip_special_tokens))
    return WholeOutput(text, list(beam.token_ids), list(beam.logprobs), beam.finish_reason or "length",
                       beam.stop_reason)


@dataclass
class BeamSearch:
    """One prompt's search over ``client``; ``stats`` counts each step request as vLLM's
    metrics count it (an engine request of its own)."""

    client: AsyncEngineClient
    tokenizer: Any
    eos_token_ids: frozenset[int]
    stats: StatsRecorder | None = None

    async def run(self, request_id: str, inputs: MultiModalInputs, options: RequestOptions,
                  params: BeamSearchParams) -> list[WholeOutput]:
        """The best ``beam_width`` beams as choices, best first (fewer where fewer exist)."""
        prompt = list(inputs["prompt_token_ids"])
        step_params = params.step_params()
        beams, finished = [Beam()], []
        for _ in range(params.max_tokens):
            batch = f"{request_id}-{secrets.token_hex(8)}"
            steps = [asyncio.ensure_future(self._step(
                f"{batch}-beam-{i}", {**inputs, "prompt_token_ids": [*prompt, *beam.token_ids]}, options, step_params))
                for i, beam in enumerate(beams)]
            try:
                outputs = await asyncio.gather(*steps)
            finally:  # a step that failed ends the search: the others are aborted, not left to run
                for step in steps:
                    step.cancel()
            if any(output is None or output.finish_reason == FinishReason.ABORT for output in outputs):
                for beam in beams:  # aborted in the engine by someone else: the search ends here
                    beam.finish_reason = "abort"
                break
            candidates = [_candidates(output, params.step_logprobs) for output in outputs if output is not None]
            beams, ended = grow(beams, candidates, params, self.eos_token_ids)
            finished += ended
            if not beams:
                break
        return [answer(beam, params, self.eos_token_ids, self.tokenizer)
                for beam in best_beams([*finished, *beams], params)]

    async def _step(self, request_id: str, inputs: MultiModalInputs, options: RequestOptions,
                    params: SamplingParams) -> EngineCoreOutput | None:
        """One beam's step request, read to its end (``None``: it ended without finishing).
        Cancelled, it closes its stream, which aborts it in the engine."""
        if self.stats is not None:
            self.stats.add_requests([request_id], len(inputs["prompt_token_ids"]), params.max_tokens)
        last: EngineCoreOutput | None = None
        stream: AsyncIterator[EngineCoreOutput] | None = None
        try:
            stream = await self.client.add_request(request_id, inputs, params, options=options)
            async for output in stream:
                if output.finish_reason == FinishReason.ERROR:
                    raise engine_error(output)
                last = output
        finally:
            if stream is not None:
                await stream.aclose()  # type: ignore[attr-defined]
            if self.stats is not None and (last is None or last.finish_reason is None):
                self.stats.drop(request_id)
        return last if last is not None and last.finish_reason is not None else None


def _candidates(output: EngineCoreOutput, num_logprobs: int) -> PositionLogprobs:
    """The candidates of a step's one token, as vLLM's output processor keeps them (no texts:
    a step is not detokenized)."""
    lists = output.new_logprobs
    if lists is None or not len(lists.sampled_token_ranks):
        return {}
    ids = [int(t) for t in lists.logprob_token_ids[-1].tolist()]
    return position_logprobs(ids, lists.logprobs[-1].tolist(), int(lists.sampled_token_ranks[-1]),
                             [None] * len(ids), num_logprobs)


__all__ = ["Beam", "BeamSearch", "BeamSearchParams", "answer", "beam_score", "beam_search_params", "best_beams",
           "end_of_sequence_ids", "grow"]
