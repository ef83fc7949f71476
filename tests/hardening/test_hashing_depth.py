"""Hashing nested values: a bounded depth and a typed error, never a RecursionError."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront.errors import ValidationError
from mmfront.hashing import MAX_VALUE_DEPTH, MultiModalHasher, get_mm_hashes


def nested(kinds: list[str], leaf: object = 1) -> object:
    """``leaf`` inside one container per entry of ``kinds`` (outermost first), built without recursion."""
    value: Any = leaf
    for kind in reversed(kinds):
        value = {"k": value} if kind == "dict" else [value] if kind == "list" else (value,)
    return value


def test_ten_thousand_deep_processor_kwargs_are_a_typed_error() -> None:
    deep = nested(["dict"] * 10_000)
    with pytest.raises(ValidationError, match=rf"^mm_processor_kwargs nests lists and mappings more than "
                                              rf"{MAX_VALUE_DEPTH} levels deep") as caught:
        get_mm_hashes({"image": [b"img"]}, "model", "blake3", hf_processor_mm_kwargs={"images_kwargs": deep})
    assert caught.value.parameter == "mm_processor_kwargs"


def test_ten_thousand_deep_media_io_kwargs_are_a_typed_error() -> None:
    deep = nested(["list"] * 10_000)
    with pytest.raises(ValidationError, match=r"^media_io_kwargs nests") as caught:
        get_mm_hashes({"image": [b"img"]}, "model", "sha256", media_io_kwargs={"image": {"x": deep}})
    assert caught.value.parameter == "media_io_kwargs"


def test_a_list_that_contains_itself_is_a_typed_error() -> None:
    loop: list[object] = []
    loop.append(loop)
    with pytest.raises(ValidationError, match=r"^The value nests lists and mappings") as caught:
        list(MultiModalHasher.iter_value_to_bytes(loop))
    assert caught.value.parameter is None


def test_the_limit_is_exact() -> None:
    MultiModalHasher.hash_kwargs("blake3", x=nested(["list"] * MAX_VALUE_DEPTH))
    with pytest.raises(ValidationError) as caught:
        MultiModalHasher.hash_kwargs("blake3", x=nested(["list"] * (MAX_VALUE_DEPTH + 1)))
    assert caught.value.parameter == "x"


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 3 * MAX_VALUE_DEPTH).flatmap(
           lambda depth: st.lists(st.sampled_from(["dict", "list", "tuple"]), min_size=depth, max_size=depth)),
       st.sampled_from([1, "s", b"b", 2.5, None]))
def test_nesting_hashes_up_to_the_limit_and_is_refused_beyond(kinds: list[str], leaf: object) -> None:
    value = nested(kinds, leaf)
    if len(kinds) <= MAX_VALUE_DEPTH:
        digest = MultiModalHasher.hash_kwargs("blake3", mm_processor_kwargs=value)
        assert digest == MultiModalHasher.hash_kwargs("blake3", mm_processor_kwargs=nested(kinds, leaf))
        assert len(digest) == 64
    else:
        with pytest.raises(ValidationError) as caught:
            MultiModalHasher.hash_kwargs("blake3", mm_processor_kwargs=value)
        assert caught.value.parameter == "mm_processor_kwargs"
