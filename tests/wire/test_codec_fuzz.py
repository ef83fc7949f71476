"""Fuzzing the decoder: 10,000 mutated messages end only in a decoded object or a DecodeError,
and decoding them never allocates more than a bounded amount of memory."""

from __future__ import annotations

import random
import re
import resource
import sys
from collections import Counter
from typing import Any

import msgspec
import numpy as np
import torch
from msgspec import msgpack

from mmfront.errors import DecodeError
from mmfront.inputs import (
    MultiModalBatchedField,
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalFlatField,
    MultiModalKwargsItem,
    MultiModalKwargsItems,
    MultiModalSharedField,
    PlaceholderRange,
)
from mmfront.wire.codec import MsgpackDecoder, MsgpackEncoder

SEED = 1234
CASES = 10_000
MAX_GROWTH_MB = 64


class Request(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    request_id: str
    prompt_token_ids: list[int] | None
    mm_features: list[MultiModalFeatureSpec] | None
    arrival_time: float = 0.0
    prompt_embeds: torch.Tensor | None = None


class Bag(msgspec.Struct):
    tensors: list[torch.Tensor]
    arrays: list[np.ndarray]


def _item() -> MultiModalKwargsItem:
    return MultiModalKwargsItem({
        "pixel_values": MultiModalFieldElem(torch.arange(96, dtype=torch.float32).reshape(2, 3, 16),
                                            MultiModalBatchedField()),
        "grid": MultiModalFieldElem(torch.tensor([[1, 2, 2]]), MultiModalSharedField(batch_size=2)),
        "embeds": MultiModalFieldElem([torch.ones(2, 3, dtype=torch.bfloat16), 4, 0.5],
                                      MultiModalFlatField(slices=[(slice(None), slice(0, 3, 1))], dim=1)),
        "mask": MultiModalFieldElem(torch.tensor([True, False]), MultiModalFlatField(slices=[slice(0, 2)],
                                                                                     keep_on_cpu=True)),
    })


def base_messages() -> list[tuple[Any, list[bytes]]]:
    """(decode type, frames) of the messages the mutations start from."""
    encoder = MsgpackEncoder(size_threshold=64)
    item = _item()
    feature = MultiModalFeatureSpec(item, "image", "lora:h1", PlaceholderRange(3, 4, torch.tensor([0, 1, 1, 0]).bool()),
                                    "h1")
    cached = MultiModalFeatureSpec(None, "audio", "h2", PlaceholderRange(9, 2), "h2")
    objects: list[tuple[Any, Any]] = [
        (MultiModalKwargsItem, item),
        (MultiModalFeatureSpec, feature),
        (Request, Request("r", [1, 2, 3], [feature, cached], 1.5, torch.zeros(4, 20))),
        (MultiModalKwargsItems, MultiModalKwargsItems({"image": [item, None]})),
        (Bag, Bag([torch.arange(40, dtype=torch.int16), torch.empty(0, 2), torch.tensor(3.0)],
                  [np.arange(30, dtype="<f8").reshape(5, 6), np.array(True), np.zeros((2, 0), dtype="<c8")])),
    ]
    return [(t, [bytes(memoryview(f).cast("B")) for f in encoder.encode(obj)]) for t, obj in objects]


INTERESTING_INTS = [-(2**63), -(2**31), -1, 0, 1, 2, 3, 4, 7, 16, 17, 255, 256, 2**31, 2**40, 2**62, 2**63 - 1, 2**64 - 1]
INTERESTING_STRS = ["float32", "bfloat16", "bool", "qint8", "<f4", "|O8", "|V4", "<U0", "i4,f8", "flat", "shared",
                    "batched", "pickle", "data", "field", "slices", "dim", "batch_size", "keep_on_cpu", ""]


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(9)
    if kind == 0:
        return rng.choice(INTERESTING_INTS)
    if kind == 1:
        return rng.choice(INTERESTING_STRS)
    if kind == 2:
        return rng.choice([None, True, False, 0.5, float("nan"), -0.0])
    if kind == 3:
        return msgpack.Ext(rng.choice([1, 2, 3, 3, 3, 9, -1]), rng.randbytes(rng.choice([0, 1, 4, 8, 16, 300])))
    if kind == 4 and depth < 3:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 5 and depth < 3:
        return {rng.choice(INTERESTING_STRS): _random_value(rng, depth + 1) for _ in range(rng.randrange(3))}
    if kind == 6:
        return [rng.choice(INTERESTING_STRS[:7]), [rng.choice(INTERESTING_INTS) for _ in range(rng.randrange(4))],
                rng.choice([*INTERESTING_INTS[:8], msgpack.Ext(3, rng.randbytes(rng.randrange(64)))])]
    if kind == 7:
        value: Any = 0
        for _ in range(rng.choice([10, 40, 400])):
            value = [value]
        return value
    return rng.randrange(-1000, 1000)


def _containers(obj: Any, out: list[Any]) -> list[Any]:
    if isinstance(obj, (list, dict)):
        out.append(obj)
        for child in obj.values() if isinstance(obj, dict) else obj:
            _containers(child, out)
    return out


def _triples(containers: list[Any]) -> list[list[Any]]:
    return [c for c in containers if isinstance(c, list) and len(c) == 3 and isinstance(c[0], str)
            and isinstance(c[1], list)]


def _mutate_structure(rng: random.Random, body: bytes) -> bytes:
    """Rewrite one part of the decoded body (a shape, an aux index, a dtype, any value) and re-encode."""
    try:
        tree = msgpack.decode(body, ext_hook=lambda code, data: msgpack.Ext(code, bytes(data)))
    except msgspec.DecodeError:  # an earlier mutation already broke the body
        return body
    for _ in range(rng.randint(1, 3)):
        containers = _containers(tree, [])
        triples = _triples(containers)
        choice = rng.randrange(4)
        if choice == 0 and triples:  # a shape entry
            shape = rng.choice(triples)[1]
            if shape:
                shape[rng.randrange(len(shape))] = rng.choice(INTERESTING_INTS)
            else:
                shape.append(rng.choice(INTERESTING_INTS))
        elif choice == 1 and triples:  # the data slot: an aux index or inline bytes
            triple = rng.choice(triples)
            triple[2] = rng.choice([*INTERESTING_INTS[:12], True, msgpack.Ext(3, rng.randbytes(rng.randrange(40)))])
        elif choice == 2 and triples:  # the dtype
            rng.choice(triples)[0] = rng.choice(INTERESTING_STRS)
        elif containers:  # anything anywhere
            target = rng.choice(containers)
            if isinstance(target, dict) and target:
                key = rng.choice(list(target))
                if rng.random() < 0.2:
                    target[rng.choice(INTERESTING_STRS)] = target.pop(key)
                else:
                    target[key] = _random_value(rng)
            elif isinstance(target, list) and target:
                op = rng.randrange(3)
                if op == 0:
                    target[rng.randrange(len(target))] = _random_value(rng)
                elif op == 1:
                    del target[rng.randrange(len(target))]
                else:
                    target.insert(rng.randrange(len(target) + 1), _random_value(rng))
    return msgpack.encode(tree)


def mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    frames = list(frames)
    for _ in range(rng.randint(1, 2)):
        op = rng.randrange(10)
        i = rng.randrange(len(frames))
        f = bytearray(frames[i])
        if op <= 1 and f:  # bit flips
            for _ in range(rng.randint(1, 8)):
                pos = rng.randrange(len(f))
                f[pos] ^= 1 << rng.randrange(8)
            frames[i] = bytes(f)
        elif op == 2 and f:  # a byte set to a random value (hits type tags and lengths)
            f[rng.randrange(len(f))] = rng.randrange(256)
            frames[i] = bytes(f)
        elif op == 3:  # truncation
            frames[i] = bytes(f[: rng.randrange(len(f) + 1)])
        elif op == 4:  # extension
            frames[i] = bytes(f) + rng.randbytes(rng.choice([1, 4, 100]))
        elif op == 5 and len(frames) > 1:  # swapped frames
            j = rng.randrange(len(frames))
            frames[i], frames[j] = frames[j], frames[i]
        elif op == 6:  # a frame dropped or duplicated
            if rng.random() < 0.5 and len(frames) > 1:
                del frames[i]
            else:
                frames.insert(rng.randrange(len(frames) + 1), frames[i])
        elif op == 7:  # a random frame
            frames[i] = rng.randbytes(rng.randrange(64))
        else:
            frames[0] = _mutate_structure(rng, frames[0])
    return frames


def _kind(error: DecodeError) -> str:
    """The check that rejected a message: its error text without numbers, paths and quoted values."""
    text = str(error).removeprefix("Malformed message: ").split(" - at ")[0]
    return re.sub(r"'[^']*'|\d+|\[.*\]", "_", text)[:48]


def _max_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def test_mutated_messages_decode_or_raise_decode_error_with_bounded_memory() -> None:
    rng = random.Random(SEED)
    bases = base_messages()
    decoders = {(t, share): MsgpackDecoder(t, share_mem=share) for t, _ in bases for share in (True, False)}
    untyped = MsgpackDecoder()
    outcomes: Counter[str] = Counter()
    unexpected: list[str] = []
    before = _max_rss_mb()
    for case in range(CASES):
        t, frames = bases[case % len(bases)]
        mutated = [bytearray(f) for f in mutate(rng, frames)]
        decoder = untyped if case % 10 == 9 else decoders[t, rng.random() < 0.5]
        try:
            decoder.decode(mutated)
            outcomes["decoded"] += 1
        except DecodeError as e:
            outcomes[_kind(e)] += 1
        except BaseException as e:  # anything but DecodeError is a bug
            unexpected.append(f"case {case}: {type(e).__name__}: {e}")
    growth = _max_rss_mb() - before
    assert unexpected == [], unexpected[:5]
    assert growth < MAX_GROWTH_MB, f"peak RSS grew by {growth:.1f} MB"
    # The mutations reached both outcomes and many distinct checks, or the test proves nothing.
    assert outcomes["decoded"] > 500
    assert sum(outcomes.values()) - outcomes["decoded"] > 5000
    assert len(outcomes) > 50, outcomes


def test_every_base_message_decodes() -> None:
    for t, frames in base_messages():
        assert MsgpackDecoder(t).decode([bytearray(f) for f in frames]) is not None
