"""Conversations, the transformers reference and a step loop, shared by the ModelRunner tests.

A :class:`Family` is one model folder with its media: the same items go to mmfront as chat
content parts (data URLs, WAV bytes) and to the HF processor as decoded objects (PIL images, the
float32 waveform libsndfile decodes from the same WAV bytes, as mmfront does).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import soundfile
import torch
import transformers

from mmfront import InputPreprocessor, InputProcessor, MultiModalConfig
from mmfront.engine.runner import ModelRunner
from mmfront.fixtures.catalog import fixture_kinds
from mmfront.testing.media import image_data_url, make_audio, make_image, wav_bytes
from mmfront.testing.models import fixture_model_impl, load_processor
from mmfront.wire import EngineCoreRequest, MsgpackDecoder, MsgpackEncoder, SamplingParams
from mmfront.wire.structs import EngineCoreOutput, FinishReason

MAX_TOKENS = 8

#: where the runner runs by default, and so where the reference runs, for equal kernels
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@dataclass(frozen=True)
class Item:
    part: dict[str, Any]
    """The chat content part mmfront gets."""
    hf_part: dict[str, Any]
    """The part the HF chat template renders."""
    media: Any
    """What the HF processor gets."""


def image_item(width: int, height: int, seed: int) -> Item:
    image = make_image(width, height, seed=seed)
    return Item({"type": "image_url", "image_url": {"url": image_data_url(image)}}, {"type": "image"}, image)


def audio_item(seconds: float, seed: int) -> Item:
    wav = wav_bytes(make_audio(seconds, seed=seed), 16000)
    waveform, _ = soundfile.read(io.BytesIO(wav), dtype="float32")
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"}}
    return Item(part, {"type": "audio", "audio_url": "clip.wav"}, waveform)


def conversation(turns: Sequence[Sequence[Item]], *, hf: bool = False) -> list[dict[str, Any]]:
    """A system message, then one user turn per entry of ``turns`` (its items, then a question),
    with an assistant answer between user turns."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": [{"type": "text", "text": "You are terse."}]}]
    for i, items in enumerate(turns):
        if i:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": "Here is the answer."}]})
        parts = [item.hf_part if hf else item.part for item in items]
        messages.append({"role": "user", "content": [*parts, {"type": "text", "text": "What is in this picture?"}]})
    return messages


@dataclass
class Family:
    kind: str
    folder: Path
    media_kwarg: str
    """The HF processor's keyword for the items: ``images`` or ``audio``."""

    @cached_property
    def hf_processor(self) -> Any:
        return load_processor(self.folder)

    @cached_property
    def hf_model(self) -> Any:
        return getattr(transformers, fixture_kinds()[self.kind].architecture).from_pretrained(self.folder).to(DEVICE)

    @property
    def config(self) -> MultiModalConfig:
        """``ModelRunner(folder)`` runs the checkpoint's own dtype, so the frontend is told that
        dtype (as ``vllm serve --dtype`` would be), not ``--dtype auto``'s bfloat16 for a float32
        checkpoint. The model implementation is the one a user must name on the installed
        transformers (``fixture_model_impl``)."""
        return MultiModalConfig(dtype=fixture_kinds()[self.kind].torch_dtype,  # type: ignore[arg-type]
                                model_impl=fixture_model_impl(self.kind))

    @cached_property
    def input_processor(self) -> InputProcessor:
        return InputProcessor(InputPreprocessor(self.folder, self.config))

    def request(self, request_id: str, turns: Sequence[Sequence[Item]], max_tokens: int = MAX_TOKENS,
                **params: Any) -> EngineCoreRequest:
        """mmfront's request for ``turns``, through the wire (encoded and decoded as P1 gets it)."""
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, **params)
        request = self.input_processor.process_inputs(request_id, conversation(turns), sampling)
        return wire_round_trip(request)

    def reference(self, turns: Sequence[Sequence[Item]], max_tokens: int = MAX_TOKENS) -> tuple[list[int], list[int], torch.Tensor]:
        """``(prompt ids, greedy tokens, first-step logits)`` of ``model.generate`` on the HF
        processor's outputs for the same conversation."""
        proc = self.hf_processor
        text = proc.apply_chat_template(conversation(turns, hf=True), add_generation_prompt=True, tokenize=False)
        media = [item.media for items in turns for item in items]
        # the template writes BOS itself, so the tokenizer must not add one (as for mmfront's chat path)
        inputs = proc(text=text, **{self.media_kwarg: media}, add_special_tokens=False, return_tensors="pt").to(DEVICE)
        with torch.inference_mode():
            out = self.hf_model.generate(**inputs, do_sample=False, max_new_tokens=max_tokens, output_logits=True,
                                         return_dict_in_generate=True)
        prompt = inputs["input_ids"][0].tolist()
        return prompt, out.sequences[0, len(prompt):].tolist(), out.logits[0][0].float().cpu()


def wire_round_trip(request: EngineCoreRequest) -> EngineCoreRequest:
    decoded: EngineCoreRequest = MsgpackDecoder(EngineCoreRequest).decode(MsgpackEncoder().encode(request))
    return decoded


def run(runner: ModelRunner, requests: Sequence[EngineCoreRequest]) -> dict[str, tuple[list[int], EngineCoreOutput]]:
    """Add ``requests`` together and step until all finish: each one's tokens and last output."""
    for request in requests:
        runner.add(request)
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    last: dict[str, EngineCoreOutput] = {}
    for _ in range(4 * MAX_TOKENS + 8):
        if not runner.has_unfinished_requests:
            break
        for output in runner.step():
            tokens[output.request_id] += output.new_token_ids
            last[output.request_id] = output
    assert not runner.has_unfinished_requests
    return {rid: (tokens[rid], last[rid]) for rid in tokens}


def finish_of(tokens: list[int], eos: frozenset[int]) -> FinishReason:
    """How greedy decoding that produced ``tokens`` must have finished (EOS before the length)."""
    return FinishReason.STOP if tokens[-1] in eos else FinishReason.LENGTH
