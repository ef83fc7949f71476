"""Prefix-cache block keys: vLLM 0.33's extra-key rules (its test_kv_cache_utils cases) and the
properties that make the keys safe to share."""

from __future__ import annotations

import hashlib

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront.engine.prefix import NONE_HASH, block_extra_keys, hash_block_tokens, request_block_hashes
from mmfront.errors import ConfigError, ValidationError
from mmfront.inputs import MultiModalFeatureSpec, PlaceholderRange
from mmfront.wire.params import LoRARequest
from mmfront.wire.structs import EngineCoreRequest


def feature(identifier: str, offset: int, length: int) -> MultiModalFeatureSpec:
    return MultiModalFeatureSpec(None, "image", identifier, PlaceholderRange(offset, length), identifier)


def request(
    tokens: list[int] | None = None, features: list[MultiModalFeatureSpec] | None = None, *,
    salt: str | None = None, lora: LoRARequest | None = None, embeds: torch.Tensor | None = None,
) -> EngineCoreRequest:
    tokens = list(range(20)) if tokens is None and embeds is None else tokens
    return EngineCoreRequest("r", tokens, features, None, None, 0.0, lora, salt, None, prompt_embeds=embeds)


TWO_ITEMS = request(features=[feature("hash1", 0, 5), feature("hash2", 10, 5)])


@pytest.mark.parametrize(("start", "end", "keys", "next_idx"), [
    (0, 5, (("mm", "hash1", 0),), 1),                          # the block holds the whole item
    (3, 8, (("mm", "hash1", -3),), 1),                         # the item began before the block
    (6, 10, None, 1),                                          # nothing overlaps
    (0, 15, (("mm", "hash1", 0), ("mm", "hash2", 10)), 2),     # two items in one block
    (12, 14, (("mm", "hash2", -2),), 1),                       # inside an item: the index stays on it
])
def test_extra_keys_as_vllm_test_kv_cache_utils(start: int, end: int, keys: tuple | None, next_idx: int) -> None:
    mm_idx = 1 if start >= 10 else 0
    assert block_extra_keys(TWO_ITEMS, start, end, mm_idx) == (keys, next_idx)


def test_same_item_at_another_offset_in_the_block_gets_another_key() -> None:
    a = request(features=[feature("img", 2, 4)])
    b = request(features=[feature("img", 3, 4)])
    assert block_extra_keys(a, 0, 8)[0] == (("mm", "img", 2),)
    assert request_block_hashes(a, 8) != request_block_hashes(b, 8)


def test_lora_on_every_block_cache_salt_on_the_first_only() -> None:
    r = request(salt="s1", lora=LoRARequest("ad", 1, "/ad"), features=[feature("img", 4, 8)])
    assert block_extra_keys(r, 0, 8)[0] == (("lora", "ad", "/ad"), ("mm", "img", 4), ("cache_salt", "s1"))
    assert block_extra_keys(r, 8, 16, 0)[0] == (("lora", "ad", "/ad"), ("mm", "img", -4))
    assert block_extra_keys(r, 16, 20, 1)[0] == (("lora", "ad", "/ad"),)


def test_prompt_embeds_key_is_the_sha256_of_the_block() -> None:
    embeds = torch.arange(48, dtype=torch.float32).reshape(12, 4)
    keys, _ = block_extra_keys(request(embeds=embeds), 4, 8)
    assert keys == (("prompt_embeds", hashlib.sha256(embeds[4:8].numpy().tobytes()).digest()),)
    assert len(request_block_hashes(request(embeds=embeds), 4)) == 3


def test_block_hash_is_sha256_of_canonical_msgpack() -> None:
    extra = (("mm", "h", 0),)
    want = hashlib.sha256(msgspec.msgpack.encode([NONE_HASH, [1, 2, 3], [["mm", "h", 0]]])).digest()
    assert hash_block_tokens(None, [1, 2, 3], extra) == want
    assert hash_block_tokens(None, [1, 2, 3]) != hash_block_tokens(None, [1, 2, 3], extra)


def test_blocks_chain_and_only_full_blocks_are_hashed() -> None:
    r = request(list(range(10)))
    first, second = request_block_hashes(r, 4)
    assert first == hash_block_tokens(None, [0, 1, 2, 3])
    assert second == hash_block_tokens(first, [4, 5, 6, 7])
    assert request_block_hashes(request(list(range(3))), 4) == []


def test_resumed_chain_equals_block_by_block() -> None:
    r = request(list(range(32)), [feature("a", 2, 3), feature("b", 6, 12), feature("c", 20, 2)], salt="x")
    parent, mm_idx, hashes = None, 0, []
    for start in range(0, 32, 4):
        extra, mm_idx = block_extra_keys(r, start, start + 4, mm_idx)
        parent = hash_block_tokens(parent, list(range(start, start + 4)), extra)
        hashes.append(parent)
    assert request_block_hashes(r, 4) == hashes


def test_bad_arguments_raise_typed_errors() -> None:
    with pytest.raises(ConfigError, match="block_size must be at least 1"):
        request_block_hashes(request(), 0)
    with pytest.raises(ValidationError, match="sorted by placeholder offset") as info:
        request_block_hashes(request(features=[feature("b", 10, 2), feature("a", 0, 2)]), 4)
    assert info.value.parameter == "mm_features"


@settings(max_examples=200, deadline=None)
@given(
    salts=st.lists(st.text(min_size=1, max_size=12), min_size=2, max_size=2, unique=True),
    tokens=st.lists(st.integers(0, 2**31), min_size=1, max_size=24),
    block_size=st.integers(1, 8),
)
def test_two_cache_salts_never_share_a_key(salts: list[str], tokens: list[int], block_size: int) -> None:
    a, b = (request_block_hashes(request(tokens, salt=s), block_size) for s in salts)
    assert len(a) == len(b) == len(tokens) // block_size
    assert not set(a) & set(b)


@settings(max_examples=100, deadline=None)
@given(salt=st.text(max_size=8), tokens=st.lists(st.integers(0, 1000), min_size=4, max_size=16))
def test_salted_and_unsalted_never_share_a_key(salt: str, tokens: list[int]) -> None:
    salted = request_block_hashes(request(tokens, salt=salt), 4)
    plain = request_block_hashes(request(tokens), 4)
    assert (salted == plain) == (salt == "")  # an empty salt is no salt, as in vLLM
