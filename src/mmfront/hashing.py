"""Content hashes of multimodal items: the keys of the processor, encoder and prefix caches.

The digest input is vLLM 0.33's framing, byte for byte, so a deployment can share cache keys
with stock vLLM: every chunk is preceded by its 8-byte little-endian length and every container
by a tag, which makes the byte stream uniquely decodable (distinct inputs cannot collide by
shifting bytes between fields).

Where vLLM is slow or unsafe, mmfront differs; digests differ only where vLLM's is not
deterministic, or where vLLM crashes or falls back to pickle:

* PIL pixels are packed strip by strip straight into the hasher instead of being copied into
  one fresh array first (same bytes as ``np.asarray(image)``, no multi-MiB allocation; see
  :mod:`mmfront.pixels`, which does it in C where it can).
* A lazily loaded ``MediaWithBytes`` is hashed from its encoded bytes and never decoded (a video
  is decoded only in the rare case where vLLM hashes its frames: when they are smaller than the file).
* Nothing is pickled. Values vLLM would pickle either get a documented deterministic encoding
  (numpy scalars, integers beyond 64 bits) or raise :class:`~mmfront.errors.HashingTypeError`.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import blake3
import numpy as np
import torch
from PIL import Image

from mmfront._text import check_text
from mmfront.config import HasherAlgorithm as HashAlgorithm
from mmfront.errors import ConfigError, HashingTypeError, ValidationError
from mmfront.media.base import MediaWithBytes, exif_image_uuid
from mmfront.pixels import iter_pixel_strips

__all__ = ["MAX_VALUE_DEPTH", "HashAlgorithm", "MultiModalHasher", "get_mm_hashes", "prehash_media"]

Chunk = bytes | bytearray | memoryview
"""One piece of the digest input."""

_LENGTH_BYTES = 8
_TAG_NONE = b"\x00"
_TAG_SEQUENCE = b"\x01"
_TAG_MAPPING = b"\x02"
_TAG_LEAF = b"\x03"

_INT64_MIN, _INT64_MAX, _UINT64_MAX = -(2**63), 2**63 - 1, 2**64 - 1
_FLOAT64 = struct.Struct("<d")

_BLAKE3_THREADS_MIN_BYTES = 16 << 20
"""From this payload size on, blake3 hashes on all cores. Below it the gain is unreliable: on a
quiet machine a few MiB hash faster on two cores, but as soon as the other core is busy (torch's
thread pool, another request) it is slower than one core, so the latency of a cache hit would
depend on the neighbours. Packing PIL pixels on a second thread does not pay either: handing
strips between threads costs more than the packing it hides (docs/benchmarks.md, "Design
measurements")."""

_SMALL_CHUNK_BYTES = 4096
"""Chunks shorter than this are buffered before they reach the hasher (the digest is unchanged:
every algorithm here hashes a byte stream, however it is split)."""

MAX_VALUE_DEPTH = 64
"""Deepest nesting of lists, tuples and mappings a hashed value may have. Real processor kwargs
nest two or three levels; the limit keeps the recursive writer far below Python's recursion limit
(a 10,000-deep value, or a list that contains itself, would otherwise raise ``RecursionError``)."""

MODALITY_SCOPES = {"image": "images_kwargs", "video": "videos_kwargs", "audio": "audio_kwargs"}
"""The HF processor kwargs scoped to one modality; another modality's scope never enters a hash."""


class _Hasher(Protocol):
    def update(self, data: Chunk, /) -> object: ...

    def hexdigest(self) -> str: ...


def _length(value: int) -> bytes:
    return value.to_bytes(_LENGTH_BYTES, "little")


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


_PLAIN_LEAVES = (bytes, str, int, float, MediaWithBytes, Image.Image, np.ndarray, torch.Tensor)


class _Writer:
    """Emits the framed digest input into ``out`` in one pass.

    Tags, lengths and short values gather in a buffer and large payloads go through untouched
    (no copy), so a hasher sees a few large updates instead of dozens of tiny ones (each update
    is a call into C). With ``gather=False`` every piece is emitted separately, which is what
    the generator API hands out. ``_position`` counts the bytes written, so that pixel strips
    can be cut where the hasher works fastest."""

    __slots__ = ("_buffer", "_gather", "_out", "_position", "parameter")

    def __init__(self, out: Callable[[Chunk], object], *, gather: bool = True) -> None:
        self._out = out
        self._gather = gather
        self._buffer = bytearray()
        self._position = 0
        self.parameter: str | None = None
        """The request field being written (the top-level key), named by a too-deep error."""

    def chunk(self, data: Chunk) -> None:
        self._position += len(data)
        if self._gather and len(data) < _SMALL_CHUNK_BYTES:
            self._buffer += data
            return
        self.flush()
        self._out(data)

    def framed(self, data: Chunk) -> None:
        self.chunk(_length(data.nbytes if isinstance(data, memoryview) else len(data)))
        self.chunk(data)

    def flush(self) -> None:
        if self._buffer:
            self._out(self._buffer)
            self._buffer = bytearray()

    # --- values ---

    def item(self, key: str, obj: object) -> None:
        self.framed(key.encode("utf-8"))
        self.value(obj)

    def value(self, obj: object, depth: int = 0) -> None:
        if isinstance(obj, _PLAIN_LEAVES):  # most values: skip the (slow) Mapping ABC check
            self.chunk(_TAG_LEAF)
            self.leaf(obj)
        elif obj is None:
            self.chunk(_TAG_NONE)
        elif isinstance(obj, (list, tuple)):
            self._check_depth(depth)
            self.chunk(_TAG_SEQUENCE + _length(len(obj)))
            for element in obj:
                self.value(element, depth + 1)
        elif isinstance(obj, Mapping):
            self._check_depth(depth)
            self.chunk(_TAG_MAPPING + _length(len(obj)))
            for key, value in obj.items():
                self.framed(str(key).encode("utf-8", "surrogatepass"))
                self.value(value, depth + 1)
        else:
            self.chunk(_TAG_LEAF)
            self.leaf(obj)

    def _check_depth(self, depth: int) -> None:
        if depth >= MAX_VALUE_DEPTH:
            where = self.parameter or "The value"
            raise ValidationError(
                f"{where} nests lists and mappings more than {MAX_VALUE_DEPTH} levels deep, so it cannot be "
                "hashed. Flatten it; no processor option needs that depth.",
                parameter=self.parameter,
            )

    def leaf(self, obj: object) -> None:
        if isinstance(obj, (bytes, bytearray)):
            self.framed(obj)
        elif isinstance(obj, memoryview):
            self.framed(_flat_bytes(obj))
        elif isinstance(obj, str):
            # "surrogatepass" equals strict UTF-8 for every valid string, and gives lone
            # surrogates (which vLLM cannot hash at all) bytes no valid string has.
            self.framed(obj.encode("utf-8", "surrogatepass"))
        elif isinstance(obj, int):
            if isinstance(obj, bool) or _INT64_MIN <= obj <= _UINT64_MAX:
                self.framed(_int_bytes(obj))
            else:
                # Beyond 64 bits numpy makes an object array whose bytes are pointers (vLLM's
                # digest changes from run to run); the decimal string under its own label is stable.
                self.item("int", str(obj))
        elif isinstance(obj, float):
            self.framed(_FLOAT64.pack(obj))
        elif isinstance(obj, Image.Image):
            self.image(obj)
        elif isinstance(obj, MediaWithBytes):
            self.media_with_bytes(obj)
        elif isinstance(obj, torch.Tensor):
            self.tensor(obj)
        elif isinstance(obj, np.ndarray):
            self.ndarray(obj)
        elif isinstance(obj, np.generic):
            # vLLM pickles numpy scalars; mmfront hashes them as the 0-d array they convert to,
            # which keeps the dtype (np.int32(1) != np.int64(1) != 1).
            self.ndarray(np.asarray(obj))
        else:
            raise HashingTypeError(
                f"Cannot hash a value of type {type(obj).__module__}.{type(obj).__qualname__}: mmfront never "
                "falls back to pickle. Pass bytes, a str, a number, a numpy array, a torch tensor or a PIL image "
                "instead, or identify the item with a UUID (multi_modal_uuids)."
            )

    def image(self, image: Image.Image) -> None:
        """The item ``"image"``: ``{"mode", "data": np.asarray(image), ["palette", "palette_rawmode"]}``,
        with the pixels streamed in strips instead of copied into one array first."""
        image_id = exif_image_uuid(image)
        if image_id is not None:
            self.framed(image_id.bytes)
            return
        image.load()  # numpy's view loads the image before vLLM reads the palette
        palette_fields: dict[str, object] = {}
        palette = image.palette
        if palette is not None:
            palette_fields["palette"] = palette.palette
            if palette.rawmode is not None:
                palette_fields["palette_rawmode"] = palette.rawmode
        shape, typestr = Image._conv_type_shape(image)
        prefix, nbytes = _image_prefix(image.mode, typestr, shape, 2 + len(palette_fields))
        self.chunk(prefix)
        if nbytes:
            # A gathering writer hands each strip to the hasher before taking the next, so the
            # strips may share one scratch buffer; the generator API keeps them all.
            strips = iter_pixel_strips(image, nbytes // shape[0], reuse_buffer=self._gather,
                                       stream_offset=self._position)
            for strip in strips:
                self.chunk(strip)
        for key, value in palette_fields.items():
            self.item(key, value)

    def media_with_bytes(self, item: MediaWithBytes[Any]) -> None:
        image_id = item.exif_image_uuid()  # never decodes a lazy item
        if image_id is not None:
            self.framed(image_id.bytes)
            return
        frames_nbytes = item.info.get("frames_nbytes")
        if frames_nbytes is not None:
            # A loaded video knows its frames' size before decoding: hash whichever is smaller, the
            # frames or their source bytes (decoding only when the frames are smaller).
            smaller_frames = frames_nbytes < len(item.original_bytes)
            self.item("video", item.media if smaller_frames else item.original_bytes)
            return
        if item.is_decoded and item.pixels is None:  # an image decoded to pixels hashes by its bytes below
            frames = item.media
            if isinstance(frames, (np.ndarray, torch.Tensor)) and frames.ndim >= 3:
                # Video frames: hash whichever is smaller, the frames or their source bytes.
                self.item("video", frames if frames.nbytes < len(item.original_bytes) else item.original_bytes)
                return
        if item.io_config:
            self.item("image", {"io_config": item.io_config, "data": item.original_bytes})
        else:
            self.item("image", item.original_bytes)

    def tensor(self, tensor: torch.Tensor) -> None:
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
            self.item("tensor", {
                "original_dtype": str(tensor.dtype),
                "original_shape": tuple(tensor.shape),
                "data": flat.numpy(),
            })
            return
        self.item("tensor", array)

    def ndarray(self, array: np.ndarray) -> None:
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
        self.array_header(array.dtype.str, array.shape)
        self.value(data)

    def array_header(self, dtype: str, shape: tuple[int, ...]) -> None:
        """vLLM's array rule, ``iter_item_to_bytes("ndarray", {"dtype", "shape", "data"})``, up
        to the data value, which the caller writes (so pixels can stream in)."""
        self.framed(b"ndarray")
        self.chunk(_TAG_MAPPING + _length(3))
        self.item("dtype", dtype)
        self.item("shape", shape)
        self.framed(b"data")


@functools.lru_cache(maxsize=64)
def _image_prefix(mode: str, typestr: str, shape: tuple[int, ...], field_count: int) -> tuple[bytes, int]:
    """An image's digest input up to its pixels, and the pixels' byte count.

    It depends only on the mode, the size and whether there is a palette, so it is built once
    (framing it value by value costs as much as hashing a small image's pixels)."""
    pieces: list[Chunk] = []
    writer = _Writer(pieces.append, gather=False)
    writer.framed(b"image")
    writer.chunk(_TAG_MAPPING + _length(field_count))
    writer.item("mode", mode)
    writer.framed(b"data")
    writer.chunk(_TAG_LEAF)
    dtype = np.dtype(typestr)
    nbytes = math.prod(shape) * dtype.itemsize
    writer.array_header(dtype.str, shape)
    writer.chunk(_TAG_LEAF + _length(nbytes))
    return b"".join(pieces), nbytes


def _chunks(write: Callable[[_Writer], None]) -> Iterator[Chunk]:
    chunks: list[Chunk] = []
    write(_Writer(chunks.append, gather=False))
    return iter(chunks)


class MultiModalHasher:
    """Derives multimodal cache keys (vLLM: ``vllm.multimodal.hasher.MultiModalHasher``).

    The digest input is *framed* (a length before every chunk, a tag before every value), so it
    is uniquely decodable. The ``iter_*``/``serialize_item`` methods return its pieces, for
    tests and tools; :meth:`hash_kwargs` streams them into the hasher without materializing them.
    """

    @classmethod
    def serialize_item(cls, obj: object) -> Iterator[Chunk]:
        """The framed bytes of one leaf value (anything that is not None, a list/tuple or a mapping).

        Raises :class:`HashingTypeError` for a type with no deterministic encoding."""
        return _chunks(lambda writer: writer.leaf(obj))

    @classmethod
    def iter_item_to_bytes(cls, key: str, obj: object) -> Iterator[Chunk]:
        """The digest input for one ``key``/``obj`` pair: the framed key, then the value."""
        return _chunks(lambda writer: writer.item(key, obj))

    @classmethod
    def iter_value_to_bytes(cls, obj: object) -> Iterator[Chunk]:
        """The digest input for a value, tagged by its kind: None, sequence, mapping or leaf.

        Mappings keep their insertion order (only :meth:`hash_kwargs` sorts, at the top level)."""
        return _chunks(lambda writer: writer.value(obj))

    @classmethod
    def hash_kwargs(cls, algorithm: HashAlgorithm, /, **kwargs: object) -> str:
        """Hex digest of ``kwargs`` (sorted by name) with ``algorithm``: 64 hex characters for
        blake3 and sha256, 128 for sha512.

        When the first item (in key order) is a ``MediaWithBytes`` prehashed under that key, the
        digest continues from a copy of its state instead of hashing the bytes again."""
        items = sorted(kwargs.items())
        first_key, first_value = items[0] if items else ("", None)
        state = first_value.prehashed.get((algorithm, first_key)) if isinstance(first_value, MediaWithBytes) \
            else None
        if state is not None:
            hasher = state.copy()
            items = items[1:]
        else:
            hasher = _new_hasher(algorithm, kwargs.values())
        writer = _Writer(hasher.update)
        for key, value in items:
            writer.parameter = key
            writer.item(key, value)
        writer.flush()
        return hasher.hexdigest()


def prehash_media(item: MediaWithBytes[Any], key: str, algorithm: HashAlgorithm) -> None:
    """Absorb ``key`` and ``item`` into a hasher now, so that hashing the item later (under the
    same modality ``key``, with any model id and factors) only finishes the digest.

    Call it where the media is loaded: that work then runs on the loading threads (blake3
    releases the GIL), not in the single ordered lane that processes requests. The digest is the
    same either way: the modality key sorts first among an item's hash inputs (``audio``/``image``
    < ``media_io_kwargs`` < ``mm_processor_kwargs`` < ``model_id``), and a stream hash does not
    care where its input was split. What the item hashes to cannot change afterwards: its bytes
    and ``io_config`` are fixed at load, and media decoded from bytes carries no EXIF UUID."""
    if (algorithm, key) in item.prehashed:
        return
    hasher = _new_hasher(algorithm, [item])
    writer = _Writer(hasher.update)
    writer.item(key, item)
    writer.flush()
    item.prehashed[(algorithm, key)] = hasher


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
    if modality in MODALITY_SCOPES:
        own_media_io = media_io_kwargs.get(modality)
        media_io: dict[str, object] = {modality: own_media_io} if own_media_io else {}
        scoped = MODALITY_SCOPES[modality]
        processor = {
            key: value for key, value in hf_processor_mm_kwargs.items()
            if key not in MODALITY_SCOPES.values() or key == scoped
        }
    else:
        # A unified modality (e.g. "vision_chunk") mixes media kinds: every option may apply.
        media_io = dict(media_io_kwargs)
        processor = dict(hf_processor_mm_kwargs)
    factors: dict[str, object] = {"media_io_kwargs": media_io, "mm_processor_kwargs": processor}
    return {key: value for key, value in factors.items() if value}


def normalize_mm_uuids(
    mm_uuids: Mapping[str, Sequence[str | None] | str | None] | None, counts: Mapping[str, int],
) -> dict[str, list[str | None]]:
    """Lists of per-item UUIDs (a bare string is a one-item list), checked against item counts."""
    if not mm_uuids:
        return {}
    out: dict[str, list[str | None]] = {}
    for modality, value in mm_uuids.items():
        if value is None:
            continue
        uuids: list[str | None] = [value] if isinstance(value, str) else list(value)
        for index, uuid in enumerate(uuids):
            if uuid is None:
                continue
            if not isinstance(uuid, str):
                raise ValidationError(
                    f"multi_modal_uuids[{modality!r}][{index}] is a {type(uuid).__name__}; a UUID must be a string "
                    "or None.", parameter="multi_modal_uuids", value=uuid,
                )
            check_text(uuid, parameter="multi_modal_uuids", where=f"multi_modal_uuids[{modality!r}][{index}]")
        count = counts.get(modality, 0)
        if len(uuids) != count:
            raise ValidationError(
                f"multi_modal_uuids[{modality!r}] has {len(uuids)} entries but {count} {modality} item(s) were given "
                f"({len(uuids)} UUIDs for {count} {modality} items); send one UUID (or null) per item.",
                parameter="multi_modal_uuids", value=value,
            )
        out[modality] = uuids
    return out

_SALT_PREFIX_HEX = 32
"""Hex digits of ``sha256(cache_salt)`` that prefix a salted uuid's key (then ``:``)."""
_SALTED_KEY = re.compile(rf"[0-9a-f]{{{_SALT_PREFIX_HEX}}}:")


def scope_uuids(
    mm_uuids: Mapping[str, Sequence[str | None] | str | None], cache_salt: str | None,
) -> dict[str, list[str | None] | str | None]:
    """User-supplied UUIDs, scoped to ``cache_salt``: a UUID names an item only among requests
    with the same salt, so one tenant cannot fetch another's cached item by naming its UUID.

    A salted UUID ``u`` becomes ``sha256(salt)[:32] + ":" + u``. Without a salt the UUID is the
    key unchanged, as in vLLM, except that the salted shape is reserved: an unsalted request
    naming ``<32 hex digits>:...`` could otherwise name a salted tenant's key verbatim and receive
    its item, so it is refused (vLLM has no salted namespace to protect)."""
    if cache_salt is None:
        out_plain: dict[str, list[str | None] | str | None] = {}
        for modality, value in mm_uuids.items():
            values = [value] if value is None or isinstance(value, str) else list(value)
            for uuid in values:
                if isinstance(uuid, str) and _SALTED_KEY.match(uuid):
                    raise ValidationError(
                        f"The {modality} uuid {uuid[:80]!r} has the form of a salted key ({_SALT_PREFIX_HEX} "
                        "hex digits and ':'), which is reserved for requests with a cache_salt. Choose another "
                        "uuid, or send the request with the cache_salt it belongs to.",
                        parameter="multi_modal_uuids",
                    )
            out_plain[modality] = value if value is None or isinstance(value, str) else values
        return out_plain
    prefix = hashlib.sha256(cache_salt.encode("utf-8", "surrogatepass")).hexdigest()[:_SALT_PREFIX_HEX]
    out: dict[str, list[str | None] | str | None] = {}
    for modality, value in mm_uuids.items():
        if isinstance(value, str):
            out[modality] = f"{prefix}:{value}"
        elif value is None:
            out[modality] = None
        else:
            out[modality] = [None if u is None or not isinstance(u, str) else f"{prefix}:{u}" for u in value]
    return out


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
    # vLLM walks the data items only: UUIDs of a modality without items are the validator's concern.
    given = {m: v for m, v in (mm_uuids or {}).items() if m in mm_items}
    normalized = normalize_mm_uuids(given, {modality: len(items) for modality, items in mm_items.items()})
    media_kwargs = media_io_kwargs or {}
    hashes: dict[str, list[str]] = {}
    for modality, items in mm_items.items():
        factors = _hash_factors(modality, hf_processor_mm_kwargs or {}, media_kwargs)
        uuids = normalized.get(modality) or [None] * len(items)
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
