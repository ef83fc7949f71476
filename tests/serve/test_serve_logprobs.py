"""Logprobs from the engine's bytes to the OpenAI fields, without a peer: a vLLM 0.33 engine's
``EngineCoreOutputs`` frames (recorded from vLLM's own ``MsgpackEncoder``) decode to the exact
arrays, mmfront encodes the same structs to the same bytes, each row becomes vLLM's per-position
candidates (width cut to the request's, the sampled token first and kept once, its rank), the
prompt's arrive in chunks, and the response shapes write them as vLLM does (``-9999.0``,
``token_id:N``, the sampled token's bytes, text offsets, an echoed prompt's first ``None``).
Where the peer venv is present, the candidates' texts equal vLLM's ``LogprobsProcessor``'s for
text whose characters span byte-fallback tokens."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from mmfront.serve.output import (
    ChoiceOutput,
    Logprob,
    LogprobTokens,
    leading_space_marker,
    make_detokenizer,
    position_logprobs,
)
from mmfront.serve.responses import (
    ENCODER,
    LogprobFormat,
    chat_logprobs,
    clamp_prompt_logprobs,
    completion_logprobs,
)
from mmfront.testing.peer import vllm_peer_model_dir, vllm_peer_python
from mmfront.wire import SamplingParams
from mmfront.wire.codec import MsgpackDecoder, MsgpackEncoder
from mmfront.wire.structs import EngineCoreOutput, EngineCoreOutputs, LogprobsLists, LogprobsTensors

VLLM_FRAME_0 = bytes.fromhex(
    "990091dc0013a17292cd03e8cd03e99493a33c6934920203c71803e8030000e8030000e9030000e9030000e9030000ea03000093a33c"
    "6634920203c71803cdccccbdcdccccbdcdcc4cbecdccccbdcdccccbd000080ff93a33c69349102d7030100000001000000c09593a569"
    "6e7433329228020193a7666c6f617433329228020293a5696e7433329128c7a003010000000100000001000000010000000100000001"
    "000000010000000100000001000000010000000100000001000000010000000100000001000000010000000100000001000000010000"
    "000100000001000000010000000100000001000000010000000100000001000000010000000100000001000000010000000100000001"
    "00000001000000010000000100000001000000010000000100000001000000c0c0c0c0c0c0c0c0c0c0c000c0c0c0c0c0c0cb3ff80000"
    "00000000c0c0c0c0c0")
"""Frame 0 of vLLM 0.33's ``MsgpackEncoder().encode(EngineCoreOutputs(engine_index=0, timestamp=1.5,
outputs=[EngineCoreOutput("r", [1000, 1001], new_logprobs=LogprobsLists(ids, lps, ranks, None),
new_prompt_logprobs_tensors=LogprobsTensors(tid, tlp, trk))]))`` with the arrays of
:func:`vllm_arrays`: the sample arrays inline, the prompt's id and logprob tensors (320 bytes each)
in aux frames 1 and 2, its ranks inline."""


def vllm_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = np.array([[1000, 1000, 1001], [1001, 1001, 1002]], dtype=np.int32)
    lps = np.array([[-0.1, -0.1, -0.2], [-0.1, -0.1, -np.inf]], dtype=np.float32)
    ranks = np.array([1, 1], dtype=np.int32)
    tid = torch.arange(80, dtype=torch.int32).reshape(40, 2) + 3
    tlp = torch.full((40, 2), -0.25, dtype=torch.float32)
    trk = torch.ones(40, dtype=torch.int32)
    return ids, lps, ranks, tid, tlp, trk


def vllm_frames() -> list[bytes]:
    _, _, _, tid, tlp, _ = vllm_arrays()
    return [VLLM_FRAME_0, tid.numpy().tobytes(), tlp.numpy().tobytes()]


def test_a_vllm_engines_logprob_bytes_decode_to_its_arrays() -> None:
    outputs = MsgpackDecoder(EngineCoreOutputs).decode(vllm_frames())
    [out] = outputs.outputs
    ids, lps, ranks, tid, tlp, trk = vllm_arrays()
    assert out.request_id == "r" and out.new_token_ids == [1000, 1001] and outputs.timestamp == 1.5
    lists = out.new_logprobs
    assert isinstance(lists, LogprobsLists) and lists.cu_num_generated_tokens is None
    for got, want in ((lists.logprob_token_ids, ids), (lists.logprobs, lps), (lists.sampled_token_ranks, ranks)):
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    tensors = out.new_prompt_logprobs_tensors
    assert isinstance(tensors, LogprobsTensors) and tensors.cu_num_generated_tokens is None
    assert tensors.cu_num_generated_tokens_tensor is None
    for got_t, want_t in ((tensors.logprob_token_ids, tid), (tensors.logprobs, tlp), (tensors.selected_token_ranks, trk)):
        assert got_t.dtype == want_t.dtype and torch.equal(got_t, want_t)


def test_mmfront_encodes_logprobs_to_vllms_bytes() -> None:
    ids, lps, ranks, tid, tlp, trk = vllm_arrays()
    out = EngineCoreOutput("r", [1000, 1001], new_logprobs=LogprobsLists(ids, lps, ranks),
                           new_prompt_logprobs_tensors=LogprobsTensors(tid, tlp, trk))
    frames = MsgpackEncoder().encode(EngineCoreOutputs(engine_index=0, outputs=[out], timestamp=1.5))
    assert [bytes(f) for f in frames] == vllm_frames()


@pytest.fixture(scope="module")
def tokenizer(gemma3_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(gemma3_dir)


def test_a_row_keeps_the_requests_width_and_the_sampled_token_once() -> None:
    # a row as wide as the step's widest request (k=3) for a request that asked for 1
    row = position_logprobs([7, 7, 9, 11], [-0.5, -0.5, -1.5, -2.5], 4, ["a", "a", "b", "c"], 1)
    assert row == {7: Logprob(-0.5, 1, "a")}  # the sampled token is the top-1: one entry, rank 1
    row = position_logprobs([9, 7, 9, 11], [-1.5, -0.5, -1.5, -2.5], 3, ["b", "a", "b", "c"], 2)
    assert list(row.items()) == [(9, Logprob(-1.5, 2, "b")), (7, Logprob(-0.5, 1, "a"))]
    row = position_logprobs([9, 7, 9, 11], [-1.5, -0.5, -1.5, -2.5], 3, ["b", "a", "b", "c"], -1)
    assert list(row) == [9, 7, 11] and row[11] == Logprob(-2.5, 3, "c")


def engine_output(ids: list[list[int]], logprobs: list[list[float]], ranks: list[int], **fields: Any,
                  ) -> EngineCoreOutput:
    return EngineCoreOutput("r", [row[0] for row in ids], new_logprobs=LogprobsLists(
        np.array(ids, dtype=np.int32), np.array(logprobs, dtype=np.float32), np.array(ranks, dtype=np.int32)),
        **fields)


def test_a_choice_keeps_sample_and_prompt_logprobs(tokenizer: Any) -> None:
    hello = tokenizer.encode("Hello world", add_special_tokens=False)
    prompt = [2, *hello]
    out = ChoiceOutput(make_detokenizer(tokenizer, prompt, skip_special_tokens=True),
                       SamplingParams(logprobs=1, prompt_logprobs=0), LogprobTokens(tokenizer))
    first = torch.tensor([[hello[0], hello[1]]], dtype=torch.int32)  # the prompt's rows in two chunks
    rest = torch.tensor([[t, t] for t in hello[1:]], dtype=torch.int32)
    out.process(EngineCoreOutput("r", [], new_prompt_logprobs_tensors=LogprobsTensors(
        first, torch.tensor([[-1.0, -2.0]]), torch.tensor([3], dtype=torch.int32))))
    delta = out.process(engine_output([[hello[0], hello[1], hello[0]]], [[-0.25, -0.5, -0.25]], [2],
                                      new_prompt_logprobs_tensors=LogprobsTensors(
                                          rest, torch.full((len(rest), 2), -float("inf")),
                                          torch.ones(len(rest), dtype=torch.int32))))
    texts = [tokenizer.decode([t]) for t in hello]
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    assert out.prompt_logprobs[1] == {hello[0]: Logprob(-1.0, 3, texts[0])}
    assert delta.logprobs == out.logprobs == [{hello[0]: Logprob(-0.25, 2, texts[0]), hello[1]: Logprob(-0.5, 1, texts[1])}]
    clamped = clamp_prompt_logprobs(out.prompt_logprobs)
    assert clamped is not None and clamped[2] == {hello[1]: Logprob(-9999.0, 1, texts[1])}
    assert ENCODER.encode(clamped[:2]) == (b'[null,{"%d":{"logprob":-1.0,"rank":3,"decoded_token":%s}}]'
                                           % (hello[0], json.dumps(texts[0]).encode()))
    ignored = ChoiceOutput(make_detokenizer(tokenizer, prompt, skip_special_tokens=True), SamplingParams(),
                           LogprobTokens(tokenizer))  # none asked for: the engine's are not reported
    assert ignored.process(engine_output([[hello[0], hello[0]]], [[-0.25, -0.25]], [1])).logprobs is None


def test_chat_and_completion_shapes() -> None:
    positions: list[Any] = [None, {5: Logprob(-float("inf"), 4, "é"), 6: Logprob(-0.5, 1, "x")},
                            {6: Logprob(-0.5, 1, "x"), 7: Logprob(-0.75, 2, "x")}]
    fmt = LogprobFormat(lambda t: f"<{t}>")
    chat = chat_logprobs([3, 5, 6], positions, 1, fmt)
    assert ENCODER.encode(chat) == (
        b'{"content":[{"token":"<3>","logprob":-9999.0,"bytes":[60,51,62],"top_logprobs":[]},'
        b'{"token":"\xc3\xa9","logprob":-9999.0,"bytes":[195,169],"top_logprobs":[{"token":"\xc3\xa9","logprob":-9999.0,'
        b'"bytes":[195,169]}]},{"token":"x","logprob":-0.5,"bytes":[120],"top_logprobs":[{"token":"x","logprob":-0.5,'
        b'"bytes":[120]}]}]}')
    as_ids = chat_logprobs([5], positions[1:], -1, LogprobFormat(fmt.decode, as_token_ids=True)).content
    assert as_ids is not None and as_ids[0].token == "token_id:5" and as_ids[0].bytes == [195, 169]
    assert [t.token for t in as_ids[0].top_logprobs] == ["token_id:5", "token_id:6"]
    assert as_ids[0].top_logprobs[0].bytes == list(b"token_id:5")
    legacy = completion_logprobs([3, 5, 6], positions, 1, fmt, text_offset=4)
    assert legacy.text_offset == [4, 7, 8] and legacy.tokens == ["<3>", "é", "x"]
    assert legacy.token_logprobs == [None, -9999.0, -0.5]
    assert legacy.top_logprobs == [None, {"é": -9999.0, "x": -0.5}, {"x": -0.75}]  # one text, one entry: the last
    assert completion_logprobs([6], positions[2:], -1, fmt).top_logprobs == [{"x": -0.75}]
    assert completion_logprobs([6], positions[2:], 0, LogprobFormat(fmt.decode, True)).top_logprobs == [
        {"token_id:6": -0.5}]
    assert math.isinf(positions[1][5].logprob)  # the positions themselves are not changed


def test_the_leading_space_marker_is_the_tokenizers_metaspace(tokenizer: Any) -> None:
    config = json.loads(tokenizer.backend_tokenizer.to_str())
    pre = config.get("pre_tokenizer") or {}
    kinds = [p.get("type") for p in (pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre])]
    assert leading_space_marker(tokenizer) == ("▁" if "Metaspace" in kinds else None)


PEER = vllm_peer_python()
PEER_MODEL = None if PEER is None else vllm_peer_model_dir(PEER)
SPLIT_TEXT = "Hello wörld ☃ 日本 — naïve café 🎉🐱 end"

VLLM_TEXTS = """
import json, sys
import numpy as np
from vllm.tokenizers import get_tokenizer
from vllm.v1.engine.logprobs import LogprobsProcessor
from vllm.v1.outputs import LogprobsLists
tok = get_tokenizer(sys.argv[1])
rows = json.loads(sys.argv[2])
proc = LogprobsProcessor(tok, [], None, 0.0, 2, None)
for row in rows:
    proc._update_sample_logprobs(LogprobsLists(np.array([row]), np.array([[-0.5] * len(row)]), np.array([1]), None))
print(json.dumps([[[t, lp.decoded_token, lp.rank] for t, lp in pos.items()] for pos in proc.logprobs]))
"""


@pytest.mark.skipif(PEER is None or PEER_MODEL is None, reason="no vLLM 0.33 peer venv")
def test_candidate_texts_equal_vllms_for_characters_split_across_tokens() -> None:
    assert PEER is not None and PEER_MODEL is not None
    tokenizer = AutoTokenizer.from_pretrained(PEER_MODEL)
    ids = tokenizer.encode(SPLIT_TEXT, add_special_tokens=False)
    rows = [[t, t, ids[(i + 1) % len(ids)]] for i, t in enumerate(ids)]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run([str(PEER), "-c", VLLM_TEXTS, str(PEER_MODEL), json.dumps(rows)], capture_output=True,
                          text=True, env=env, timeout=300, check=True)
    want = json.loads(done.stdout.strip().splitlines()[-1])
    out = ChoiceOutput(make_detokenizer(tokenizer, [2], skip_special_tokens=True), SamplingParams(logprobs=2),
                       LogprobTokens(tokenizer))
    for row in rows:
        out.process(engine_output([row], [[-0.5] * 3], [1]))
    got = [[[t, lp.decoded_token, lp.rank] for t, lp in pos.items()] for pos in out.logprobs]
    assert got == want
    assert any(text == "" for pos in got for _, text, _ in pos)  # a character's first bytes: no text yet


def test_logprob_token_ids_give_each_named_token(tokenizer: Any) -> None:
    named = tokenizer.encode("Hello world", add_special_tokens=False)[:2]
    out = ChoiceOutput(make_detokenizer(tokenizer, [2], skip_special_tokens=True),
                       SamplingParams(logprob_token_ids=named), LogprobTokens(tokenizer))
    assert out.num_logprobs == 2
    sampled = named[1]
    delta = out.process(engine_output([[sampled, *named, sampled]], [[-0.5, -1.0, -0.5, -0.5]], [1]))
    assert delta.logprobs is not None and list(delta.logprobs[0]) == [sampled, named[0]]  # the row's width is 3
    [entry] = chat_logprobs([sampled], delta.logprobs, -1, LogprobFormat(str)).content or []
    assert [t.logprob for t in entry.top_logprobs] == [-0.5, -1.0]
