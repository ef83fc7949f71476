"""Prefix-cache block keys of a request, by vLLM 0.33's rules (``v1/core/kv_cache_utils.py``).

A block's key chains its parent's key, its token ids and its *extra keys*: ``("lora", name,
path)`` on every block of a LoRA request, ``("mm", identifier, offset - block start)`` for every
multimodal item overlapping the block (negative when the item began in an earlier block),
``("cache_salt", salt)`` on the first block only, and ``("prompt_embeds", sha256)`` of the block's
embeddings. Two requests share a block's key only if they share everything before and in it.

vLLM's default hashes a pickle of the tuple with SHA-256; mmfront hashes a canonical
msgpack encoding instead (no pickle, stable across Python versions), so the structure and the
collision properties are vLLM's while the digests are mmfront's own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Final

import msgspec

from mmfront.errors import ConfigError, ValidationError
from mmfront.inputs import MultiModalFeatureSpec
from mmfront.wire import tensor_bytes
from mmfront.wire.structs import EngineCoreRequest

ExtraKeys = tuple[tuple[Any, ...], ...]

NONE_HASH: Final = hashlib.sha256(b"mmfront prefix-cache root").digest()
"""The parent of a request's first block (vLLM draws its own at random per process)."""

_canonical = msgspec.msgpack.Encoder(order="deterministic").encode


def hash_block_tokens(parent: bytes | None, tokens: Sequence[int], extra_keys: ExtraKeys | None = None) -> bytes:
    """SHA-256 of the canonical msgpack array ``[parent or NONE_HASH, [tokens], extra_keys]``."""
    return hashlib.sha256(_canonical((parent or NONE_HASH, tuple(tokens), extra_keys))).digest()


def _mm_keys(features: Sequence[MultiModalFeatureSpec], start: int, end: int, mm_idx: int) -> tuple[list[Any], int]:
    """The items overlapping ``[start, end)``, from ``mm_idx`` on (features sorted by offset), and
    the index the next block starts from: past every item that ends inside this block."""
    keys: list[Any] = []
    while mm_idx < len(features):
        position = features[mm_idx].mm_position
        if end <= position.offset:
            break
        if start >= position.offset + position.length:
            mm_idx += 1
            continue
        keys.append(("mm", features[mm_idx].identifier, position.offset - start))
        if end < position.offset + position.length:
            break
        mm_idx += 1
    return keys, mm_idx


def block_extra_keys(request: EngineCoreRequest, start: int, end: int, mm_idx: int = 0) -> tuple[ExtraKeys | None, int]:
    """The extra keys of the block ``[start, end)`` (``None`` when it has none) and the feature
    index the next block starts from; ``mm_idx`` is where this block's search starts."""
    mm_keys, next_idx = _mm_keys(request.mm_features or (), start, end, mm_idx)
    lora = request.lora_request
    keys: list[Any] = [("lora", lora.lora_name, lora.lora_path)] if lora else []
    keys += mm_keys
    if start == 0 and request.cache_salt:
        keys.append(("cache_salt", request.cache_salt))
    if request.prompt_embeds is not None:
        block = tensor_bytes(request.prompt_embeds[start:end])
        keys.append(("prompt_embeds", hashlib.sha256(block).digest()))
    return (tuple(keys) if keys else None), next_idx


def request_block_hashes(request: EngineCoreRequest, block_size: int) -> list[bytes]:
    """The keys of every full block of the request's prompt, first block first."""
    if block_size < 1:
        raise ConfigError(f"block_size must be at least 1, got {block_size}.")
    features = request.mm_features or []
    offsets = [f.mm_position.offset for f in features]
    if offsets != sorted(offsets):
        raise ValidationError("mm_features must be sorted by placeholder offset.", parameter="mm_features")
    tokens = request.prompt_token_ids
    if tokens is None:
        tokens = [0] * (0 if request.prompt_embeds is None else len(request.prompt_embeds))
    hashes: list[bytes] = []
    parent: bytes | None = None
    mm_idx = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        extra, mm_idx = block_extra_keys(request, start, start + block_size, mm_idx)
        parent = hash_block_tokens(parent, tokens[start:start + block_size], extra)
        hashes.append(parent)
    return hashes


__all__ = ["NONE_HASH", "ExtraKeys", "block_extra_keys", "hash_block_tokens", "request_block_hashes"]
