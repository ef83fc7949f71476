"""mmfront -> wire -> ModelRunner gives what ``model.generate`` gives on the HF processor's outputs.

For Gemma 3, Idefics3 and Qwen2-Audio (random float32 weights of the real architectures), a
conversation with a system message, two user turns and two or three items is processed by
mmfront, encoded and decoded as P1 receives it, and run by :class:`ModelRunner`: its greedy
tokens equal ``model.generate(do_sample=False)``'s and its first-step logits match within float
tolerance, whether the items travel with their data or come from P1's processor cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from runner_cases import Family, Item, audio_item, conversation, finish_of, image_item, run, wire_round_trip

from mmfront import InputPreprocessor, InputProcessor
from mmfront.cache import LruKeyReplicatedReceiverCache
from mmfront.engine.runner import ModelRunner
from mmfront.wire import SamplingParams

#: kind -> (its folder fixture, the HF processor's media keyword, the conversation's user turns)
CASES: dict[str, tuple[str, str, list[list[Item]]]] = {
    # at the processor's 32 px: mmfront's native Gemma 3 resize follows HF's torchvision backend,
    # which differs from the fixture's PIL backend by up to one intensity level (docs/processing.md)
    "gemma3": ("gemma3_weights_dir", "images",
               [[image_item(32, 32, 0), image_item(32, 32, 1)], [image_item(32, 32, 2)]]),
    # 64x48 splits into 2x2 tiles plus the global one, 80x24 into 2x1 plus the global one
    "idefics3": ("idefics3_weights_dir", "images", [[image_item(64, 48, 0)], [image_item(80, 24, 1)]]),
    "qwen2_audio": ("qwen2_audio_weights_dir", "audio", [[audio_item(1.0, 0)], [audio_item(0.6, 1)]]),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def family(request: pytest.FixtureRequest) -> tuple[Family, list[list[Item]]]:
    fixture, media_kwarg, turns = CASES[request.param]
    folder: Path = request.getfixturevalue(fixture)
    return Family(request.param, folder, media_kwarg), turns


def test_greedy_tokens_and_first_logits_equal_transformers(family: tuple[Family, list[list[Item]]]) -> None:
    fam, turns = family
    request = fam.request("chat", turns)
    prompt, expected, logits = fam.reference(turns)
    assert request.prompt_token_ids == prompt
    assert len(request.mm_features or []) == sum(len(t) for t in turns)
    assert all(f.data is not None for f in request.mm_features or [])

    runner = ModelRunner(fam.folder)
    assert torch.allclose(runner.prefill_logits(request), logits, rtol=1e-4, atol=1e-4)
    tokens, last = run(runner, [request])["chat"]
    assert tokens == expected
    assert last.finish_reason == finish_of(expected, runner.eos_token_ids)


def test_items_from_the_p1_cache_give_the_same_tokens(family: tuple[Family, list[list[Item]]]) -> None:
    """The second request's items are P0 cache hits sent without data; P1's receiver cache
    (filled by the first request) supplies them to a runner that has never encoded them."""
    fam, turns = family
    pre = InputPreprocessor(fam.folder, fam.config)
    processor = InputProcessor(pre)
    params = SamplingParams(max_tokens=8, temperature=0.0)
    receiver = LruKeyReplicatedReceiverCache(pre.config.mm_processor_cache_bytes)
    sent = []
    for rid in ("first", "again"):
        request = processor.commit(processor.prepare(rid, conversation(turns), params))
        processor.take_stamp(rid)
        sent.append(wire_round_trip(request))
    first, again = sent
    assert all(f.data is not None for f in first.mm_features or [])
    assert all(f.data is None for f in again.mm_features or [])

    receiver.get_and_update_features(first.mm_features or [])
    receiver.get_and_update_features(again.mm_features or [])
    assert all(f.data is not None for f in again.mm_features or [])

    _, expected, logits = fam.reference(turns)
    runner = ModelRunner(fam.folder)
    assert torch.allclose(runner.prefill_logits(again), logits, rtol=1e-4, atol=1e-4)
    tokens, _ = run(runner, [again])["again"]
    assert tokens == expected


def test_requests_prefilled_in_one_step_each_equal_their_own_generate(
    family: tuple[Family, list[list[Item]]],
) -> None:
    """Two conversations admitted together: their items are encoded in one batch, their decode
    steps interleave, and each still gets exactly its own ``generate`` tokens."""
    fam, turns = family
    short = [turns[-1]]
    expected = {"long": fam.reference(turns)[1], "short": fam.reference(short)[1]}
    runner = ModelRunner(fam.folder)
    got = run(runner, [fam.request("long", turns), fam.request("short", short)])
    assert {rid: tokens for rid, (tokens, _) in got.items()} == expected
