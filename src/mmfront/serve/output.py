"""Engine outputs -> what an OpenAI client reads: text deltas, stop strings, finish reasons,
token counts and logprobs, as vLLM's output processor makes them.

The engine streams token ids; the text is made here, per choice, by an
:class:`IncrementalDetokenizer` over the ``tokenizers`` library's ``DecodeStream`` (a maintained,
native streaming decoder that holds back a token until it completes a UTF-8 character, so a
delta never splits one). It is primed with the end of the prompt, as vLLM primes it, so a
first token that starts with a space keeps it. Tokenizers without a ``tokenizers`` backend
fall back to re-decoding a short window (:class:`WindowDetokenizer`).

:class:`ChoiceOutput` applies vLLM's rules on top: a token that ended the request with
``FinishReason.STOP`` (EOS, a stop token id) is counted but not detokenized unless
``include_stop_str_in_output``; stop strings are searched only in the text that is new, the
text is cut at (or after) the match, tokens past the one that completed it are dropped, and
the caller must abort the engine request (:attr:`Delta.stopped`); while stop strings may
still match, the last ``max(len(stop)) - 1`` characters are held back from the deltas.
"""

from __future__ import annotations

import bisect
import json
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from mmfront.serve.errors import engine_error
from mmfront.serve.iteration_stats import PrefillStats, prefill_stats
from mmfront.wire import SamplingParams
from mmfront.wire.structs import EngineCoreOutput, FinishReason, LogprobsLists, LogprobsTensors

logger = logging.getLogger(__name__)

PROMPT_PRIMING_TOKENS = 8
"""How many prompt tokens prime a decoder: enough for the decoder to know whether the first
generated token continues a word, without decoding a long multimodal prompt."""

LOGPROB_FLOOR = -9999.0
"""OpenAI clients cannot read ``-inf``; vLLM reports it as this."""


class IncrementalDetokenizer:
    """Token ids in, text out, one token at a time, over ``tokenizers.decoders.DecodeStream``."""

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: Sequence[int], *, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._stream = DecodeStream(ids=list(prompt_token_ids[-PROMPT_PRIMING_TOKENS:]),
                                    skip_special_tokens=skip_special_tokens)

    def step(self, token_id: int) -> str:
        """The text ``token_id`` completes (empty while a character is still incomplete)."""
        try:
            return self._stream.step(self._tokenizer, token_id) or ""
        except Exception as e:  # tokenizers raises a bare Exception for a broken prefix
            if not str(e).startswith("Invalid prefix"):
                raise
            # a tokenizer whose decoding is not monotonic broke the stream's state: start afresh
            logger.warning("Restarting the decode stream after %s", e)
            self._stream = DecodeStream(skip_special_tokens=self._skip)
            return self._stream.step(self._tokenizer, token_id) or ""


class WindowDetokenizer:
    """The same for a tokenizer without a ``tokenizers`` backend: re-decode a window that starts
    a few tokens back, and emit what it adds once it no longer ends in a partial character."""

    def __init__(self, tokenizer: Any, prompt_token_ids: Sequence[int], *, skip_special_tokens: bool) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._ids = list(prompt_token_ids[-PROMPT_PRIMING_TOKENS:])
        self._prefix = 0
        self._read = len(self._ids)

    def step(self, token_id: int) -> str:
        self._ids.append(token_id)
        before = self._tokenizer.decode(self._ids[self._prefix:self._read], skip_special_tokens=self._skip)
        after = self._tokenizer.decode(self._ids[self._prefix:], skip_special_tokens=self._skip)
        if after.endswith("\ufffd") or len(after) <= len(before):
            return ""
        self._prefix, self._read = self._read, len(self._ids)
        return after[len(before):]


def make_detokenizer(
    tokenizer: Any, prompt_token_ids: Sequence[int], *, skip_special_tokens: bool,
) -> IncrementalDetokenizer | WindowDetokenizer:
    """The streaming decoder for ``tokenizer`` (an HF tokenizer or a ``tokenizers.Tokenizer``)."""
    backend = tokenizer if isinstance(tokenizer, Tokenizer) else getattr(tokenizer, "backend_tokenizer", None)
    if isinstance(backend, Tokenizer):
        return IncrementalDetokenizer(backend, prompt_token_ids, skip_special_tokens=skip_special_tokens)
    return WindowDetokenizer(tokenizer, prompt_token_ids, skip_special_tokens=skip_special_tokens)


@dataclass
class Logprob:
    """One candidate token at one position, as vLLM's ``vllm.logprobs.Logprob``: its logprob,
    its rank in the vocabulary (1: the most likely) and its text."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]
"""One position's candidates, token id -> :class:`Logprob`, the sampled (or prompt) token first:
vLLM builds it as a dict, so a token listed twice (the sampled token among the top-k) keeps its
first place and its last values."""

PromptLogprobs = list[PositionLogprobs | None]
"""A prompt's logprobs: ``None`` for the first token (nothing predicts it), then a position each."""

_REPLACEMENT = "\ufffd"
_CONTEXT_TOKENS = 4
"""Preceding tokens that can complete a UTF-8 character split across byte-fallback tokens."""


def leading_space_marker(tokenizer: Any) -> str | None:
    """The Metaspace replacement character of ``tokenizer``'s pre-tokenizer (``▁`` for
    SentencePiece models), whose leading instances ``decode`` strips from a single token; ``None``
    where decoding one token keeps its spaces (vLLM's ``get_leading_space_marker``)."""
    backend = tokenizer if isinstance(tokenizer, Tokenizer) else getattr(tokenizer, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        return None
    try:
        pre = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    except ValueError:
        return None
    pieces = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    for piece in pieces:
        if piece.get("type") == "Metaspace":
            return str(piece.get("replacement", "\u2581"))
    return None


class LogprobTokens:
    """Token ids -> the texts vLLM's output processor gives logprob candidates: each id decoded
    alone, a SentencePiece leading space restored, and a candidate that ends in an incomplete
    UTF-8 character completed from the tokens sampled before it (vLLM's
    ``convert_ids_list_to_tokens`` and ``LogprobsProcessor._verify_tokens``)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._marker = leading_space_marker(tokenizer)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids)))

    def texts(self, token_ids: Sequence[int], context: Sequence[int]) -> list[str]:
        """The texts of one position's candidates; ``context``: the tokens before the position."""
        texts = [self.decode([t]) or "" for t in token_ids]
        if self._marker is not None:
            raw = self._tokenizer.convert_ids_to_tokens(list(token_ids))
            texts = [_restore_leading_spaces(r, t, self._marker) if r else t for r, t in zip(raw, texts)]
        return [self._complete(t, context) if text.endswith(_REPLACEMENT) else text
                for t, text in zip(token_ids, texts)]

    def _complete(self, token_id: int, context: Sequence[int]) -> str:
        """The text ``token_id`` completes after ``context``; empty while still incomplete."""
        context = list(context[-_CONTEXT_TOKENS:])
        for size in range(1, len(context) + 1):
            before = context[-size:]
            full = self.decode([*before, token_id])
            if full.endswith(_REPLACEMENT):
                continue
            clean_end = len(before)  # context tokens that were themselves incomplete belong to this one
            for j in range(len(before) - 1, -1, -1):
                if not self.decode([before[j]]).endswith(_REPLACEMENT):
                    break
                clean_end = j
            prefix = self.decode(before[:clean_end]) if clean_end else ""
            if full.startswith(prefix):
                return full[len(prefix):]
            common = 0
            for a, b in zip(prefix, full):
                if a != b:
                    break
                common += 1
            return full[common:]
        return ""


def _restore_leading_spaces(raw: str, text: str, marker: str) -> str:
    markers = len(raw) - len(raw.lstrip(marker))
    missing = markers - (len(text) - len(text.lstrip(" ")))
    return " " * missing + text if missing > 0 else text


def position_logprobs(token_ids: Sequence[int], logprobs: Sequence[float], rank: int, texts: Sequence[str | None],
                      num_logprobs: int) -> PositionLogprobs:
    """One row of the engine's logprobs as vLLM keeps it: the first ``num_logprobs + 1`` columns
    (all of them for -1; a row may be wider, as wide as the step's widest request), the first
    ranked ``rank``, the others 1, 2, ..."""
    width = len(logprobs) if num_logprobs == -1 else num_logprobs + 1
    ranks = [rank, *range(1, width)]
    return {int(t): Logprob(float(lp), r, text)
            for t, lp, r, text in zip(token_ids[:width], logprobs[:width], ranks, texts)}


def _first_tokens(positions: Sequence[PositionLogprobs | None]) -> list[int]:
    """The token each of the last few positions is about (its first candidate)."""
    return [next(iter(p)) for p in positions[-_CONTEXT_TOKENS:] if p]


def sample_logprobs(lists: LogprobsLists, rows: int, num_logprobs: int, tokens: LogprobTokens,
                    before: Sequence[PositionLogprobs]) -> list[PositionLogprobs]:
    """The engine's ``new_logprobs`` (vLLM's ``LogprobsLists``) for its first ``rows`` positions;
    ``before``: the request's positions so far (the context of a split character)."""
    out: list[PositionLogprobs] = []
    ranks = lists.sampled_token_ranks.tolist()
    for i in range(min(rows, len(ranks))):
        ids = [int(t) for t in lists.logprob_token_ids[i].tolist()]
        width = len(ids) if num_logprobs == -1 else num_logprobs + 1
        texts = tokens.texts(ids[:width], _first_tokens([*before, *out]))
        out.append(position_logprobs(ids, lists.logprobs[i].tolist(), int(ranks[i]), texts, num_logprobs))
    return out


def prompt_logprobs(tensors: LogprobsTensors, num_logprobs: int, tokens: LogprobTokens,
                    before: PromptLogprobs) -> PromptLogprobs:
    """The engine's ``new_prompt_logprobs_tensors`` (vLLM's ``LogprobsTensors``), a row per prompt
    position; ``before``: the positions an earlier chunk gave."""
    out: PromptLogprobs = []
    ids_rows = tensors.logprob_token_ids.tolist()
    lp_rows = tensors.logprobs.tolist()
    ranks = tensors.selected_token_ranks.tolist()
    for ids, lps, rank in zip(ids_rows, lp_rows, ranks):
        width = len(ids) if num_logprobs == -1 else num_logprobs + 1
        texts = tokens.texts(ids[:width], _first_tokens([*before, *out]))
        out.append(position_logprobs(ids, lps, int(rank), texts, num_logprobs))
    return out


@dataclass
class Delta:
    """What one engine output adds to a choice."""

    text: str
    token_ids: list[int]
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    stopped: bool = False
    """A stop string ended the choice here while the engine still generates: abort it."""

    def then(self, later: Delta) -> Delta:
        """This delta followed by ``later``, as one."""
        logprobs = None if self.logprobs is None and later.logprobs is None else [
            *(self.logprobs or ()), *(later.logprobs or ())]
        return Delta(self.text + later.text, self.token_ids + later.token_ids, logprobs, later.finish_reason,
                     later.stop_reason, self.stopped or later.stopped)


@dataclass
class WholeOutput:
    """A choice made whole elsewhere (a beam search), not streamed from one engine request."""

    text: str
    token_ids: list[int]
    logprobs: list[PositionLogprobs]
    finish_reason: str
    stop_reason: int | str | None = None


@dataclass
class ChoiceOutput:
    """One choice (one engine request) as it streams: its text, tokens, logprobs and how it ended.

    ``logprob_tokens`` names the candidates of the logprobs the parameters ask for (sample
    ``logprobs``, ``prompt_logprobs``); the engine's are ignored when the parameters ask for none."""

    detokenizer: IncrementalDetokenizer | WindowDetokenizer
    params: SamplingParams
    logprob_tokens: LogprobTokens | None = None
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] = field(default_factory=list)
    prompt_logprobs: PromptLogprobs | None = None
    """``None`` until the engine sent the prompt's (when asked for), then ``[None, ...]``."""
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prefill: PrefillStats | None = None
    """The engine's account of the prompt (its first output's ``prefill_stats``; only an engine
    that keeps statistics sends one)."""
    answered: bool = False
    """Whether an engine output arrived for it, a failed request's too: vLLM's stream sends its
    role chunk with the first output, so a failure the engine reports comes after that chunk."""
    _sent: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def num_logprobs(self) -> int | None:
        """Candidates asked for per generated token besides the sampled one (``logprobs``, or as
        many as ``logprob_token_ids`` names), ``None``: no logprobs (vLLM's ``num_logprobs``)."""
        if self.params.logprobs is not None:
            return self.params.logprobs
        return len(self.params.logprob_token_ids) if self.params.logprob_token_ids else None

    @property
    def _stops(self) -> Sequence[str]:
        """The stop strings, searched in each step's new text: a step costs at most their number
        times the text they may span (``stop`` is capped at ``MAX_STOP_STRINGS`` per request)."""
        stop = self.params.stop
        return (stop,) if isinstance(stop, str) else stop or ()

    def process(self, output: EngineCoreOutput) -> Delta:
        """Take one engine output; raises what the engine reported for a failed request."""
        self.answered = True
        if output.finish_reason == FinishReason.ERROR:
            raise engine_error(output)
        if self.prefill is None and output.prefill_stats is not None:
            self.prefill = prefill_stats(output.prefill_stats)
        new_ids = list(output.new_token_ids)
        hide_last = output.finish_reason == FinishReason.STOP and not self.params.include_stop_str_in_output
        first = len(self.token_ids)
        offsets = [len(self.text)]
        for k, token_id in enumerate(new_ids):
            self.token_ids.append(token_id)
            if not (hide_last and k == len(new_ids) - 1):
                self.text += self.detokenizer.step(token_id)
            offsets.append(len(self.text))
        stop = self._check_stop_strings(offsets, first)
        stopped = False
        if stop is not None:
            stop_string, keep_chars, stop_end = stop
            del self.token_ids[first + bisect.bisect_left(offsets, stop_end, lo=1):]
            self.text = self.text[:keep_chars]
            self.finish_reason, self.stop_reason = "stop", stop_string
            stopped = output.finish_reason is None
        elif output.finish_reason is not None:
            self.finish_reason, self.stop_reason = str(output.finish_reason), output.stop_reason
        kept = self.token_ids[first:]
        self._take_prompt_logprobs(output.new_prompt_logprobs_tensors)
        delta_logprobs = None
        if (asked := self.num_logprobs) is not None:
            delta_logprobs = []
            if output.new_logprobs is not None and self.logprob_tokens is not None:
                delta_logprobs = sample_logprobs(output.new_logprobs, len(kept), asked, self.logprob_tokens,
                                                 self.logprobs)
            self.logprobs += delta_logprobs
        return Delta(self._take_text(), kept, delta_logprobs, self.finish_reason, self.stop_reason, stopped)

    def complete(self, whole: WholeOutput) -> Delta:
        """Take a whole answer at once: it is this choice's text, tokens and logprobs."""
        self.text, self.token_ids, self.logprobs = whole.text, list(whole.token_ids), list(whole.logprobs)
        self.finish_reason, self.stop_reason = whole.finish_reason, whole.stop_reason
        return Delta(self._take_text(), list(whole.token_ids), list(whole.logprobs), whole.finish_reason,
                     whole.stop_reason)

    def _take_prompt_logprobs(self, tensors: LogprobsTensors | None) -> None:
        asked = self.params.prompt_logprobs
        if asked is None or tensors is None or self.logprob_tokens is None:
            return
        before: PromptLogprobs = self.prompt_logprobs if self.prompt_logprobs is not None else [None]
        self.prompt_logprobs = [*before, *prompt_logprobs(tensors, asked, self.logprob_tokens, before)]

    def _check_stop_strings(self, offsets: list[int], before: int) -> tuple[str, int, int] | None:
        """The stop string that completes earliest in the new text, where to cut the text, and the
        character offset its match ends at (to find the token that completed it)."""
        stops = self._stops
        min_tokens = self.params.min_tokens
        if not stops or len(self.token_ids) <= min_tokens:
            return None
        start = offsets[max(min_tokens - before, 0)]
        new_chars = len(self.text) - start
        if not new_chars:
            return None
        best: tuple[str, int] | None = None
        best_end = sys.maxsize
        for stop in stops:
            index = self.text.find(stop, max(0, len(self.text) - new_chars - len(stop) + 1))
            if index != -1 and index + len(stop) < best_end:
                best, best_end = (stop, index), index + len(stop)
        if best is None:
            return None
        stop, index = best
        if self.params.include_stop_str_in_output:
            return stop, best_end, best_end
        return stop, index, best_end

    def _take_text(self) -> str:
        """The text not yet sent, minus what a stop string may still claim."""
        hold = 0 if self.finished else self.params.output_text_buffer_length  # max(len(stop)) - 1, set once
        end = max(len(self.text) - hold, self._sent)
        delta, self._sent = self.text[self._sent:end], end
        return delta


__all__ = [
    "LOGPROB_FLOOR",
    "PROMPT_PRIMING_TOKENS",
    "ChoiceOutput",
    "Delta",
    "IncrementalDetokenizer",
    "Logprob",
    "LogprobTokens",
    "PositionLogprobs",
    "PromptLogprobs",
    "WholeOutput",
    "WindowDetokenizer",
    "leading_space_marker",
    "make_detokenizer",
    "position_logprobs",
    "prompt_logprobs",
    "sample_logprobs",
]
