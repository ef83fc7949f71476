"""Content hashes of multimodal items: the keys of the processor, encoder and prefix caches.

The digest input is vLLM 0.33's framing, byte for byte, so a deployment can share cache keys
with stock vLLM: every chunk is preceded by its 8-byte little-endian length and every container
by a tag, which makes the byte stream uniquely decodable (distinct inputs cannot collide by
shifting bytes between fields).

Where vLLM is slow or unsafe, mmfront differs; digests differ only where vLLM's is not
deterministic, or where vLLM crashes or falls back to pickle:

* PIL pixels are packed row strip by row strip straight into the hasher instead of being copied
  into one fresh array first (same bytes as ``np.asarray(image)``, no multi-MiB allocation).
* A lazily loaded ``MediaWithBytes`` is hashed from its encoded bytes and never decoded.
* Nothing is pickled. Values vLLM would pickle either get a documented deterministic encoding
  (numpy scalars, integers beyond 64 bits) or raise :class:`~mmfront.errors.HashingTypeError`.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import blake3
import numpy as np
import torch
from PIL import Image

from mmfront.config import HasherAlgorithm as HashAlgorithm
from mmfront.errors import ConfigError, HashingTypeError, ValidationError
from mmfront.media.base import MediaWithBytes, exif_image_uuid

__all__ = ["HashAlgorithm", "MultiModalHasher", "get_mm_hashes"]

Chunk = bytes | bytearray | memoryview
"""One piece of the digest input."""

_LENGTH_BYTES = 8
_TAG_NONE = b"\x00"
_TAG_SEQUENCE = b"\x01"
_TAG_MAPPING = b"\x02"
_TAG_LEAF = b"\x03"

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
_FLOAT64 = struct.Struct("<d")

_PIXEL_CHUNK_BYTES = 1 << 18
"""Pixel bytes per strip: big enough that per-call overhead vanishes (64 KiB strips cost ~15%
more), small enough that a strip is still in cache when the hasher reads it."""

_BLAKE3_THREADS_MIN_BYTES = 16 << 20
"""From this payload size on, blake3 hashes on all cores. Below it, waking the idle thread pool
costs more than it saves (2-vCPU VM: no gain up to 16 MiB, up to 2x faster above)."""

_MODALITY_PROCESSOR_KWARGS = {"image": "images_kwargs", "video": "videos_kwargs", "audio": "audio_kwargs"}
"""The HF processor kwargs scoped to one modality; another modality's scope never enters a hash."""


class _Hasher(Protocol):
    def update(self, data: Chunk, /) -> object: ...

    def hexdigest(self) -> str: ...


def _length(value: int) -> bytes:
    return value.to_bytes(_LENGTH_BYTES, "little")


def _framed(chunk: Chunk) -> Iterator[Chunk]:
    yield _length(chunk.nbytes if isinstance(chunk, memoryview) else len(chunk))
    yield chunk


def _int_bytes(value: int) -> bytes:
    """``np.array(value).tobytes()`` for every int where that is deterministic: int64, then
    uint64 (numpy's choice for 2**63..2**64-1), and bool as one byte; little-endian always."""
    if isinstance(value, bool):
        return b"\x01" if value else b"\x00"
    if _INT64_MIN <= value <= _INT64_MAX:
        return value.to_bytes(8, "little", signed=True)
    return value.to_bytes(8, "little", signed=False)


def _flat_bytes(view: memoryview) -> Chunk:
    """The view's bytes as a flat unsigned-byte buffer, which every hasher accepts (blake3
    refuses other formats); copied only when the view is strided or its format cannot be cast."""
    if view.format == "B" and view.ndim == 1:
        return view
    if view.c_contiguous:
        try:
            return view.cast("B")
        except (TypeError, ValueError):
            pass
    return view.tobytes()


@dataclass(frozen=True)
class _PixelData:
    """An image's pixels, serialized exactly like ``np.asarray(image)`` but streamed in strips."""

    image: Image.Image


def _iter_pixel_strips(image: Image.Image, linesize: int) -> Iterator[bytes]:
    # Mode "1" is the one mode whose array is not the raw packing: numpy sees one 0/255 byte per
    # pixel, which is Pillow's "L" raw packing of the same image.
    rawmode = "L" if image.mode == "1" else image.mode
    encoder = Image._getencoder(image.mode, "raw", rawmode)
    try:
        encoder.setimage(image.im, (0, 0, *image.size))
        bufsize = max(_PIXEL_CHUNK_BYTES // linesize, 1) * linesize
        while True:
            _, status, data = encoder.encode(bufsize)
            if status < 0:
                raise HashingTypeError(
                    f"Pillow could not pack the pixels of a {image.mode!r} image (encoder status {status}); "
                    "convert the image to RGB first, or pass its encoded bytes in a MediaWithBytes."
                )
            yield data
            if status:
                return
    finally:
        encoder.cleanup()


def _iter_pixel_value(image: Image.Image, nbytes: int, rows: int) -> Iterator[Chunk]:
    yield _TAG_LEAF
    yield _length(nbytes)
    if nbytes:
        yield from _iter_pixel_strips(image, nbytes // rows)


class MultiModalHasher:
    """Derives multimodal cache keys (vLLM: ``vllm.multimodal.hasher.MultiModalHasher``).

    Every method yields *framed* chunks (a length before every chunk, a tag before every value),
    so the concatenation fed to the digest is uniquely decodable.
    """

    @classmethod
    def serialize_item(cls, obj: object) -> Iterator[Chunk]:
        """The framed bytes of one leaf value (anything that is not None, a list/tuple or a mapping).

        Raises :class:`HashingTypeError` for a type with no deterministic encoding."""
        if isinstance(obj, (bytes, bytearray)):
            return _framed(obj)
        if isinstance(obj, memoryview):
            return _framed(_flat_bytes(obj))
        if isinstance(obj, str):
            # "surrogatepass" equals strict UTF-8 for every valid string, and gives lone
            # surrogates (which vLLM cannot hash at all) bytes no valid string has.
            return _framed(obj.encode("utf-8", "surrogatepass"))
        if isinstance(obj, int):
            if isinstance(obj, bool) or _INT64_MIN <= obj <= _UINT64_MAX:
                return _framed(_int_bytes(obj))
            # Beyond 64 bits numpy makes an object array whose bytes are pointers (vLLM's digest
            # changes from run to run); the decimal string under its own label is stable.
            return cls.iter_item_to_bytes("int", str(obj))
        if isinstance(obj, float):
            return _framed(_FLOAT64.pack(obj))
        if isinstance(obj, Image.Image):
            return cls._serialize_image(obj)
        if isinstance(obj, MediaWithBytes):
            return cls._serialize_media_with_bytes(obj)
        if isinstance(obj, torch.Tensor):
            return cls._serialize_tensor(obj)
        if isinstance(obj, np.ndarray):
            return cls._serialize_ndarray(obj)
        if isinstance(obj, np.generic):
            # vLLM pickles numpy scalars; mmfront hashes them as the 0-d array they convert to,
            # which keeps the dtype (np.int32(1) != np.int64(1) != 1).
            return cls._serialize_ndarray(np.asarray(obj))
        if isinstance(obj, _PixelData):
            return cls._serialize_pixels(obj.image)
        raise HashingTypeError(
            f"Cannot hash a value of type {type(obj).__module__}.{type(obj).__qualname__}: mmfront never falls "
            "back to pickle. Pass bytes, a str, a number, a numpy array, a torch tensor or a PIL image instead, "
            "or identify the item with a UUID (multi_modal_uuids)."
        )

    @classmethod
    def _serialize_image(cls, image: Image.Image) -> Iterator[Chunk]:
        image_id = exif_image_uuid(image)
        if image_id is not None:
            return _framed(image_id.bytes)
        image.load()  # numpy's view loads the image before vLLM reads the palette
        fields: dict[str, object] = {"mode": image.mode, "data": _PixelData(image)}
        palette = image.palette
        if palette is not None:
            fields["palette"] = palette.palette
            if palette.rawmode is not None:
                fields["palette_rawmode"] = palette.rawmode
        return cls.iter_item_to_bytes("image", fields)

    @classmethod
    def _serialize_pixels(cls, image: Image.Image) -> Iterator[Chunk]:
        shape, typestr = Image._conv_type_shape(image)
        dtype = np.dtype(typestr)
        nbytes = math.prod(shape) * dtype.itemsize
        return cls._iter_array(dtype.str, shape, _iter_pixel_value(image, nbytes, shape[0]))

    @classmethod
    def _serialize_media_with_bytes(cls, item: MediaWithBytes[Any]) -> Iterator[Chunk]:
        image_id = item.exif_image_uuid()  # never decodes a lazy item
        if image_id is not None:
            return _framed(image_id.bytes)
        if item.is_decoded:
            frames = item.media
            if isinstance(frames, (np.ndarray, torch.Tensor)) and frames.ndim >= 3:
                # Video frames: hash whichever is smaller, the frames or their source bytes.
                if frames.nbytes < len(item.original_bytes):
                    return cls.iter_item_to_bytes("video", frames)
                return cls.iter_item_to_bytes("video", item.original_bytes)
        if item.io_config:
            return cls.iter_item_to_bytes("image", {"io_config": item.io_config, "data": item.original_bytes})
        return cls.iter_item_to_bytes("image", item.original_bytes)

    @classmethod
    def _serialize_tensor(cls, tensor: torch.Tensor) -> Iterator[Chunk]:
        if tensor.layout != torch.strided or tensor.is_quantized:
            raise HashingTypeError(
                f"Cannot hash a {tensor.layout} {tensor.dtype} tensor; convert it to a dense, unquantized "
                "tensor first (.to_dense() / .dequantize())."
            )
        tensor = tensor.detach().cpu().resolve_conj().resolve_neg()
        try:
            array = tensor.numpy()
        except TypeError:
            # numpy has no such dtype (bfloat16, float8, ...): hash the raw bytes, with the dtype
            # and shape beside them.
            flat = tensor.contiguous().view((tensor.numel(),)).view(torch.uint8)
            return cls.iter_item_to_bytes("tensor", {
                "original_dtype": str(tensor.dtype),
                "original_shape": tuple(tensor.shape),
                "data": flat.numpy(),
            })
        return cls.iter_item_to_bytes("tensor", array)

    @classmethod
    def _serialize_ndarray(cls, array: np.ndarray) -> Iterator[Chunk]:
        data: object
        if array.ndim == 0:
            data = array.item()
        elif array.dtype.hasobject:
            raise HashingTypeError(
                f"Cannot hash a numpy array of dtype {array.dtype}: its bytes are object pointers. "
                "Convert it to a numeric or string dtype first."
            )
        elif array.flags.c_contiguous:
            data = array.reshape(-1).view(np.uint8).data
        else:
            data = array.tobytes()  # the C-order copy: same digest as np.ascontiguousarray(array)
        return cls._iter_array(array.dtype.str, array.shape, cls.iter_value_to_bytes(data))

    @classmethod
    def _iter_array(cls, dtype: str, shape: tuple[int, ...], data_value: Iterator[Chunk]) -> Iterator[Chunk]:
        """vLLM's array rule, ``iter_item_to_bytes("ndarray", {"dtype", "shape", "data"})``, with
        the data value given as its serialized chunks (so pixels can stream in)."""
        yield from _framed(b"ndarray")
        yield _TAG_MAPPING
        yield _length(3)
        yield from cls.iter_item_to_bytes("dtype", dtype)
        yield from cls.iter_item_to_bytes("shape", shape)
        yield from _framed(b"data")
        yield from data_value

    @classmethod
    def iter_item_to_bytes(cls, key: str, obj: object) -> Iterator[Chunk]:
        """The digest input for one ``key``/``obj`` pair: the framed key, then the value."""
        yield from _framed(key.encode("utf-8"))
        yield from cls.iter_value_to_bytes(obj)

    @classmethod
    def iter_value_to_bytes(cls, obj: object) -> Iterator[Chunk]:
        """The digest input for a value, tagged by its kind: None, sequence, mapping or leaf.

        Mappings keep their insertion order (only :meth:`hash_kwargs` sorts, at the top level)."""
        if obj is None:
            yield _TAG_NONE
        elif isinstance(obj, (list, tuple)):
            yield _TAG_SEQUENCE
            yield _length(len(obj))
            for element in obj:
                yield from cls.iter_value_to_bytes(element)
        elif isinstance(obj, Mapping):
            yield _TAG_MAPPING
            yield _length(len(obj))
            for key, value in obj.items():
                yield from _framed(str(key).encode("utf-8", "surrogatepass"))
                yield from cls.iter_value_to_bytes(value)
        else:
            yield _TAG_LEAF
            yield from cls.serialize_item(obj)

    @classmethod
    def hash_kwargs(cls, algorithm: HashAlgorithm, /, **kwargs: object) -> str:
        """Hex digest of ``kwargs`` (sorted by name) with ``algorithm``: 64 hex characters for
        blake3 and sha256, 128 for sha512."""
        hasher = _new_hasher(algorithm, kwargs.values())
        for key, value in sorted(kwargs.items()):
            for chunk in cls.iter_item_to_bytes(key, value):
                hasher.update(chunk)
        return hasher.hexdigest()


def _contiguous_nbytes(value: object) -> int:
    """Bytes a value hands the hasher in one piece (PIL pixels come in strips: 0)."""
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, (memoryview, np.ndarray)):
        return value.nbytes
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, MediaWithBytes):
        return len(value.original_bytes)
    return 0


_HASHER_FACTORIES: dict[str, Callable[[], _Hasher]] = {
    "blake3": blake3.blake3,
    "sha256": hashlib.sha256,
    "sha512": hashlib.sha512,
}


def _new_hasher(algorithm: str, values: Iterable[object]) -> _Hasher:
    factory = _HASHER_FACTORIES.get(algorithm)
    if factory is None:
        raise ConfigError(
            f"Unknown hash algorithm {algorithm!r}; use one of {sorted(_HASHER_FACTORIES)} "
            "(MultiModalConfig.mm_hasher_algorithm)."
        )
    if algorithm == "blake3" and any(_contiguous_nbytes(v) >= _BLAKE3_THREADS_MIN_BYTES for v in values):
        return blake3.blake3(max_threads=blake3.blake3.AUTO)
    return factory()


def _hash_factors(
    modality: str,
    hf_processor_mm_kwargs: Mapping[str, object],
    media_io_kwargs: Mapping[str, Mapping[str, object]],
) -> dict[str, object]:
    """The request options that change how ``modality``'s items are processed, empty ones dropped."""
    if modality in _MODALITY_PROCESSOR_KWARGS:
        own_media_io = media_io_kwargs.get(modality)
        media_io: dict[str, object] = {modality: own_media_io} if own_media_io else {}
        scoped = _MODALITY_PROCESSOR_KWARGS[modality]
        processor = {
            key: value for key, value in hf_processor_mm_kwargs.items()
            if key not in _MODALITY_PROCESSOR_KWARGS.values() or key == scoped
        }
    else:
        # A unified modality (e.g. "vision_chunk") mixes media kinds: every option may apply.
        media_io = dict(media_io_kwargs)
        processor = dict(hf_processor_mm_kwargs)
    factors: dict[str, object] = {"media_io_kwargs": media_io, "mm_processor_kwargs": processor}
    return {key: value for key, value in factors.items() if value}


def _uuids_for(modality: str, count: int, mm_uuids: Mapping[str, Sequence[str | None] | str | None]) -> list[str | None]:
    given = mm_uuids.get(modality)
    if given is None:
        return [None] * count
    given_list: list[object] = [given] if isinstance(given, str) else list(given)
    if len(given_list) != count:
        raise ValidationError(
            f"multi_modal_uuids has {len(given_list)} UUID(s) for {modality!r} but the request has {count} "
            f"{modality} item(s); give one UUID (or None) per item.",
            parameter="multi_modal_uuids", value=given,
        )
    uuids: list[str | None] = []
    for index, uuid in enumerate(given_list):
        if uuid is not None and not isinstance(uuid, str):
            raise ValidationError(
                f"multi_modal_uuids[{modality!r}][{index}] is a {type(uuid).__name__}; a UUID must be a string "
                "or None.",
                parameter="multi_modal_uuids", value=uuid,
            )
        uuids.append(uuid)
    return uuids


def get_mm_hashes(
    mm_items: Mapping[str, Sequence[object]],
    model_id: str,
    algorithm: HashAlgorithm,
    *,
    mm_uuids: Mapping[str, Sequence[str | None] | str | None] | None = None,
    hf_processor_mm_kwargs: Mapping[str, object] | None = None,
    media_io_kwargs: Mapping[str, Mapping[str, object]] | None = None,
) -> dict[str, list[str]]:
    """The cache key of every item, per modality (vLLM: ``ProcessorInputs.get_mm_hashes``).

    ``mm_items`` maps a modality to its items as stored for hashing (``MediaWithBytes`` kept, so
    encoded bytes are hashed instead of pixels; ``None`` for an item named only by its UUID).
    An item is keyed by ``model_id``, its content (or its UUID, if given) and the request-level
    options that change its processing. A UUID with no such options *is* the key, unhashed.
    """
    uuids_by_modality = mm_uuids or {}
    processor_kwargs = hf_processor_mm_kwargs or {}
    media_kwargs = media_io_kwargs or {}
    hashes: dict[str, list[str]] = {}
    for modality, items in mm_items.items():
        factors = _hash_factors(modality, processor_kwargs, media_kwargs)
        uuids = _uuids_for(modality, len(items), uuids_by_modality)
        modality_hashes: list[str] = []
        for index, (item, uuid) in enumerate(zip(items, uuids)):
            if item is None and uuid is None:
                raise ValidationError(
                    f"{modality} item {index} is None (a cached item) but has no UUID; pass its UUID in "
                    "multi_modal_uuids, or send the item's data.",
                    parameter="multi_modal_uuids",
                )
            if uuid is not None and not factors:
                modality_hashes.append(uuid)
                continue
            content = uuid if uuid is not None else item
            modality_hashes.append(
                MultiModalHasher.hash_kwargs(algorithm, model_id=model_id, **{modality: content}, **factors)
            )
        hashes[modality] = modality_hashes
    return hashes
