"""The msgpack codec: vLLM 0.33's byte format, zero-copy frames, no pickle, strict decoding."""

from __future__ import annotations

import importlib.util
import math
import threading
import warnings
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import msgpack

from mmfront import inputs
from mmfront.errors import ConfigError, DecodeError, EncodeError
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

DATA = Path(__file__).parents[1] / "engine" / "data"


class Bag(msgspec.Struct):
    tensors: list[torch.Tensor] = []
    arrays: list[np.ndarray] = []


class Request(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A small engine request: a positional array on the wire, as vLLM's EngineCoreRequest."""

    request_id: str
    mm_features: list[MultiModalFeatureSpec] | None
    arrival_time: float = 0.0
    prompt_embeds: torch.Tensor | None = None


class VllmEngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Field-for-field mirror of vLLM 0.33's EngineCoreRequest (params and LoRA left untyped)."""

    request_id: str
    prompt_token_ids: list[int] | None
    mm_features: list[MultiModalFeatureSpec] | None
    sampling_params: Any
    pooling_params: Any
    arrival_time: float
    lora_request: Any
    cache_salt: str | None
    data_parallel_rank: int | None
    prompt_embeds: torch.Tensor | None = None
    prompt_is_token_ids: list[bool] | None = None
    client_index: int = 0
    current_wave: int = 0
    priority: int = 0
    trace_headers: dict[str, str] | None = None
    resumable: bool = False
    external_req_id: str | None = None
    reasoning_ended: bool | None = None
    reasoning_parser_kwargs: dict[str, Any] | None = None
    abort_immediately: bool = False
    session_id: str | None = None
    kv_hints: Any = None


def raw(frames: list[Any]) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in frames]


def tensor_bits(t: torch.Tensor) -> bytes:
    """The tensor's bytes in C order, read independently of the codec's own byte view."""
    flat = t.detach().reshape(-1).clone(memory_format=torch.contiguous_format)
    return bytes(flat.view(torch.uint8).numpy()) if flat.numel() else b""


def same_tensor(a: object, b: object) -> bool:
    """Equal dtype, shape and bits (so NaN payloads and -0.0 count)."""
    return (
        isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        and tensor_bits(a) == tensor_bits(b)
    )


def same_array(a: object, b: object) -> bool:
    return (
        isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape
        and a.tobytes() == b.tobytes()
    )


def same_nested(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return same_tensor(a, b)
    if isinstance(a, (list, tuple)):
        return isinstance(b, list) and len(a) == len(b) and all(same_nested(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def same_item(a: MultiModalKwargsItem, b: MultiModalKwargsItem) -> bool:
    return (
        a.keys() == b.keys() and a.nbytes == b.nbytes
        and all(same_nested(a[k].data, b[k].data) and a[k].field == b[k].field for k in a)
    )


def roundtrip(obj: Any, t: Any, *, size_threshold: int = 256, share_mem: bool = True) -> Any:
    return MsgpackDecoder(t, share_mem=share_mem).decode(MsgpackEncoder(size_threshold).encode(obj))


def make_item() -> MultiModalKwargsItem:
    return MultiModalKwargsItem({
        "pixel_values": MultiModalFieldElem(torch.arange(24, dtype=torch.float32).reshape(2, 3, 4),
                                            MultiModalBatchedField()),
        "grid": MultiModalFieldElem(torch.tensor([1, 4, 4]), MultiModalSharedField(batch_size=3, keep_on_cpu=True)),
        "patches": MultiModalFieldElem(
            torch.ones(2, 70, dtype=torch.bfloat16),
            MultiModalFlatField(slices=[(slice(None), slice(0, 70)), (slice(None), slice(70, 140, 1))], dim=1),
        ),
        "sizes": MultiModalFieldElem([torch.tensor([3, 5]), [2, 0.25]], MultiModalFlatField(slices=[slice(1, 3)])),
    })


# --- the byte format ----------------------------------------------------------------------------


def test_small_tensor_is_an_inline_triple() -> None:
    frames = MsgpackEncoder().encode(torch.tensor([1, 2], dtype=torch.int16))
    # fixarray(3): "int16", [2], fixext4(type 3, 01 00 02 00)
    assert raw(frames) == [b"\x93\xa5int16\x91\x02\xd6\x03\x01\x00\x02\x00"]


def test_large_tensor_goes_to_its_own_aux_frame() -> None:
    t = torch.arange(64, dtype=torch.float32)
    frames = MsgpackEncoder().encode(t)
    assert raw(frames) == [b"\x93\xa7float32\x91\x40\x01", tensor_bits(t)]


def test_ndarray_triple_uses_dtype_str() -> None:
    frames = MsgpackEncoder().encode(np.array([1.5], dtype=">f8"))
    assert raw(frames) == [b"\x93\xa3>f8\x91\x01\xd7\x03" + np.array([1.5], dtype=">f8").tobytes()]


@pytest.mark.parametrize(("nbytes", "n_frames"), [(0, 1), (255, 1), (256, 2), (4096, 2)])
def test_threshold_is_strictly_less_than(nbytes: int, n_frames: int) -> None:
    frames = MsgpackEncoder(size_threshold=256).encode(torch.zeros(nbytes, dtype=torch.uint8))
    assert len(frames) == n_frames


def test_zero_d_arrays_are_inline_whatever_the_threshold() -> None:
    frames = MsgpackEncoder(size_threshold=0).encode([np.array(7, dtype="<i8"), np.zeros(1, dtype="<i8")])
    assert len(frames) == 2
    out = MsgpackDecoder(tuple[np.ndarray, np.ndarray]).decode(frames)
    assert same_array(out[0], np.array(7, dtype="<i8"))


def test_frame_count_and_order() -> None:
    big = [torch.full((100,), i, dtype=torch.float32) for i in range(3)]
    small = [torch.tensor([i]) for i in range(4)]
    arrays = [np.full((50, 2), 9, dtype="<i4"), np.zeros(3, dtype="|u1")]
    bag = Bag(tensors=[big[0], small[0], big[1], small[1], small[2], big[2], small[3]], arrays=arrays)
    frames = MsgpackEncoder().encode(bag)
    assert len(frames) == 1 + 3 + 1
    assert raw(frames)[1:] == [tensor_bits(big[0]), tensor_bits(big[1]), tensor_bits(big[2]), arrays[0].tobytes()]
    body = msgpack.decode(frames[0])
    assert [t[2] for t in body["tensors"] if isinstance(t[2], int)] == [1, 2, 3]
    assert body["arrays"][0][2] == 4


def test_non_contiguous_sources_are_copied_once_into_c_order() -> None:
    t = torch.arange(300, dtype=torch.int16).reshape(10, 30).t()
    a = np.asfortranarray(np.arange(300, dtype="<f8").reshape(10, 30))
    frames = MsgpackEncoder().encode([t, a])
    assert raw(frames)[1:] == [t.contiguous().numpy().tobytes(), np.ascontiguousarray(a).tobytes()]


def test_mm_item_layout_matches_vllm_field_map() -> None:
    item = MultiModalKwargsItem({
        "a": MultiModalFieldElem(torch.tensor([1], dtype=torch.uint8), MultiModalFlatField(slices=[slice(0, 1)])),
        "b": MultiModalFieldElem(2.5, MultiModalSharedField(batch_size=2)),
    })
    body = msgpack.decode(MsgpackEncoder().encode(item)[0], ext_hook=lambda code, data: (code, bytes(data)))
    assert body == {
        "a": {"data": ["uint8", [1], (3, b"\x01")],
              "field": ["flat", {"keep_on_cpu": False, "slices": [[0, 1, None]], "dim": 0}]},
        "b": {"data": 2.5, "field": ["shared", {"keep_on_cpu": False, "batch_size": 2}]},
    }


def test_placeholder_range_encodes_only_its_fields() -> None:
    pr = PlaceholderRange(3, 4, is_embed=torch.tensor([False, True, True, False]))
    assert pr.get_num_embeds() == 2  # fills the embeds_cumsum cache, which must not travel
    body = msgpack.decode(MsgpackEncoder().encode(pr)[0], ext_hook=lambda code, data: (code, bytes(data)))
    assert body == {"offset": 3, "length": 4, "is_embed": ["bool", [4], (3, b"\x00\x01\x01\x00")]}


def test_encode_into_reuses_the_buffer() -> None:
    encoder = MsgpackEncoder()
    buf = bytearray(b"stale bytes that must go")
    item = make_item()
    frames = encoder.encode_into(item, buf)
    assert frames[0] is buf
    assert raw(frames) == raw(encoder.encode(item))
    assert same_item(MsgpackDecoder(MultiModalKwargsItem).decode(frames), item)


# --- zero copy ----------------------------------------------------------------------------------


def test_aux_frames_alias_the_source_and_share_mem_aliases_the_frame() -> None:
    src = torch.zeros(1000, dtype=torch.float32)
    frames = MsgpackEncoder().encode(src)
    src[0] = 1.0  # after encode, before decode: the frame is the tensor's memory
    shared = MsgpackDecoder(torch.Tensor, share_mem=True).decode(frames)
    copied = MsgpackDecoder(torch.Tensor, share_mem=False).decode(frames)
    assert shared[0] == 1.0 and copied[0] == 1.0
    src[1] = 2.0  # after decode: only the shared tensor sees it
    assert shared[1] == 2.0
    assert copied[1] == 0.0
    assert shared.data_ptr() == src.data_ptr()


def test_aux_ndarrays_share_memory_only_with_share_mem() -> None:
    src = np.zeros(100, dtype="<f8")
    frames = MsgpackEncoder().encode(src)
    shared = MsgpackDecoder(np.ndarray, share_mem=True).decode(frames)
    copied = MsgpackDecoder(np.ndarray, share_mem=False).decode(frames)
    src[5] = 3.0
    assert shared[5] == 3.0
    assert copied[5] == 0.0
    assert copied.flags.writeable and not np.shares_memory(copied, src)


def test_inline_tensors_are_always_copied() -> None:
    body = bytearray(MsgpackEncoder().encode(torch.tensor([1, 2, 3], dtype=torch.int32))[0])
    out = MsgpackDecoder(torch.Tensor, share_mem=True).decode([body])
    body[:] = b"\x00" * len(body)
    assert out.tolist() == [1, 2, 3]


def test_read_only_frames_copy_without_warning() -> None:
    frames = [bytes(f) for f in MsgpackEncoder().encode(torch.arange(100))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = MsgpackDecoder(torch.Tensor, share_mem=False).decode(frames)
    assert out.tolist() == list(range(100))


# --- round trips --------------------------------------------------------------------------------

TENSOR_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
                 torch.bfloat16, torch.float32, torch.float64, torch.complex64]
ARRAY_DTYPES = ["|b1", "|u1", "|i1", "<i2", ">i4", "<i8", "<u8", "<f2", "<f4", ">f8", "<c8", "<c16", "<M8[ns]"]


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    """Any dtype, random bit patterns (NaNs and infs included), any of four memory layouts."""
    dtype = draw(st.sampled_from(TENSOR_DTYPES))
    shape = draw(st.lists(st.integers(0, 4), max_size=4))
    layout = draw(st.sampled_from(["c", "f", "step"] if shape else ["c"]))
    base_shape = [shape[0] * 2, *shape[1:]] if layout == "step" else shape[::-1] if layout == "f" else shape
    n = math.prod(base_shape) * dtype.itemsize
    data = bytearray(draw(st.binary(min_size=n, max_size=n)))
    if dtype is torch.bool:
        data = bytearray(b & 1 for b in data)
    base = (torch.frombuffer(data, dtype=torch.uint8) if n else torch.empty(0, dtype=torch.uint8))
    base = base.view(dtype).reshape(base_shape)
    if layout == "f":
        return base.permute(*reversed(range(base.ndim)))
    return base[::2] if layout == "step" else base


@st.composite
def arrays(draw: st.DrawFn) -> np.ndarray:
    dtype = np.dtype(draw(st.sampled_from(ARRAY_DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
    n = math.prod(shape) * dtype.itemsize
    data = draw(st.binary(min_size=n, max_size=n))
    if dtype.kind == "b":
        data = bytes(b & 1 for b in data)
    array = np.frombuffer(data, dtype=dtype).reshape(shape)
    layout = draw(st.sampled_from(["c", "f", "step"] if shape else ["c"]))
    if layout == "f":
        return np.asfortranarray(array)
    return array[::2] if layout == "step" else array


nested_data = st.recursive(
    tensors() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False),
    lambda children: st.lists(children, max_size=3) | st.lists(children, max_size=3).map(tuple),
    max_leaves=6,
)

thresholds = st.sampled_from([0, 1, 64, 256, 1 << 30])

HYPO = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@HYPO
@given(st.lists(tensors(), max_size=4), st.lists(arrays(), max_size=4), thresholds, st.booleans())
def test_tensors_and_arrays_roundtrip_bitwise(ts: list[torch.Tensor], arrs: list[np.ndarray], threshold: int,
                                              share_mem: bool) -> None:
    out = roundtrip(Bag(ts, arrs), Bag, size_threshold=threshold, share_mem=share_mem)
    assert len(out.tensors) == len(ts) and all(same_tensor(a, b) for a, b in zip(ts, out.tensors))
    assert len(out.arrays) == len(arrs) and all(same_array(a, b) for a, b in zip(arrs, out.arrays))


@HYPO
@given(st.lists(st.lists(tensors(), max_size=3), max_size=3), thresholds)
def test_nested_tensor_lists_roundtrip(nested: list[list[torch.Tensor]], threshold: int) -> None:
    out = roundtrip(nested, list[list[torch.Tensor]], size_threshold=threshold)
    assert same_nested(nested, out)


@HYPO
@given(nested_data, st.sampled_from(["batched", "flat", "shared"]), thresholds, st.booleans())
def test_item_data_roundtrips(data: Any, kind: str, threshold: int, keep_on_cpu: bool) -> None:
    field = {
        "batched": MultiModalBatchedField(keep_on_cpu=keep_on_cpu),
        "flat": MultiModalFlatField(slices=[(slice(None), slice(2, None, 3)), ()], dim=1, keep_on_cpu=keep_on_cpu),
        "shared": MultiModalSharedField(batch_size=5, keep_on_cpu=keep_on_cpu),
    }[kind]
    item = MultiModalKwargsItem({"x": MultiModalFieldElem(data, field)})
    assert same_item(item, roundtrip(item, MultiModalKwargsItem, size_threshold=threshold))


def test_bfloat16_special_values_keep_their_bits() -> None:
    bits = torch.from_numpy(np.array([0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81, 0x0001, 0x8000, 0x3F80], "<u2").view("<i2"))
    t = bits.view(torch.bfloat16)
    for threshold in (0, 1 << 20):
        out = roundtrip(t, torch.Tensor, size_threshold=threshold)
        assert out.dtype == torch.bfloat16
        assert out.view(torch.int16).tolist() == bits.tolist()
    assert torch.isinf(out[:2]).all() and torch.isnan(out[2:5]).all()


def test_empty_tensors_roundtrip_inline_and_aux() -> None:
    ts = [torch.empty(0, 3, dtype=torch.bfloat16), torch.empty(2, 0, 5, dtype=torch.int64), torch.empty(0)]
    for threshold in (0, 256):
        out = roundtrip(ts, list[torch.Tensor], size_threshold=threshold)
        assert [(o.dtype, tuple(o.shape)) for o in out] == [(torch.bfloat16, (0, 3)), (torch.int64, (2, 0, 5)),
                                                            (torch.float32, (0,))]


def test_tensor_with_grad_conj_and_neg_bits_encodes_its_values() -> None:
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    assert same_tensor(roundtrip(t, torch.Tensor), t.detach())
    c = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj()
    assert roundtrip(c, torch.Tensor).tolist() == [1 - 2j, 3 + 4j]


def test_strided_views_that_vllm_cannot_encode() -> None:
    """A one-element view with a step, and an empty one, count as contiguous in torch but cannot be
    byte-viewed directly (vLLM 0.33's encoder raises on both)."""
    one, empty = torch.arange(2, dtype=torch.int16)[::2], torch.empty(0, dtype=torch.int16)[::2]
    assert one.stride() == (2,) and empty.stride() == (2,)
    out = roundtrip([one, empty], list[torch.Tensor], size_threshold=0)
    assert out[0].tolist() == [0] and out[1].shape == (0,) and out[1].dtype == torch.int16


def test_zmq_frames_decode() -> None:
    import zmq

    frames = MsgpackEncoder().encode(torch.arange(100))
    out = MsgpackDecoder(torch.Tensor, share_mem=False).decode([zmq.Frame(bytes(f)) for f in frames])
    assert out.tolist() == list(range(100))


def test_mm_kwargs_items_with_every_field_and_none_entries() -> None:
    item, dummy = make_item(), MultiModalKwargsItem.dummy(300)
    items = MultiModalKwargsItems({"image": [item, None], "audio": [dummy]})
    for share_mem in (True, False):
        out = roundtrip(items, MultiModalKwargsItems, share_mem=share_mem)
        assert isinstance(out, MultiModalKwargsItems)
        assert list(out) == ["image", "audio"]
        assert same_item(out["image"][0], item) and out["image"][1] is None
        assert same_item(out["audio"][0], dummy)
        assert out["image"][0].nbytes == item.nbytes == 96 + 24 + 280 + 16 + 28 + 24
        assert out["image"][0]["patches"].field == MultiModalFlatField(
            slices=[(slice(None), slice(0, 70)), (slice(None), slice(70, 140, 1))], dim=1)
        assert out["image"][0]["grid"].field == MultiModalSharedField(batch_size=3, keep_on_cpu=True)


def test_decoded_items_still_batch() -> None:
    items = [make_item(), make_item()]
    out = roundtrip(items, list[MultiModalKwargsItem])
    batched = inputs.group_and_batch_mm_items(out)
    assert [n for n, _ in batched] == [2]
    assert batched[0][1]["pixel_values"].shape == (2, 2, 3, 4)
    assert batched[0][1]["patches"].shape == (2, 140)


@pytest.mark.parametrize("with_data", [True, False])
def test_feature_spec_roundtrip(with_data: bool) -> None:
    mask = torch.tensor([False] + [True] * 300 + [False])
    spec = MultiModalFeatureSpec(
        data=make_item() if with_data else None, modality="image", identifier="lora:xyz", mm_hash="xyz",
        mm_position=PlaceholderRange(7, 302, is_embed=mask if with_data else None),
    )
    out = roundtrip(spec, MultiModalFeatureSpec)
    assert (out.modality, out.identifier, out.mm_hash) == ("image", "lora:xyz", "xyz")
    assert out.mm_position == spec.mm_position
    if with_data:
        assert same_item(out.data, spec.data)
        assert out.mm_position.get_num_embeds() == 300
    else:
        assert out.data is None and out.mm_position.is_embed is None


def test_struct_with_feature_list() -> None:
    spec = MultiModalFeatureSpec(make_item(), "image", "a", PlaceholderRange(0, 2, torch.tensor([True, False])))
    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(Request)
    frames = encoder.encode(Request("r1", [spec, spec], 2.5, prompt_embeds=torch.ones(80, 2)))
    body = msgpack.decode(frames[0])
    assert isinstance(body, list) and body[0] == "r1" and body[2] == 2.5
    out = decoder.decode(frames)
    assert out.request_id == "r1" and len(out.mm_features) == 2
    assert same_item(out.mm_features[1].data, spec.data)
    assert same_tensor(out.prompt_embeds, torch.ones(80, 2))
    empty = decoder.decode(encoder.encode(Request("r2", None)))
    assert empty == Request("r2", None)


def test_single_bytes_message_and_untyped_decode() -> None:
    frames = MsgpackEncoder().encode({"ids": [1, 2], "t": torch.tensor([5], dtype=torch.uint8)})
    assert len(frames) == 1
    out = MsgpackDecoder().decode(bytes(frames[0]))
    assert out["ids"] == [1, 2]
    assert out["t"][:2] == ["uint8", [1]] and bytes(out["t"][2]) == b"\x05"


def test_extra_aux_frames_are_ignored_and_frames_may_be_reused() -> None:
    frames = MsgpackEncoder().encode(torch.arange(100))
    assert MsgpackDecoder(torch.Tensor).decode([*frames, b"junk"]).tolist() == list(range(100))
    body = msgpack.encode([["int64", [100], 1], ["int64", [10, 10], 1]])
    out = MsgpackDecoder(list[torch.Tensor]).decode([body, frames[1]])
    assert out[1].shape == (10, 10) and out[1][9, 9] == 99


def test_one_encoder_and_decoder_serve_many_threads() -> None:
    encoder, decoder = MsgpackEncoder(), MsgpackDecoder(list[torch.Tensor])
    errors: list[str] = []

    def work(seed: int) -> None:
        for i in range(200):
            ts = [torch.full((64 + i % 5,), float(seed * 1000 + i)), torch.tensor([seed, i])] * 3
            out = decoder.decode(encoder.encode(ts))
            if not all(same_tensor(a, b) for a, b in zip(ts, out)) or len(out) != len(ts):
                errors.append(f"thread {seed} message {i}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []


# --- vLLM 0.33 compatibility ----------------------------------------------------------------------


def _vllm_fixtures() -> Any:
    spec = importlib.util.spec_from_file_location("vllm_frames", DATA / "vllm_frames.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VLLM = _vllm_fixtures()
VLLM_TYPES: dict[str, Any] = {
    "item": MultiModalKwargsItem,
    "feature": MultiModalFeatureSpec,
    "feature_cached": MultiModalFeatureSpec,
    "items": MultiModalKwargsItems,
    "arrays": tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, torch.Tensor, torch.Tensor,
                    torch.Tensor],
    "request": VllmEngineCoreRequest,
}


def vllm_frames(name: str) -> list[bytes]:
    frames = msgpack.decode((DATA / f"vllm_{name}.msgpack").read_bytes())
    assert isinstance(frames, list)
    return frames


def expected(name: str) -> Any:
    return VLLM.build(inputs, VllmEngineCoreRequest)[name]


def test_vllm_fixture_set_is_complete() -> None:
    assert set(VLLM.NAMES) == set(VLLM_TYPES)
    assert [len(vllm_frames(n)) for n in VLLM.NAMES] == [2, 2, 1, 3, 4, 2]


@pytest.mark.parametrize("name", VLLM.NAMES)
def test_mmfront_frames_equal_vllm_frames_byte_for_byte(name: str) -> None:
    assert raw(MsgpackEncoder(size_threshold=256).encode(expected(name))) == vllm_frames(name)


def _assert_same(name: str, got: Any, want: Any) -> None:
    if name == "item":
        assert same_item(got, want)
    elif name.startswith("feature"):
        assert (got.modality, got.identifier, got.mm_hash, got.mm_position) == (
            want.modality, want.identifier, want.mm_hash, want.mm_position)
        assert (got.data is None and want.data is None) or same_item(got.data, want.data)
    elif name == "items":
        assert list(got) == list(want)
        assert all(same_item(g, w) for m in want for g, w in zip(got[m], want[m]))
    elif name == "arrays":
        assert all(same_array(g, w) if isinstance(w, np.ndarray) else same_tensor(g, w) for g, w in zip(got, want))
    else:
        assert (got.request_id, got.prompt_token_ids, got.client_index, got.arrival_time) == (
            want.request_id, want.prompt_token_ids, 1, 1.25)
        for g, w in zip(got.mm_features, want.mm_features):
            _assert_same("feature", g, w)


@pytest.mark.parametrize("name", VLLM.NAMES)
@pytest.mark.parametrize("share_mem", [True, False])
def test_mmfront_decodes_vllm_frames(name: str, share_mem: bool) -> None:
    frames = [bytearray(f) for f in vllm_frames(name)]  # writable, as zero-copy views of them are
    got = MsgpackDecoder(VLLM_TYPES[name], share_mem=share_mem).decode(frames)
    _assert_same(name, got, expected(name))


# --- no pickle; unknown types -------------------------------------------------------------------


class Opaque:
    pass


class SubBatched(MultiModalBatchedField):
    pass


@pytest.mark.parametrize(("make", "match"), [
    (Opaque, "test_codec.Opaque"),
    (lambda: [1, {"k": lambda: 0}], "function"),
    (lambda: np.array([object()], dtype=object), "kind 'O'"),
    (lambda: np.zeros(2, dtype="V4"), "kind 'V'"),
    (lambda: np.zeros(2, dtype=[("a", "<i4")]), "structured"),
    (lambda: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8), "dtype torch.qint8"),
    (lambda: torch.sparse_coo_tensor([[0]], [1.0], (3,)), "to_dense"),
    (lambda: torch.empty(100, device="meta"), "meta"),
    (lambda: slice(0, 2.5), "slice bounds"),
    (lambda: MultiModalKwargsItem({"k": MultiModalFieldElem("text", MultiModalBatchedField())}), "holds a str"),
    (lambda: MultiModalKwargsItem({"k": MultiModalFieldElem(1, SubBatched())}), "layout SubBatched"),
    (lambda: 2**70, "Cannot encode the message"),
])
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_unknown_types_raise_encode_error(make: Any, match: str) -> None:
    obj = make()
    with pytest.raises(EncodeError, match=match) as info:
        MsgpackEncoder().encode(obj)
    assert isinstance(info.value, TypeError)


def test_encoder_state_is_clean_after_an_error() -> None:
    encoder = MsgpackEncoder()
    with pytest.raises(EncodeError):
        encoder.encode([torch.zeros(1000), Opaque()])
    assert len(encoder.encode(torch.zeros(1000))) == 2


@pytest.mark.parametrize("code", [1, 2])
def test_pickle_extensions_are_refused(code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    monkeypatch.setattr(pickle, "loads", lambda *a, **k: pytest.fail("pickle.loads was called"))
    body = msgpack.encode({"x": msgpack.Ext(code, b"\x80\x04K\x01.")})
    for t in (None, Any, dict[str, torch.Tensor]):
        with pytest.raises(DecodeError, match="never unpickles"):
            MsgpackDecoder(t).decode([body])


def test_bad_threshold() -> None:
    with pytest.raises(ConfigError, match="size_threshold"):
        MsgpackEncoder(size_threshold=-1)


# --- strict decoding ----------------------------------------------------------------------------


def ext(data: bytes) -> msgpack.Ext:
    return msgpack.Ext(3, data)


F4 = np.arange(4, dtype="<f4").tobytes()
AUX = [np.arange(64, dtype="<f4").tobytes()]

TENSOR_CASES: list[tuple[Any, list[bytes], str]] = [
    (["float", [4], ext(F4)], [], "Unknown tensor dtype 'float'"),
    (["torch.float32", [4], ext(F4)], [], "Unknown tensor dtype"),
    (["qint8", [4], ext(F4[:4])], [], "Unknown tensor dtype"),
    ([7, [4], ext(F4)], [], "Unknown tensor dtype 7"),
    (["float32", [4], ext(F4), 0], [], r"\[dtype, shape, data\]"),
    (["float32", [4]], [], r"\[dtype, shape, data\]"),
    (["float32", 4, ext(F4)], [], "shape must be an array"),
    (["float32", [-4], ext(F4)], [], "non-negative ints, got -4"),
    (["float32", [4.0], ext(F4)], [], "non-negative ints, got 4.0"),
    (["float32", [True, 4], ext(F4)], [], "non-negative ints, got True"),
    (["float32", [1] * 17, ext(F4)], [], "at most 16"),
    (["float32", [5], ext(F4)], [], "needs 20 bytes, but its data holds 16"),
    (["float32", [2**40, 2**40], ext(F4)], [], "needs 4835703278458516698824704 bytes"),
    (["float32", [0, 2**40, 2**40], ext(b"")], [], "implausibly large"),
    (["float32", [64], 0], AUX, "aux frames 1..1"),
    (["float32", [64], 2], AUX, "aux frame 2"),
    (["float32", [64], -1], AUX, "aux frame -1"),
    (["float32", [64], True], AUX, "inline raw bytes"),
    (["float32", [64], "1"], AUX, "inline raw bytes"),
    (["float32", [64], 1], [b"\x00" * 255], "needs 256 bytes, but its data holds 255"),
    (["bool", [2], ext(b"\x01\x02")], [], "bool tensor holds bytes other than 0 and 1"),
]


@pytest.mark.parametrize(("triple", "aux", "match"), TENSOR_CASES)
def test_malformed_tensor_triples(triple: Any, aux: list[bytes], match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        MsgpackDecoder(torch.Tensor).decode([msgpack.encode(triple), *aux])


@pytest.mark.parametrize(("triple", "match"), [
    (["|O8", [1], ext(b"\x00" * 8)], "Unsupported ndarray dtype"),
    (["|V4", [1], ext(b"\x00" * 4)], "Unsupported ndarray dtype"),
    (["<U0", [1], ext(b"")], "Unsupported ndarray dtype"),
    (["i4,f8", [1], ext(b"\x00" * 12)], "Unsupported ndarray dtype"),
    (["(2,)<i4", [1], ext(b"\x00" * 8)], "Unsupported ndarray dtype"),
    (["<i4 ", [1], ext(b"\x00" * 4)], "Unsupported ndarray dtype"),
    (["f4", [1], ext(b"\x00" * 4)], "Unsupported ndarray dtype"),
    (["<q8", [1], ext(b"\x00" * 8)], "Unsupported ndarray dtype"),
    (["<f4", [3], ext(F4)], "needs 12 bytes"),
    (["|b1", [2], ext(b"\x00\x07")], "bool ndarray"),
    ([b"<f4", [4], ext(F4)], "dtype must be a string"),
])
def test_malformed_ndarray_triples(triple: Any, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        MsgpackDecoder(np.ndarray).decode([msgpack.encode(triple)])


def field(name: str, **values: Any) -> list[Any]:
    return [name, values]


GOOD_DATA = ["uint8", [1], ext(b"\x01")]
DEEP: Any = 1
for _ in range(34):
    DEEP = [DEEP]

ITEM_CASES: list[tuple[Any, str]] = [
    ([1, 2], "must be a map of key -> element"),
    ({1: {"data": GOOD_DATA, "field": field("batched")}}, "keys must be strings"),
    ({"k": {"data": GOOD_DATA}}, "exactly the keys 'data' and 'field'"),
    ({"k": {"data": GOOD_DATA, "field": field("batched"), "x": 1}}, "exactly the keys"),
    ({"k": {"data": GOOD_DATA, "field": ["batched"]}}, r"must be \[factory name"),
    ({"k": {"data": GOOD_DATA, "field": ["batched", False]}}, r"must be \[factory name"),
    ({"k": {"data": GOOD_DATA, "field": field("pickled")}}, "unknown layout 'pickled'"),
    ({"k": {"data": GOOD_DATA, "field": field("batched", dim=0)}}, r"unknown values \['dim'\]"),
    ({"k": {"data": GOOD_DATA, "field": field("batched", keep_on_cpu=1)}}, "keep_on_cpu of 'k' must be a bool"),
    ({"k": {"data": GOOD_DATA, "field": field("flat")}}, r"lacks \['slices'\]"),
    ({"k": {"data": GOOD_DATA, "field": field("shared")}}, r"lacks \['batch_size'\]"),
    ({"k": {"data": GOOD_DATA, "field": field("shared", batch_size=-1)}}, "non-negative int"),
    ({"k": {"data": GOOD_DATA, "field": field("shared", batch_size="2")}}, "non-negative int"),
    ({"k": {"data": GOOD_DATA, "field": field("flat", slices=[[0, 1]])}}, r"\[start, stop, step\]"),
    ({"k": {"data": GOOD_DATA, "field": field("flat", slices=[[0, 1, 0]])}}, "step cannot be zero"),
    ({"k": {"data": GOOD_DATA, "field": field("flat", slices=[[0, 1.5, None]])}}, "ints or nil, got 1.5"),
    ({"k": {"data": GOOD_DATA, "field": field("flat", slices=[[[0, 1, None], 3]])}}, r"\[start, stop, step\]"),
    ({"k": {"data": GOOD_DATA, "field": field("flat", slices={"a": 1})}}, "slices must be an array"),
    ({"k": {"data": GOOD_DATA, "field": field("flat", slices=[], dim=99)}}, "dim of 'k' must be an int"),
    ({"k": {"data": GOOD_DATA, "field": field("flat", slices=[], dim=1.0)}}, "dim of 'k' must be an int"),
    ({"k": {"data": "text", "field": field("batched")}}, "Item data must be tensors"),
    ({"k": {"data": [[1], {"a": 1}], "field": field("batched")}}, "Item data must be tensors"),
    ({"k": {"data": ["nope", [1], ext(b"\x01")], "field": field("batched")}}, "Unknown tensor dtype 'nope'"),
    ({"k": {"data": DEEP, "field": field("batched")}}, "nested deeper than 32"),
]


@pytest.mark.parametrize(("item", "match"), ITEM_CASES)
def test_malformed_items(item: Any, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        MsgpackDecoder(MultiModalKwargsItem).decode([msgpack.encode(item)])


@pytest.mark.parametrize(("body", "match"), [
    ([1, 2], "modality -> items"),
    ({"image": {"k": 1}}, "must map a modality name to an array"),
    ({"image": [7]}, "must be a map of key -> element"),
])
def test_malformed_items_by_modality(body: Any, match: str) -> None:
    with pytest.raises(DecodeError, match=match):
        MsgpackDecoder(MultiModalKwargsItems).decode([msgpack.encode(body)])


def test_message_level_failures() -> None:
    good = [bytearray(f) for f in raw(MsgpackEncoder().encode(MultiModalFeatureSpec(make_item(), "image", "i", PlaceholderRange(0, 1))))]
    decoder = MsgpackDecoder(MultiModalFeatureSpec)
    with pytest.raises(DecodeError, match="no frames"):
        decoder.decode([])
    with pytest.raises(DecodeError, match="truncated"):
        decoder.decode([good[0][:-3], *good[1:]])
    with pytest.raises(DecodeError, match="trailing"):
        decoder.decode([good[0] + b"\x00", *good[1:]])
    with pytest.raises(DecodeError, match=r"aux frames 1\.\.0"):
        decoder.decode(good[:1])
    with pytest.raises(DecodeError, match="Frame 1 is a int"):
        decoder.decode([good[0], 5])  # type: ignore[list-item]
    with pytest.raises(DecodeError, match="strided"):
        decoder.decode([good[0], memoryview(good[1])[::2]])
    with pytest.raises(DecodeError, match=r"Expected `str`, got `int` - at `\$.modality`"):
        decoder.decode([msgpack.encode({"data": None, "modality": 1, "identifier": "i",
                                        "mm_position": {"offset": 0, "length": 1}})])
    with pytest.raises(DecodeError, match="Unknown msgpack extension type 9"):
        MsgpackDecoder().decode([msgpack.encode([msgpack.Ext(9, b"")])])
    with pytest.raises(DecodeError, match="nested too deeply"):
        MsgpackDecoder().decode([b"\x91" * 100_000 + b"\xc0"])


def test_decoding_into_a_type_without_wire_format() -> None:
    with pytest.raises(DecodeError, match="no wire format for"):
        MsgpackDecoder(Opaque).decode([msgpack.encode([1])])


def test_decoded_tensors_are_views_of_matching_size_only() -> None:
    """A shape may claim only the bytes its frame holds, so no decode allocates beyond its input."""
    out = MsgpackDecoder(list[torch.Tensor]).decode([msgpack.encode([["uint8", [4, 16], 1]]), bytearray(64)])
    assert out[0].shape == (4, 16)
    with pytest.raises(DecodeError, match="needs 8589934592 bytes"):
        MsgpackDecoder(torch.Tensor).decode([msgpack.encode(["float64", [2**30], 1]), bytes(64)])
