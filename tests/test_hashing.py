"""mmfront.hashing: vLLM 0.33's digests byte for byte, no collisions, no pickle, no decode."""

from __future__ import annotations

import hashlib
import io
import struct
import uuid
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

import blake3
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from hashing_vectors import IMAGE_UUID, MODEL_ID, RGB_PNG, RGBA_PNG, mm_hash_cases, rgb_image, uuid_image, vectors
from mmfront import hashing, pixels
from mmfront.errors import ConfigError, HashingTypeError, InputTypeError, MMFrontError, ValidationError
from mmfront.hashing import MultiModalHasher, get_mm_hashes
from mmfront.parse import MediaWithBytes
from mmfront.testing.media import make_image

H = MultiModalHasher

# Produced by vLLM 0.33.0's own `vllm.multimodal.hasher.MultiModalHasher.hash_kwargs` on the inputs
# of tests/hashing_vectors.py (benchmarks/peer/vllm_hash_vectors.py, VLLM_TARGET_DEVICE=cpu).
VLLM_DIGESTS = {
    "str": "4f310627607f277870056fd324b80d2c47c9dc992f3684610b54c5037c9dd5b4",
    "str_unicode": "5363b603dac1df4e8e69d87d9751ef5b6ff2b57300668d6fd1c8c03611a42ed6",
    "bytes": "c05641b1fa5606349e3c9c25cfd3e5669699137f63b25c89dbeb895b6ad65a02",
    "int": "6b34fae9490539e764f4acfaac4749267be701035451e1ae55356e2b9ae750d8",
    "int_negative": "27aa4109a3b68d09983615bedef39e351e1fa7922e5f496a8dd20927ddc72816",
    "int_uint64_range": "a6fa6e2e642a522f5797a846c27b9df1423feb56a184cfbb58ef7a5cbcbf51ea",
    "float": "7ec8cb3d24a86c5cf99ee965f4d52bb42e6fd1ef495bf75f8fc4c1024783133a",
    "bool": "f39beb900c46da74edcf39cb22f40fca8bd488abd75081c0c0944078f6b2de45",
    "none": "5606f0462868dc2119ab056565b538179b442fe17910e4993b0cc02ddaeffaca",
    "nested": "d3a8116a706f43f838fd92d236273778f9943811b3e602db2a82cadaf5486f07",
    "two_keys": "57869c8eb4f35983a789f71a776c63c6bcb219d3e31cd28bfe3172ee2f61deb2",
    "pil_rgb": "9f58ab7df2406acf9ad61979ed090a863d1a78290a00195f6c7417db985c4f2e",
    "pil_palette": "e907badd5b1d391f8fe1fa7a8f34819fbb000a89b7871c1bf229ae648645b020",
    "pil_palette_list": "18ef6a45bac917ec5ac127786207147e9454200ff123fb6185f048630245ef4c",
    "pil_gif_file": "74bf6b2c67590e6c8e1f20be410e8e9c9ca088a7e1f59be6251c440b8427e19b",
    "pil_mode_1": "a957f19043dcc15c1d12a6b905d6a87d2806acb273f501a993fc6c8562e9cc66",
    "pil_mode_L": "996bf8d4b5dc425efa13b5baa76cafc4fbff3f51b65d0bfe737a001b0571a34e",
    "pil_mode_RGBA": "18fd1917ce53e8888e475da01541a30b221cf3de4203960d58443f932f4312db",
    "pil_mode_CMYK": "2cd28bb681951fec981241cb787f555fc198fae693899949f2119a7d42935b7a",
    "pil_mode_I;16B": "c3237cacb514b8213a279d2e994947fd8a22098ac6cf748eb4db0bd4a5021a0a",
    "pil_mode_F": "7ac7ba3a160771950f3dfba995f45898a3ffe7efd33ff6ee9332b408acc58c60",
    "pil_exif_uuid": "05b2c258dcd1faacc97419d5900e775092eafe258808d54b7fe3b7c1d5b1ede8",
    "media_png": "40f9c232dfa003f967f89bcf0c40f9852f4469b01d8f871d62f1e860d231eda9",
    "media_png_io_config": "9384937dcd4cdf041ebc9c2154e89e184b7705d67048a3cceccfb4158c40635d",
    "media_video_frames": "37a0a2a2860a18986223c8c564cb50a36b5d672663994672e314f8ab6c7cae94",
    "media_video_bytes": "5838cdefb424f5027bad211b3764a60bafd77d619d7f19c06f241c6fb7a58b6a",
    "ndarray": "685a7810a66a9df4fb955398e34dca08280e342bd803668b44bda25d2ba8f33e",
    "ndarray_non_contiguous": "f8107e52c5cb51412e12086fed1980c7d7276ef2275fbdd6601762df1d9cb919",
    "ndarray_0d": "498f6687aba773d0e33d966a7bdf277302a55a883d631f60b69be7de89f14bfc",
    "ndarray_big_endian": "ed70626b6bf7cf6f8ebeee66e5c57d86086b5427132db35af41642205bd81f87",
    "ndarray_bool": "5a50ca8259138d6c098b11770a45155df705b3a4b19c0c6219ac49b5f4bf4a7e",
    "ndarray_str": "5be87259e71802d7fbc923a618efaa6fa5e37b68b9fbd8269757c391fe3da659",
    "tensor_float32": "d89bb396fdc1ec5f89202bd25404ee85870c0880f6f08de1db4b845ffc91cbb2",
    "tensor_0d": "090c214cea73072cfa5b20ed5534c1cb66eafa6e32b1fdb2491803fd70d9179e",
    "tensor_int64_non_contiguous": "523bae4f54858d287e086d3555a93f5d0ef0be07d2085205171975b9991ca81b",
    "tensor_bfloat16": "a03951e4ba1dcdee69e4f220aacaad3ad6656124698a8362133864e2a5b7e50d",
    "full_blake3": "2dd8e568fbf921b6c5d7a813dd4f9325d65c1f241657784d31fbb7ef55ae8bc6",
    "full_sha256": "9dade33d8f2035aa6bda0a85c9eb2b778c2e2b782a2b21bbb9e8a173325bdb6c",
    "full_sha512": (
        "71a08c240b96815073d5801c103043ea461d709af729b4994521572aba2e85b0"
        "ddef3ae00c17bf334666cc2fb6945b920b369a74da6f5df55bb414b0f7f5e62f"
    ),
    "uuid_with_factors": "78aa031ddbb75c2e5d9da24d9f191b45a026ebeac2023bf2458bc9e6c4cffbca",
}

# The same tool, through vLLM's `MultiModalDataParser` and `ProcessorInputs.get_mm_hashes`.
VLLM_MM_HASHES = {
    "plain": {
        "image": ["d7b1b377f010f56d0148316e0509d4cc79e0dbab00f10d907876addc67676ac5",
                  "180951dac16771b2bf43e6a1fdc80710f121290a6fb388a7b59c3f17c2e1efc0"],
        "audio": ["7e60a107df7692bcce25094d455cbd8166f886fc0d27d72a9417194e509fc4cb"],
    },
    "partial_uuid": {"image": ["uuid-1", "180951dac16771b2bf43e6a1fdc80710f121290a6fb388a7b59c3f17c2e1efc0"]},
    "scoped": {
        "image": ["b867a6d0444b26d520fc8c802e2caf3ed106104bca62428f9deea41ea04b4f12"],
        "audio": ["3e0c429da543966cfbc9fd956644c61f3d39fd5a2e42b56db832cb08c815fcf1"],
    },
    "uuid_with_factors_sha256": {"image": ["e7d3de15cbdc3b6b76271444be807f7a95746ebcec48a86a7974dc738a2fe502"]},
    "uuid_unrelated_factors": {"image": ["uuid-1"]},
}


def mwb(media: Any, original_bytes: bytes, io_config: dict[str, Any] | None = None) -> MediaWithBytes[Any]:
    return MediaWithBytes(media, original_bytes, io_config)


def digest(value: object, algorithm: str = "blake3") -> str:
    return H.hash_kwargs(algorithm, value=value)  # type: ignore[arg-type]


def joined(chunks: Iterable[bytes | bytearray | memoryview]) -> bytes:
    return b"".join(bytes(chunk) for chunk in chunks)


def u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def framed(data: bytes) -> bytes:
    return u64(len(data)) + data


def leaf(data: bytes) -> bytes:
    return b"\x03" + framed(data)


# --- vLLM 0.33.0 test vectors -------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(VLLM_DIGESTS))
def test_digest_equals_vllm(name: str) -> None:
    algorithm, kwargs = vectors(mwb)[name]
    assert H.hash_kwargs(algorithm, **kwargs) == VLLM_DIGESTS[name]  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(name for name in VLLM_DIGESTS if name.startswith("pil_")))
def test_pil_digests_equal_vllm_without_the_c_extension(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(pixels, "_pack", None)  # Pillow's packer, as on an install without a C compiler
    algorithm, kwargs = vectors(mwb)[name]
    assert H.hash_kwargs(algorithm, **kwargs) == VLLM_DIGESTS[name]  # type: ignore[arg-type]


def test_vectors_and_digests_cover_the_same_inputs() -> None:
    assert set(vectors(mwb)) == set(VLLM_DIGESTS)
    assert set(mm_hash_cases(mwb)) == set(VLLM_MM_HASHES)


@pytest.mark.parametrize("name", sorted(VLLM_MM_HASHES))
def test_get_mm_hashes_equals_vllm(name: str) -> None:
    items, kwargs = mm_hash_cases(mwb)[name]
    algorithm = "sha256" if name.endswith("sha256") else "blake3"
    assert get_mm_hashes(items, MODEL_ID, algorithm, **kwargs) == VLLM_MM_HASHES[name]


# --- the framing, built by hand -----------------------------------------------------------------


@pytest.mark.parametrize(("algorithm", "factory"), [("sha256", hashlib.sha256), ("sha512", hashlib.sha512),
                                                    ("blake3", blake3.blake3)])
def test_hash_kwargs_is_the_digest_of_the_framed_bytes(algorithm: str, factory: Any) -> None:
    expected_bytes = framed(b"value") + leaf(b"test")
    assert joined(H.iter_item_to_bytes("value", "test")) == expected_bytes
    assert digest("test", algorithm) == factory(expected_bytes).hexdigest()


def test_scalars_and_containers_framed_by_hand() -> None:
    value = {"n": [None, 5, -1.5, True], "s": ("ü", b"\x00")}
    expected = (
        framed(b"k") + b"\x02" + u64(2)
        + framed(b"n") + b"\x01" + u64(4)
        + b"\x00" + leaf(struct.pack("<q", 5)) + leaf(struct.pack("<d", -1.5)) + leaf(b"\x01")
        + framed(b"s") + b"\x01" + u64(2) + leaf("ü".encode()) + leaf(b"\x00")
    )
    assert joined(H.iter_item_to_bytes("k", value)) == expected
    assert H.hash_kwargs("sha256", k=value) == hashlib.sha256(expected).hexdigest()


def ndarray_bytes(dtype: str, shape: tuple[int, ...], data: bytes) -> bytes:
    shape_bytes = b"\x01" + u64(len(shape)) + b"".join(leaf(struct.pack("<q", n)) for n in shape)
    return (
        framed(b"ndarray") + b"\x02" + u64(3)
        + framed(b"dtype") + leaf(dtype.encode())
        + framed(b"shape") + shape_bytes
        + framed(b"data") + leaf(data)
    )


def test_ndarray_framed_by_hand() -> None:
    array = np.array([[1, 2, 3], [4, 5, 6]], dtype="<u2")
    expected = framed(b"a") + b"\x03" + ndarray_bytes("<u2", (2, 3), array.tobytes())
    assert joined(H.iter_item_to_bytes("a", array)) == expected
    assert joined(H.iter_item_to_bytes("a", np.asfortranarray(array))) == expected


def test_pil_image_framed_by_hand() -> None:
    image = Image.frombytes("RGB", (2, 1), bytes([1, 2, 3, 4, 5, 6]))
    expected = (
        framed(b"img") + b"\x03"
        + framed(b"image") + b"\x02" + u64(2)
        + framed(b"mode") + leaf(b"RGB")
        + framed(b"data") + b"\x03" + ndarray_bytes("|u1", (1, 2, 3), bytes([1, 2, 3, 4, 5, 6]))
    )
    assert joined(H.iter_item_to_bytes("img", image)) == expected


def test_media_with_bytes_framed_by_hand() -> None:
    item = mwb(rgb_image(), b"PNG!", {"image_mode": "RGB"})
    expected = (
        framed(b"image") + b"\x03" + framed(b"image") + b"\x02" + u64(2)
        + framed(b"io_config") + b"\x02" + u64(1) + framed(b"image_mode") + leaf(b"RGB")
        + framed(b"data") + leaf(b"PNG!")
    )
    assert joined(H.iter_item_to_bytes("image", item)) == expected


def test_hash_kwargs_sorts_keys() -> None:
    expected = framed(b"a") + leaf(b"1") + framed(b"b") + leaf(b"2")
    assert H.hash_kwargs("sha256", b="2", a="1") == hashlib.sha256(expected).hexdigest()
    assert H.hash_kwargs("blake3", x=1, y=2) == H.hash_kwargs("blake3", y=2, x=1)


# --- algorithms ---------------------------------------------------------------------------------


def test_algorithm_is_required() -> None:
    with pytest.raises(TypeError, match="algorithm"):
        H.hash_kwargs(value="test")  # type: ignore[call-arg]


def test_unknown_algorithm_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"'md5'.*blake3.*sha256.*sha512"):
        H.hash_kwargs("md5", value="test")  # type: ignore[arg-type]


@pytest.mark.parametrize(("algorithm", "length"), [("blake3", 64), ("sha256", 64), ("sha512", 128)])
def test_hex_digest_length(algorithm: str, length: int) -> None:
    result = digest("x", algorithm)
    assert len(result) == length
    assert int(result, 16) >= 0


def test_large_blake3_payload_hashes_on_threads_to_the_same_digest() -> None:
    array = np.arange(hashing._BLAKE3_THREADS_MIN_BYTES // 8, dtype=np.int64)
    expected = blake3.blake3(joined(H.iter_item_to_bytes("value", array))).hexdigest()
    assert digest(array) == expected


# --- no collisions (vLLM's test_hasher.py list) -------------------------------------------------


def test_0d_and_1_element_tensors_differ() -> None:
    assert digest(torch.tensor(1.0)) != digest(torch.tensor([1.0]))


def test_image_modes_with_same_raw_colour_differ() -> None:
    size = (3, 2)
    assert digest(Image.new("1", size, 1)) != digest(Image.new("L", size, 1))
    assert digest(Image.new("RGBA", size, (0, 0, 0, 255))) != digest(Image.new("CMYK", size, (0, 0, 0, 255)))


def test_palette_only_difference() -> None:
    first = Image.new("P", (2, 2), 1)
    second = Image.new("P", (2, 2), 1)
    first.putpalette(bytes([0, 0, 0, 255, 0, 0]))
    second.putpalette(bytes([0, 0, 0, 0, 255, 0]))
    assert digest(first) != digest(second)


def test_transposed_image_differs() -> None:
    data = bytes(range(200))
    assert digest(Image.frombytes("L", (10, 20), data)) != digest(Image.frombytes("L", (20, 10), data))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tensors_with_same_bytes_and_other_shape_differ(dtype: torch.dtype) -> None:
    tensor = torch.arange(6, dtype=dtype)
    assert digest(tensor.reshape(2, 3)) != digest(tensor.reshape(3, 2))
    assert digest(tensor.reshape(2, 3)) != digest(tensor)


def test_ndarrays_with_same_bytes_and_other_shape_differ() -> None:
    array = np.arange(6, dtype=np.float32)
    assert digest(array.reshape(2, 3)) != digest(array.reshape(3, 2))


def test_videos_differ_by_frame_count_with_same_source_bytes() -> None:
    frames = np.zeros((16, 4, 4, 3), dtype=np.uint8)
    source = b"\x00" * 10_000
    assert digest(mwb(frames[:8], source)) != digest(mwb(frames, source))


def test_video_frames_as_tensor_hash_as_tensor() -> None:
    frames = torch.zeros((2, 4, 4, 3), dtype=torch.uint8)
    source = b"\x00" * 10_000
    assert joined(H.serialize_item(mwb(frames, source))) == joined(H.iter_item_to_bytes("video", frames))


def test_non_contiguous_array_equals_its_contiguous_copy() -> None:
    array = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    assert not array.flags.c_contiguous
    assert digest(array) == digest(np.ascontiguousarray(array))
    tensor = torch.arange(24.0).reshape(4, 6).T
    assert digest(tensor) == digest(tensor.contiguous())


def test_exif_uuid_image_hashes_as_the_uuid_bytes() -> None:
    assert digest(uuid_image()) == digest(IMAGE_UUID.bytes)
    assert H.hash_kwargs("blake3", image=uuid_image()) == H.hash_kwargs("blake3", image=IMAGE_UUID.bytes)


def test_exif_uuid_on_decoded_media_with_bytes() -> None:
    assert digest(mwb(uuid_image(), RGB_PNG)) == digest(IMAGE_UUID.bytes)


def test_non_uuid_exif_image_id_is_ignored() -> None:
    image = rgb_image()
    image.getexif()[Image.ExifTags.Base.ImageID] = "not-a-uuid"
    assert digest(image) == digest(rgb_image())


def test_malformed_exif_does_not_raise() -> None:
    image = rgb_image()
    image.info["exif"] = b"Exif\x00\x00garbage that is no TIFF header"
    assert digest(image) == digest(rgb_image())


def load_png(data: bytes, background: tuple[int, int, int] | None) -> MediaWithBytes[Image.Image]:
    """Like the media loader: io_config only when the conversion changed the image."""
    image = Image.open(io.BytesIO(data))
    if background is None:  # image_mode=None: no conversion, so no io_config
        return mwb(image, data, None)
    canvas = Image.new("RGBA", image.size, (*background, 255))
    converted = Image.alpha_composite(canvas, image.convert("RGBA")).convert("RGB")
    return mwb(converted, data, {"image_mode": "RGB", "rgba_background_color": list(background)})


def test_io_config_separates_decodes_of_the_same_bytes() -> None:
    white, black, unconverted = (digest(load_png(RGBA_PNG, bg)) for bg in ((255, 255, 255), (0, 0, 0), None))
    assert len({white, black, unconverted}) == 3
    assert unconverted == digest(MediaWithBytes(original_bytes=RGBA_PNG, decode=lambda: None))
    assert digest(load_png(RGBA_PNG, (0, 0, 0))) == black


def test_no_op_conversion_hashes_like_plain_bytes() -> None:
    media = Image.open(io.BytesIO(RGB_PNG)).convert("RGB")
    assert digest(mwb(media, RGB_PNG, None)) == digest(mwb(media, RGB_PNG, {}))


@pytest.mark.parametrize(("first", "second"), [
    ({"ab": "c"}, {"a": "bc"}),
    ({"size": {"shortest_edge": 224}}, {"size.shortest_edge": 224}),
    (["a", "b"], {"0": "a", "1": "b"}),
    (None, ""),
    (None, b""),
    (None, []),
    ({}, []),
    ([[]], [[], []]),
    (["a", ["b"]], [["a"], "b"]),
])
def test_framing_has_no_collisions(first: object, second: object) -> None:
    assert digest(first) != digest(second)


def test_empty_container_differs_from_omitted_key() -> None:
    assert H.hash_kwargs("blake3", a=1, b={}) != H.hash_kwargs("blake3", a=1)
    assert H.hash_kwargs("blake3", a=1, b=[]) != H.hash_kwargs("blake3", a=1)


# --- where vLLM pickles: deterministic encodings or a typed error -------------------------------


@pytest.mark.parametrize("value", [object(), 1 + 2j, {1, 2}, Decimal("1.5"), uuid.uuid4(), np.array([object()]),
                                   np.complex64(1 + 1j)])
def test_unhashable_types_raise_a_typed_error_not_pickle(value: object) -> None:
    with pytest.raises(HashingTypeError) as info:
        digest({"nested": [value]})
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, InputTypeError)
    assert isinstance(info.value, MMFrontError)
    message = str(info.value)
    assert "pickle" in message or "Convert" in message
    if not isinstance(value, (np.ndarray, np.generic)):
        assert type(value).__qualname__ in message
        assert "bytes" in message and "UUID" in message


def test_sparse_tensor_raises() -> None:
    with pytest.raises(HashingTypeError, match="to_dense"):
        digest(torch.eye(3).to_sparse())


def test_numpy_scalar_hashes_as_its_0d_array() -> None:
    assert digest(np.int32(5)) == digest(np.array(5, dtype=np.int32))
    assert digest(np.int32(5)) != digest(np.int64(5))
    assert digest(np.int64(5)) != digest(5)
    assert digest(np.bool_(True)) == digest(np.array(True))
    assert digest(np.bool_(True)) != digest(True)
    assert digest(np.float32(0.5)) == digest(np.array(0.5, dtype=np.float32))


def test_float64_scalar_hashes_like_python_float() -> None:
    # np.float64 subclasses float, so vLLM takes its float rule; so does mmfront.
    assert digest(np.float64(0.25)) == digest(0.25)


def test_int_beyond_64_bits_is_deterministic_and_labelled() -> None:
    big = 2**64
    expected = framed(b"value") + b"\x03" + framed(b"int") + leaf(b"18446744073709551616")
    assert joined(H.iter_item_to_bytes("value", big)) == expected
    assert digest(-(2**63) - 1) == H.hash_kwargs("blake3", value=-(2**63) - 1)
    assert digest(big) != digest(str(big))
    assert digest(big) != digest(0)


def test_int64_bounds_match_numpy() -> None:
    for value in (-(2**63), 2**63 - 1, 2**63, 2**64 - 1, 0, -1):
        assert joined(H.serialize_item(value)) == framed(np.array(value).tobytes())


def test_bytearray_and_memoryviews_hash_as_their_bytes() -> None:
    data = bytes(range(24))
    assert digest(bytearray(data)) == digest(data)
    assert digest(memoryview(data)) == digest(data)
    two_d = memoryview(np.frombuffer(data, dtype=np.uint8).reshape(4, 6))
    assert digest(two_d) == digest(data)
    floats = memoryview(np.frombuffer(data, dtype=np.float32).reshape(2, 3))
    assert floats.format == "f"
    assert digest(floats) == digest(data)
    structured = memoryview(np.zeros(2, dtype=[("a", "<i4"), ("b", "u1")]))
    assert digest(structured) == digest(bytes(10))
    strided = memoryview(np.frombuffer(data, dtype=np.uint8).reshape(4, 6)[:, ::2])
    assert not strided.c_contiguous
    assert digest(strided) == digest(strided.tobytes())


def test_lone_surrogate_string_hashes_without_error() -> None:
    assert digest("\ud800") != digest("")


def test_tensor_requiring_grad_hashes_like_its_data() -> None:
    tensor = torch.ones(3, requires_grad=True)
    assert digest(tensor) == digest(torch.ones(3))


def test_dtype_numpy_lacks_hashes_as_raw_bytes() -> None:
    tensor = torch.tensor([1.0, 2.0]).to(torch.float8_e4m3fn)
    expected = H.iter_item_to_bytes("tensor", {
        "original_dtype": "torch.float8_e4m3fn", "original_shape": (2,),
        "data": tensor.view(torch.uint8).numpy(),
    })
    assert joined(H.serialize_item(tensor)) == joined(expected)


# --- PIL pixels: streamed strips equal numpy's array --------------------------------------------


def reference_image_bytes(image: Image.Image) -> bytes:
    """vLLM's way: one numpy array of all pixels, through the ndarray rule."""
    fields: dict[str, object] = {"mode": image.mode, "data": np.asarray(image)}
    if image.palette is not None:
        fields["palette"] = image.palette.palette
        if image.palette.rawmode is not None:
            fields["palette_rawmode"] = image.palette.rawmode
    return joined(H.iter_item_to_bytes("image", fields))


MODES = ["1", "L", "P", "RGB", "RGBA", "CMYK", "YCbCr", "LAB", "HSV", "I", "F", "LA", "PA", "RGBX", "RGBa", "La",
         "I;16", "I;16L", "I;16B", "I;16N"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mode=st.sampled_from(MODES), width=st.integers(1, 40), height=st.integers(1, 30), seed=st.integers(0, 9),
       strip_bytes=st.sampled_from([1, 7, 64, 1 << 18]), fast=st.booleans())
def test_streamed_pixels_equal_numpy_array(monkeypatch: pytest.MonkeyPatch, mode: str, width: int, height: int,
                                           seed: int, strip_bytes: int, fast: bool) -> None:
    monkeypatch.setattr(pixels, "_STRIP_BYTES", strip_bytes)
    if not fast:
        monkeypatch.setattr(pixels, "_pack", None)
    image = make_image(width, height, seed=seed, mode=mode)
    assert image.mode == mode
    expected = reference_image_bytes(image)
    assert joined(H.serialize_item(image)) == expected
    # hash_kwargs streams the strips through the thread's scratch buffer; the generator API does not.
    assert H.hash_kwargs("blake3", image=image) == blake3.blake3(framed(b"image") + b"\x03" + expected).hexdigest()


@pytest.mark.parametrize("fast", [True, False], ids=["c-extension", "pillow"])
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_hashes_like_numpy_on_both_paths(monkeypatch: pytest.MonkeyPatch, mode: str, fast: bool) -> None:
    if not fast:
        monkeypatch.setattr(pixels, "_pack", None)
    image = make_image(37, 11, seed=3, mode=mode)
    expected = reference_image_bytes(image)
    assert joined(H.serialize_item(image)) == expected
    assert H.hash_kwargs("blake3", image=image) == blake3.blake3(framed(b"image") + b"\x03" + expected).hexdigest()


def test_large_image_streams_in_several_strips() -> None:
    image = make_image(1023, 1000)  # ~3 MB: several strips at any sane strip size
    chunks = list(H.serialize_item(image))
    assert sum(len(c) >= 100_000 for c in chunks) >= 3
    assert max(len(c) for c in chunks) <= pixels._STRIP_BYTES
    assert joined(chunks) == reference_image_bytes(image)


def test_pillow_encoder_error_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class FailingEncoder:
        cleaned_up = False

        def setimage(self, *args: object) -> None:
            pass

        def encode(self, bufsize: int) -> tuple[int, int, bytes]:
            return 0, -2, b""

        def cleanup(self) -> None:
            FailingEncoder.cleaned_up = True

    monkeypatch.setattr(Image, "_getencoder", lambda *args: FailingEncoder())
    monkeypatch.setattr(pixels, "_pack", None)  # RGB would take the C extension's path
    with pytest.raises(HashingTypeError, match="could not pack the pixels of a 'RGB' image"):
        digest(rgb_image())
    assert FailingEncoder.cleaned_up


@pytest.mark.parametrize("size", [(0, 5), (5, 0)])
def test_empty_image(size: tuple[int, int]) -> None:
    image = Image.new("RGB", size)
    assert joined(H.serialize_item(image)) == reference_image_bytes(image)


def test_file_image_loads_before_the_palette_is_read() -> None:
    buffer = io.BytesIO()
    make_image(8, 8, seed=1, mode="P").save(buffer, "PNG")
    lazy_file_image = Image.open(io.BytesIO(buffer.getvalue()))
    loaded = Image.open(io.BytesIO(buffer.getvalue()))
    expected = reference_image_bytes(loaded)
    assert joined(H.serialize_item(lazy_file_image)) == expected


# --- MediaWithBytes: bytes, never a decode ------------------------------------------------------


def lazy(data: bytes, decode: Any, io_config: dict[str, Any] | None = None) -> MediaWithBytes[Any]:
    return MediaWithBytes(original_bytes=data, io_config=io_config, decode=decode)


def test_lazy_item_is_hashed_without_decoding() -> None:
    item = lazy(RGB_PNG, lambda: Image.open(io.BytesIO(RGB_PNG)).convert("RGB"))
    result = H.hash_kwargs("blake3", image=item)
    assert item.decode_count == 0
    assert not item.is_decoded
    assert result == VLLM_DIGESTS["media_png"]
    _ = item.media
    assert H.hash_kwargs("blake3", image=item) == result


def test_lazy_item_with_io_config() -> None:
    config = {"image_mode": "RGB", "rgba_background_color": [0, 0, 0]}
    item = lazy(RGBA_PNG, lambda: pytest.fail("hashing decoded the item"), config)
    assert H.hash_kwargs("blake3", image=item) == VLLM_DIGESTS["media_png_io_config"]
    assert item.decode_count == 0


def test_audio_item_hash_does_not_depend_on_decode_state() -> None:
    waveform = np.linspace(-1, 1, 16_000, dtype=np.float32)
    item = lazy(b"RIFF....WAVE", lambda: waveform)
    before = digest(item)
    _ = item.media
    assert item.decode_count == 1
    assert digest(item) == before == digest(mwb(Image.new("L", (1, 1)), b"RIFF....WAVE"))


def test_get_mm_hashes_never_decodes() -> None:
    items = [lazy(RGB_PNG, lambda: pytest.fail("decoded")), lazy(RGBA_PNG, lambda: pytest.fail("decoded"))]
    hashes = get_mm_hashes({"image": items}, MODEL_ID, "blake3", hf_processor_mm_kwargs={"do_pan_and_scan": True})
    assert [item.decode_count for item in items] == [0, 0]
    assert len(set(hashes["image"])) == 2


# --- get_mm_hashes: factors and UUID rules (§3.3) -----------------------------------------------


def test_item_without_uuid_or_factors() -> None:
    image = rgb_image()
    assert get_mm_hashes({"image": [image]}, MODEL_ID, "blake3") == {
        "image": [H.hash_kwargs("blake3", model_id=MODEL_ID, image=image)],
    }


def test_partial_uuid_list() -> None:
    image = rgb_image()
    hashes = get_mm_hashes({"image": [None, image]}, MODEL_ID, "blake3", mm_uuids={"image": ["image-uuid", None]})
    assert hashes == {"image": ["image-uuid", H.hash_kwargs("blake3", model_id=MODEL_ID, image=image)]}


def test_bare_string_uuid_for_one_item() -> None:
    assert get_mm_hashes({"audio": [None]}, MODEL_ID, "sha256", mm_uuids={"audio": "clip-1"}) == {"audio": ["clip-1"]}


def test_uuid_with_factors_is_hashed_instead_of_content() -> None:
    hashes = get_mm_hashes({"image": [rgb_image()]}, MODEL_ID, "blake3", mm_uuids={"image": ["my-image-uuid"]},
                           hf_processor_mm_kwargs={"do_pan_and_scan": True})
    assert hashes == {"image": [VLLM_DIGESTS["uuid_with_factors"]]}


def test_full_factors_match_the_vllm_vector() -> None:
    media = Image.open(io.BytesIO(RGB_PNG)).convert("RGB")
    hashes = get_mm_hashes(
        {"image": [mwb(media, RGB_PNG)]}, MODEL_ID, "sha512",
        hf_processor_mm_kwargs={"do_pan_and_scan": True, "images_kwargs": {"size": {"shortest_edge": 224}},
                                "videos_kwargs": {"fps": 2}},
        media_io_kwargs={"image": {"rgba_background_color": [0, 0, 0]}, "video": {"num_frames": 8}},
    )
    assert hashes == {"image": [VLLM_DIGESTS["full_sha512"]]}


def test_other_modalities_scopes_do_not_change_image_hashes() -> None:
    items = {"image": [rgb_image()]}
    base = get_mm_hashes(items, MODEL_ID, "blake3", hf_processor_mm_kwargs={"videos_kwargs": {"fps": 1}},
                         media_io_kwargs={"video": {"num_frames": 4}})
    changed = get_mm_hashes(items, MODEL_ID, "blake3", hf_processor_mm_kwargs={"videos_kwargs": {"fps": 2}},
                            media_io_kwargs={"video": {"num_frames": 8}})
    assert base == changed == get_mm_hashes(items, MODEL_ID, "blake3")
    own_scope = get_mm_hashes(items, MODEL_ID, "blake3", hf_processor_mm_kwargs={"images_kwargs": {"x": 1}})
    assert own_scope != base


def test_unrelated_kwargs_keep_a_uuid_only_image_exactly_the_uuid() -> None:
    hashes = get_mm_hashes({"image": [None]}, MODEL_ID, "blake3", mm_uuids={"image": ["uuid-1"]},
                           hf_processor_mm_kwargs={"videos_kwargs": {"fps": 2}, "audio_kwargs": {"x": 1}},
                           media_io_kwargs={"video": {"num_frames": 8}, "image": {}})
    assert hashes == {"image": ["uuid-1"]}


def test_flat_processor_kwargs_apply_to_every_modality() -> None:
    items = {"image": [rgb_image()], "audio": [np.zeros(8, dtype=np.float32)]}
    plain = get_mm_hashes(items, MODEL_ID, "blake3")
    flat = get_mm_hashes(items, MODEL_ID, "blake3", hf_processor_mm_kwargs={"truncation": True})
    assert plain["image"] != flat["image"]
    assert plain["audio"] != flat["audio"]


def test_kwargs_shape_collision_pairs_differ() -> None:
    items = {"image": [rgb_image()]}
    nested = get_mm_hashes(items, MODEL_ID, "blake3", hf_processor_mm_kwargs={"size": {"shortest_edge": 224}})
    flat = get_mm_hashes(items, MODEL_ID, "blake3", hf_processor_mm_kwargs={"size.shortest_edge": 224})
    as_media_io = get_mm_hashes(items, MODEL_ID, "blake3", media_io_kwargs={"image": {"size": {"shortest_edge": 224}}})
    assert len({nested["image"][0], flat["image"][0], as_media_io["image"][0]}) == 3


def test_unified_modality_uses_every_factor() -> None:
    item = rgb_image()
    factors = {"hf_processor_mm_kwargs": {"videos_kwargs": {"fps": 2}}, "media_io_kwargs": {"video": {"n": 8}}}
    hashes = get_mm_hashes({"vision_chunk": [item]}, MODEL_ID, "blake3", **factors)  # type: ignore[arg-type]
    assert hashes == {"vision_chunk": [H.hash_kwargs(
        "blake3", model_id=MODEL_ID, vision_chunk=item,
        media_io_kwargs={"video": {"n": 8}}, mm_processor_kwargs={"videos_kwargs": {"fps": 2}},
    )]}


def test_model_id_scopes_content_hashes_but_not_bare_uuids() -> None:
    image = rgb_image()
    assert get_mm_hashes({"image": [image]}, "a/model", "blake3") != get_mm_hashes({"image": [image]}, "b/model",
                                                                                 "blake3")
    assert get_mm_hashes({"image": [None]}, "a/model", "blake3", mm_uuids={"image": ["u"]}) == {"image": ["u"]}


def test_uuids_of_a_modality_without_items_are_ignored() -> None:
    # vLLM iterates the data items only; the request validator owns this mismatch.
    assert get_mm_hashes({}, MODEL_ID, "blake3", mm_uuids={"image": ["u"]}) == {}


def test_none_item_without_uuid_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="image item 1 is None") as info:
        get_mm_hashes({"image": [rgb_image(), None]}, MODEL_ID, "blake3")
    assert info.value.parameter == "multi_modal_uuids"


def test_uuid_count_mismatch_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match=r"2 UUID.*1 image item") as info:
        get_mm_hashes({"image": [rgb_image()]}, MODEL_ID, "blake3", mm_uuids={"image": ["a", "b"]})
    assert info.value.parameter == "multi_modal_uuids"


def test_non_string_uuid_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match=r"\['image'\]\[0\] is a int") as info:
        get_mm_hashes({"image": [rgb_image()]}, MODEL_ID, "blake3", mm_uuids={"image": [7]})  # type: ignore[dict-item]
    assert info.value.parameter == "multi_modal_uuids"


def test_unhashable_item_in_get_mm_hashes_raises_hashing_type_error() -> None:
    with pytest.raises(HashingTypeError, match="set"):
        get_mm_hashes({"image": [{1, 2}]}, MODEL_ID, "blake3")


# --- the framing is uniquely decodable (property) -----------------------------------------------


def decode_value(buf: bytes, pos: int) -> tuple[object, int]:
    """Reference parser of the framing: tags, 8-byte lengths, leaves as raw bytes."""
    tag, pos = buf[pos], pos + 1
    if tag == 0:
        return None, pos
    count = struct.unpack_from("<Q", buf, pos)[0]
    pos += 8
    if tag == 1:
        elements = []
        for _ in range(count):
            element, pos = decode_value(buf, pos)
            elements.append(element)
        return ("list", elements), pos
    if tag == 2:
        entries = []
        for _ in range(count):
            key_length = struct.unpack_from("<Q", buf, pos)[0]
            key = buf[pos + 8:pos + 8 + key_length]
            value, pos = decode_value(buf, pos + 8 + key_length)
            entries.append((key, value))
        return ("dict", entries), pos
    assert tag == 3
    return ("leaf", buf[pos:pos + count]), pos + count


def expected_tree(value: object) -> object:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return ("list", [expected_tree(v) for v in value])
    if isinstance(value, dict):
        return ("dict", [(str(k).encode(), expected_tree(v)) for k, v in value.items()])
    if isinstance(value, bool):
        return ("leaf", bytes([value]))
    if isinstance(value, int):
        return ("leaf", struct.pack("<q", value))
    if isinstance(value, float):
        return ("leaf", struct.pack("<d", value))
    if isinstance(value, str):
        return ("leaf", value.encode())
    assert isinstance(value, bytes)
    return ("leaf", value)


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.binary(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None)
@given(value=json_like)
def test_framing_decodes_back_to_the_structure(value: object) -> None:
    encoded = joined(H.iter_value_to_bytes(value))
    tree, end = decode_value(encoded, 0)
    assert end == len(encoded)
    assert tree == expected_tree(value)


@settings(max_examples=100, deadline=None)
@given(first=json_like, second=json_like)
def test_structurally_different_values_hash_differently(first: object, second: object) -> None:
    if expected_tree(first) != expected_tree(second):
        assert digest(first) != digest(second)
