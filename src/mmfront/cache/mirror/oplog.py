"""The mirror's op log and digest chain: what each side records per request, and how it is hashed.

Per request, both sides log what happened to each item in their LRU, in placeholder-offset order:
a hit, an insert (followed by the keys it evicted) or an oversize skip. P0 closes its log into the
request's stamp; P1 logs its own while it applies the request, and the two agree exactly when
their digests do. The digest chains every request of an epoch: each link hashes the previous
one, the keys P0 invalidated since the previous stamp, and the request's log.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

import msgspec

from mmfront.wire.messages import DIGEST_SIZE, MirrorOp, MirrorOpKind

HIT: Final = MirrorOpKind.HIT.value
INSERT: Final = MirrorOpKind.INSERT.value
OVERSIZE: Final = MirrorOpKind.OVERSIZE.value
EVICT: Final = "E"
"""A key an insert evicted. Logged, never sent: each side derives it from its own LRU, which is
what the digest checks."""

_encode = msgspec.msgpack.Encoder().encode


def initial_digest(epoch: int, capacity_bytes: int) -> bytes:
    """The chain's start. The capacity is part of it because two LRUs of different capacities
    cannot mirror each other: a misconfigured pair disagrees at its very first request."""
    seed = epoch.to_bytes(8, "little") + capacity_bytes.to_bytes(8, "little")
    return hashlib.blake2b(seed, digest_size=DIGEST_SIZE).digest()


def chain_digest(previous: bytes, invalidated: Sequence[str], ops: Sequence[str]) -> bytes:
    """The next link of an epoch's digest chain: ``ops`` alternates kinds and keys."""
    return hashlib.blake2b(previous + _encode((invalidated, ops)), digest_size=DIGEST_SIZE).digest()


class OpLog:
    """One request's mirror operations, in the order they happened (two list appends per item:
    the hit path stays a handful of list and dict operations)."""

    __slots__ = ("ops", "sizes")

    def __init__(self) -> None:
        self.ops: list[str] = []
        """Kinds and keys, alternating: what the digest hashes."""
        self.sizes: list[int] = []
        """What each insert charged, in order: what a mirror-only message replays."""

    def __bool__(self) -> bool:
        return bool(self.ops)

    def hit(self, key: str) -> None:
        ops = self.ops
        ops.append(HIT)
        ops.append(key)

    def oversize(self, key: str) -> None:
        ops = self.ops
        ops.append(OVERSIZE)
        ops.append(key)

    def insert(self, key: str, nbytes: int, evicted: Sequence[str]) -> None:
        ops = self.ops
        ops.append(INSERT)
        ops.append(key)
        self.sizes.append(nbytes)
        for old in evicted:
            ops.append(EVICT)
            ops.append(old)

    def digest(self, previous: bytes, invalidated: Sequence[str]) -> bytes:
        """The chain's next link after ``previous``."""
        return chain_digest(previous, invalidated, self.ops)

    def mirror_ops(self) -> list[MirrorOp]:
        """The log as a mirror-only message carries it: the evictions left out, which P1's own
        LRU repeats when it replays the inserts."""
        out: list[MirrorOp] = []
        sizes = iter(self.sizes)
        ops = self.ops
        for i in range(0, len(ops), 2):
            kind, key = ops[i], ops[i + 1]
            if kind == INSERT:
                out.append(MirrorOp(MirrorOpKind.INSERT, key, next(sizes)))
            elif kind != EVICT:
                out.append(MirrorOp(MirrorOpKind(kind), key))
        return out


__all__ = ["EVICT", "HIT", "INSERT", "OVERSIZE", "OpLog", "chain_digest", "initial_digest"]
