"""Issue 22, class 8: a uuid cannot be forged into another tenant's key.

A salted request's uuid ``u`` is keyed ``sha256(salt)[:32] + ":" + u``. A request *without* a
salt used its uuid verbatim (vLLM's rule), so it could name that very string and receive the
salted tenant's item. Salted keys now live in a namespace of their own: an unsalted uuid of that
shape is refused with a typed error, and every other unsalted uuid is still vLLM's verbatim key.
"""

from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront import MultiModalConfig
from mmfront.errors import ValidationError
from mmfront.hashing import get_mm_hashes, scope_uuids
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import make_image
from toy_models import toy

GiB = 1 << 30
IMAGE = make_image(6, 4, seed=1)
SALTED_KEY = re.compile(r"[0-9a-f]{32}:")


def _salt_prefix(salt: str) -> str:
    return hashlib.sha256(salt.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _processor() -> InputProcessor:
    config = MultiModalConfig(mm_processor_cache_gb=64 / 1024)
    return InputProcessor(InputPreprocessor("toy", config, processor=toy(config)))


@pytest.mark.parametrize("salt", ["alice", "", "tenant-42", "\u00e9t\u00e9"])
def test_an_unsalted_request_cannot_name_a_salted_tenants_item(salt: str) -> None:
    processor = _processor()
    alice = processor.prepare("alice", "a <img>", mm_data={"image": [IMAGE]}, mm_uuids={"image": ["photo"]},
                              cache_salt=salt)
    key = alice.inputs["mm_hashes"]["image"][0]
    assert key == f"{_salt_prefix(salt)}:photo"
    processor.commit(alice)
    with pytest.raises(ValidationError, match="reserved for requests with a cache_salt") as info:
        processor.prepare("mallory", "a <img>", mm_data={"image": [None]}, mm_uuids={"image": [key]})
    assert info.value.parameter == "multi_modal_uuids"
    # With the data too, the forged key is refused (it would overwrite nothing, but names alice's key).
    with pytest.raises(ValidationError, match="reserved for requests with a cache_salt"):
        processor.prepare("mallory", "a <img>", mm_data={"image": [IMAGE]}, mm_uuids={"image": [key]})
    # Another salt never reaches it either: its keys carry its own prefix.
    with pytest.raises(ValidationError, match="data is not provided"):
        processor.prepare("eve", "a <img>", mm_data={"image": [None]}, mm_uuids={"image": [key]},
                          cache_salt="eve")
    # Alice, same salt, still gets her item back by uuid alone.
    again = processor.prepare("alice-2", "a <img>", mm_data={"image": [None]}, mm_uuids={"image": ["photo"]},
                              cache_salt=salt)
    assert again.inputs["mm_hashes"]["image"] == [key]


def test_forged_keys_in_a_bare_string_and_among_several_uuids_are_refused() -> None:
    forged = f"{_salt_prefix('alice')}:photo"
    for uuids in ({"image": forged}, {"image": ["mine", forged]}, {"audio": [None, forged]}):
        with pytest.raises(ValidationError, match="reserved for requests with a cache_salt"):
            scope_uuids(uuids, None)


def test_unsalted_uuids_are_still_vllms_verbatim_keys() -> None:
    """Only the reserved shape changes: other uuids (even near misses) are the key, unhashed."""
    near = ["photo", "0123456789abcdef0123456789abcdef", "0123456789ABCDEF0123456789ABCDEF:x",
            "0123456789abcdef0123456789abcde:x", "x0123456789abcdef0123456789abcdef:x", "a:b:c"]
    assert scope_uuids({"image": near}, None) == {"image": near}
    hashes = get_mm_hashes({"image": [None] * len(near)}, "m", "blake3", mm_uuids={"image": near})
    assert hashes == {"image": near}


@settings(max_examples=300, deadline=None)
@given(salt=st.text(max_size=12), other=st.one_of(st.none(), st.text(max_size=12)),
       uuid=st.text(max_size=16), mine=st.text(max_size=48))
def test_salted_and_unsalted_keys_never_meet(salt: str, other: str | None, uuid: str, mine: str) -> None:
    salted = scope_uuids({"image": [uuid]}, salt)["image"]
    assert isinstance(salted, list) and SALTED_KEY.match(salted[0] or "")
    forged = salted[0]
    if other != salt:
        # Any other tenant (or none) naming the salted key verbatim gets another key, or a refusal.
        try:
            theirs = scope_uuids({"image": [forged]}, other)["image"]
        except ValidationError as exc:
            assert other is None and exc.parameter == "multi_modal_uuids"
        else:
            assert isinstance(theirs, list) and theirs[0] != forged
    try:
        plain = scope_uuids({"image": [mine]}, None)["image"]
    except ValidationError:
        assert SALTED_KEY.match(mine)
    else:
        assert plain == [mine] and not SALTED_KEY.match(mine)
