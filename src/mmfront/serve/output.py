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
import logging
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from mmfront.serve.errors import engine_error
from mmfront.wire import SamplingParams
from mmfront.wire.structs import EngineCoreOutput, FinishReason

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


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's logprob and the top alternatives, sampled token first (vLLM's order)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def token_logprobs(new_logprobs: Any, count: int) -> list[TokenLogprob]:
    """The engine's ``new_logprobs`` (vLLM's ``LogprobsLists``: rows of token ids and logprobs,
    the sampled token first, then the top-k) for the first ``count`` new tokens."""
    ids_rows, lp_rows = new_logprobs[0], new_logprobs[1]
    out = []
    for i in range(count):
        ids = [int(t) for t in _row(ids_rows[i])]
        lps = [float(x) for x in _row(lp_rows[i])]
        top = tuple(dict(zip(ids, lps)).items())  # the sampled token once, first
        out.append(TokenLogprob(ids[0], lps[0], top))
    return out


def _row(row: Any) -> list[Any]:
    return row.tolist() if hasattr(row, "tolist") else list(row)


@dataclass
class Delta:
    """What one engine output adds to a choice."""

    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob] | None
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
class ChoiceOutput:
    """One choice (one engine request) as it streams: its text, tokens and how it ended."""

    detokenizer: IncrementalDetokenizer | WindowDetokenizer
    params: SamplingParams
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    _sent: int = 0

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def _stops(self) -> list[str]:
        stop = self.params.stop
        return [stop] if isinstance(stop, str) else list(stop or ())

    def process(self, output: EngineCoreOutput) -> Delta:
        """Take one engine output; raises what the engine reported for a failed request."""
        if output.finish_reason == FinishReason.ERROR:
            raise engine_error(output)
        new_ids = list(output.new_token_ids)
        engine_logprobs = (token_logprobs(output.new_logprobs, len(new_ids))
                           if output.new_logprobs is not None and self.params.logprobs is not None else None)
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
        delta_logprobs = None
        if self.params.logprobs is not None:
            delta_logprobs = (engine_logprobs or [])[:len(kept)]
            self.logprobs += delta_logprobs
        return Delta(self._take_text(), kept, delta_logprobs, self.finish_reason, self.stop_reason, stopped)

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
        hold = 0
        if not self.finished and self._stops and not self.params.include_stop_str_in_output:
            hold = max(len(s) for s in self._stops) - 1
        end = max(len(self.text) - hold, self._sent)
        delta, self._sent = self.text[self._sent:end], end
        return delta


__all__ = [
    "LOGPROB_FLOOR",
    "PROMPT_PRIMING_TOKENS",
    "ChoiceOutput",
    "Delta",
    "IncrementalDetokenizer",
    "TokenLogprob",
    "WindowDetokenizer",
    "make_detokenizer",
    "token_logprobs",
]
