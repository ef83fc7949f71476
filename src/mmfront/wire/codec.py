"""The msgpack codec of the shm store and the engine wire, byte-compatible with vLLM 0.33.

``MsgpackEncoder.encode(obj)`` returns frames: frame 0 is the msgpack body, the others are aux
buffers that carry large tensors zero-copy. ``MsgpackDecoder(type).decode(frames)`` turns them
back into objects. The layout is vLLM's (``vllm.v1.serial_utils``), so a stock vLLM engine
decodes what mmfront sends and the other way round; docs/wire.md has the byte format.

Two things differ from vLLM on purpose:

* **No pickle, in any mode.** An object the codec has no format for raises :class:`EncodeError`;
  vLLM's pickle extensions (codes 1 and 2) raise :class:`DecodeError`.
* **Decoding is safe on untrusted bytes.** Every failure -- truncated or corrupt frames, forged
  shapes, bad aux indices, wrong structure -- is a :class:`DecodeError`, and no decode allocates
  more than a small multiple of the bytes it was given (``MAX_COPY_FACTOR``, also when many
  tensors point at one aux frame).

Both classes keep their per-message state in thread-locals, so one instance can serve several
threads (vLLM's cannot).
"""

from __future__ import annotations

import dataclasses
import operator
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import msgspec
import numpy as np
import torch
from msgspec import msgpack

from mmfront.errors import ConfigError, DecodeError, EncodeError, InputTypeError
from mmfront.inputs import (
    BaseMultiModalField,
    MultiModalBatchedField,
    MultiModalFieldConfig,
    MultiModalFieldElem,
    MultiModalFlatField,
    MultiModalKwargsItem,
    MultiModalKwargsItems,
    MultiModalSharedField,
    NestedTensors,
)
from mmfront.wire._tensors import (
    CUSTOM_TYPE_CLOUDPICKLE,
    CUSTOM_TYPE_PICKLE,
    CUSTOM_TYPE_RAW_VIEW,
    MAX_COPY_FACTOR,
    MAX_RANK,
    CopyBudget,
    Frame,
    as_frames,
    decode_ndarray,
    decode_tensor,
    describe,
    encode_ndarray,
    encode_tensor,
    frame_view,
    short,
)

DEFAULT_SIZE_THRESHOLD = 256
"""Tensors of fewer bytes are inlined in the body (vLLM's ``VLLM_MSGPACK_ZERO_COPY_THRESHOLD``)."""

MAX_NESTING = 32
"""Deepest nesting of lists accepted in a field's data on decode."""

MMF_CLASS_TO_FACTORY: dict[type[BaseMultiModalField], str] = {
    MultiModalFlatField: "flat",
    MultiModalSharedField: "shared",
    MultiModalBatchedField: "batched",
}
"""Field class -> the ``MultiModalFieldConfig`` factory that rebuilds it on decode."""

_FIELD_FACTORIES: dict[str, Callable[..., MultiModalFieldConfig]] = {
    "flat": MultiModalFieldConfig.flat,
    "shared": MultiModalFieldConfig.shared,
    "batched": MultiModalFieldConfig.batched,
}
_FIELD_NAMES: dict[str, frozenset[str]] = {
    name: frozenset(f.name for f in dataclasses.fields(cls)) for cls, name in MMF_CLASS_TO_FACTORY.items()
}
_REQUIRED_FIELDS: dict[str, frozenset[str]] = {"flat": frozenset({"slices"}), "shared": frozenset({"batch_size"})}
T = TypeVar("T")


# --- encoder ----------------------------------------------------------------------------------


class MsgpackEncoder:
    """Encodes objects to ``[msgpack body, *aux frames]``.

    Tensors and ndarrays of ``size_threshold`` bytes or more (and tensors not on the CPU) get an
    aux frame of their own; contiguous CPU ones are not copied, so the frames alias the tensors
    and must be sent before the tensors are modified. msgspec Structs and dataclasses (such as
    ``MultiModalFeatureSpec``) encode natively, with their tensors and items through this codec.
    """

    def __init__(self, size_threshold: int = DEFAULT_SIZE_THRESHOLD) -> None:
        if type(size_threshold) is not int or size_threshold < 0:
            raise ConfigError(f"size_threshold must be a non-negative int of bytes, got {size_threshold!r}")
        self.size_threshold = size_threshold
        self._local = threading.local()
        self._encoder = msgpack.Encoder(enc_hook=self.enc_hook)

    def encode(self, obj: Any) -> list[Frame]:
        frames: list[Frame] = [b""]
        with self._collecting(frames):
            frames[0] = self._encoder.encode(obj)
        return frames

    def encode_into(self, obj: Any, buf: bytearray) -> list[Frame]:
        """Like :meth:`encode`, but writes the body into ``buf`` (reused across messages) and
        returns it as frame 0."""
        frames: list[Frame] = [buf]
        with self._collecting(frames):
            self._encoder.encode_into(obj, buf)
        return frames

    @contextmanager
    def _collecting(self, frames: list[Frame]) -> Iterator[None]:
        """Aux buffers of this thread's message go to ``frames`` (re-entrant: an encode inside a
        hook restores the outer message's list); msgspec's errors become EncodeError."""
        local = self._local
        outer = getattr(local, "aux", None)
        local.aux = frames
        try:
            yield
        except EncodeError:
            raise
        except (TypeError, ValueError, OverflowError, RecursionError) as e:
            raise EncodeError(f"Cannot encode the message: {e}") from e
        finally:
            local.aux = outer

    def enc_hook(self, obj: Any) -> Any:
        """Called by msgspec for every object it has no native encoding for."""
        if isinstance(obj, torch.Tensor):
            return encode_tensor(obj, self._local.aux, self.size_threshold)
        if isinstance(obj, np.ndarray):
            return encode_ndarray(obj, self._local.aux, self.size_threshold)
        if isinstance(obj, slice):
            return _encode_slice(obj)
        if isinstance(obj, MultiModalKwargsItem):
            return self._encode_mm_item(obj)
        if isinstance(obj, MultiModalKwargsItems):
            return {
                modality: [None if item is None else self._encode_mm_item(item) for item in items]
                for modality, items in obj.items()
            }
        raise EncodeError(
            f"Cannot encode an object of type {type(obj).__module__}.{type(obj).__qualname__}: mmfront has no wire "
            "format for it and never falls back to pickle. Send tensors, ndarrays, plain data, dataclasses or "
            "msgspec Structs."
        )

    def _encode_mm_item(self, item: MultiModalKwargsItem) -> dict[str, Any]:
        return {
            key: {
                "data": None if elem.data is None else self._encode_nested(elem.data, key),
                "field": _encode_field(elem.field, key),
            }
            for key, elem in item.items()
        }

    def _encode_nested(self, data: NestedTensors, key: str) -> Any:
        if isinstance(data, torch.Tensor):
            return encode_tensor(data, self._local.aux, self.size_threshold)
        if isinstance(data, (int, float)):
            return data
        if isinstance(data, (list, tuple)):
            return [self._encode_nested(x, key) for x in data]
        raise EncodeError(
            f"Field {key!r} holds a {type(data).__name__}; item data must be tensors, ints, floats or lists of them"
        )


def _encode_slice(s: slice) -> tuple[int | None, int | None, int | None]:
    try:
        return tuple(None if v is None else operator.index(v) for v in (s.start, s.stop, s.step))  # type: ignore[return-value]
    except TypeError as e:
        raise EncodeError(f"Cannot encode {s!r}: slice bounds must be ints or None") from e


def _encode_field(field: BaseMultiModalField, key: str) -> tuple[str, dict[str, Any]]:
    name = MMF_CLASS_TO_FACTORY.get(type(field))
    if name is None:
        raise EncodeError(
            f"Field {key!r} has layout {type(field).__name__}; the wire carries only "
            f"{sorted(c.__name__ for c in MMF_CLASS_TO_FACTORY)}"
        )
    return name, {f.name: getattr(field, f.name) for f in dataclasses.fields(field)}


# --- decoder ----------------------------------------------------------------------------------


class MsgpackDecoder:
    """Decodes ``[msgpack body, *aux frames]`` into ``t`` (or plain msgpack data when ``t`` is None).

    With ``share_mem`` (the default) a tensor or ndarray that arrived in an aux frame is a
    zero-copy view of that frame and keeps it alive; a read-only frame (``bytes``) yields a tensor
    that must not be written to. Without it, and for inline data always, the result owns a copy.
    Extra aux frames that nothing points at are ignored. With ``max_frame_references``, a
    message whose tensors point at one aux frame more often is a :class:`DecodeError` (the
    encoder gives each tensor its own frame: 1 for what an untrusted peer sends).
    """

    def __init__(self, t: Any = None, share_mem: bool = True, *, max_frame_references: int | None = None) -> None:
        self.share_mem = share_mem
        self.max_frame_references = max_frame_references
        self._local = threading.local()
        args = () if t is None else (t,)
        try:
            self._decoder = msgpack.Decoder(*args, ext_hook=self.ext_hook, dec_hook=self.dec_hook)
        except TypeError as e:
            raise InputTypeError(f"Cannot decode into {t!r}: {e}") from e

    def decode(self, frames: Frame | Iterable[Frame]) -> Any:
        """Decode one message: its frames as a list, tuple or any other iterable; a single
        bytes-like object is a message without aux frames."""
        frames = as_frames(frames)
        if len(frames) == 0:
            raise DecodeError("Got no frames to decode; a message has at least its msgpack body (frame 0).")
        body = frames[0]
        if not isinstance(body, (bytes, bytearray)):
            body = frame_view(body, 0)
        local = self._local
        outer = getattr(local, "frames", None), getattr(local, "budget", None)
        local.frames, local.budget = frames, CopyBudget(frames, self.max_frame_references)
        try:
            return self._decoder.decode(body)
        except DecodeError:
            raise
        except (msgspec.DecodeError, RecursionError) as e:
            raise _malformed("message", e) from e
        finally:
            local.frames, local.budget = outer

    def ext_hook(self, code: int, data: memoryview) -> Any:
        if code == CUSTOM_TYPE_RAW_VIEW:
            # bytes, not a view of the body: inline data is small and copied into its tensor
            # anyway, and bytes are hashable (a forged body may use them as a map key).
            return bytes(data)
        if code in (CUSTOM_TYPE_PICKLE, CUSTOM_TYPE_CLOUDPICKLE):
            raise DecodeError(
                f"Refusing msgpack extension {code} (a pickled object): mmfront never unpickles. The sender must "
                "not set VLLM_ALLOW_INSECURE_SERIALIZATION and must send only types the wire format covers."
            )
        raise DecodeError(f"Unknown msgpack extension type {code}; only {CUSTOM_TYPE_RAW_VIEW} (raw bytes) is used")

    def dec_hook(self, t: type, obj: Any) -> Any:
        """Called by msgspec for every type in ``t`` it has no native decoding for."""
        local = self._local
        if isinstance(t, type):
            if issubclass(t, torch.Tensor):
                return decode_tensor(obj, local.frames, self.share_mem, local.budget)
            if issubclass(t, np.ndarray):
                return decode_ndarray(obj, local.frames, self.share_mem, local.budget)
            if t is slice:
                return _decode_slice(obj)
            if issubclass(t, MultiModalKwargsItem):
                return self._decode_mm_item(obj)
            if issubclass(t, MultiModalKwargsItems):
                return self._decode_mm_items(obj)
        raise DecodeError(f"mmfront's codec has no wire format for {short(t)}")

    def _decode_mm_items(self, obj: Any) -> MultiModalKwargsItems:
        if not isinstance(obj, dict):
            raise DecodeError(f"MultiModalKwargsItems must be a map of modality -> items, got {describe(obj)}")
        out: dict[str, list[MultiModalKwargsItem | None]] = {}
        for modality, items in obj.items():
            if not isinstance(modality, str) or not isinstance(items, list):
                raise DecodeError(f"MultiModalKwargsItems entry {short(modality)} must map a modality name to an array")
            out[modality] = [None if item is None else self._decode_mm_item(item) for item in items]
        return MultiModalKwargsItems(out)

    def _decode_mm_item(self, obj: Any) -> MultiModalKwargsItem:
        if not isinstance(obj, dict):
            raise DecodeError(f"A MultiModalKwargsItem must be a map of key -> element, got {describe(obj)}")
        item = MultiModalKwargsItem()
        for key, elem in obj.items():
            if not isinstance(key, str):
                raise DecodeError(f"MultiModalKwargsItem keys must be strings, got {short(key)}")
            if not isinstance(elem, dict) or elem.keys() != {"data", "field"}:
                raise DecodeError(f"Element {short(key)} must be a map with exactly the keys 'data' and 'field'")
            data = elem["data"]
            item[key] = MultiModalFieldElem(
                None if data is None else self._decode_nested(data, 0),  # type: ignore[arg-type]
                _decode_field(elem["field"], key),
            )
        return item

    def _decode_nested(self, obj: Any, depth: int) -> NestedTensors:
        if type(obj) in (int, float, bool):
            return obj
        if not isinstance(obj, list):
            raise DecodeError(f"Item data must be tensors, numbers or arrays of them, got {describe(obj)}")
        if obj and isinstance(obj[0], str):
            return decode_tensor(obj, self._local.frames, self.share_mem, self._local.budget)
        if depth >= MAX_NESTING:
            raise DecodeError(f"Item data is nested deeper than {MAX_NESTING} levels")
        return [self._decode_nested(x, depth + 1) for x in obj]


def _malformed(what: str, error: msgspec.DecodeError | RecursionError) -> DecodeError:
    """The typed error for bytes msgspec refused: a ``RecursionError`` is a nesting bomb (msgspec
    recurses once per level, up to the interpreter's limit), which must never escape untyped."""
    reason = "nested too deeply" if isinstance(error, RecursionError) else str(error)
    return DecodeError(f"Malformed {what}: {reason}")


def decode_untrusted(decode: Callable[[Any], T], data: Any, what: str) -> T:
    """``decode(data)`` with a plain msgspec decoder, for bytes a peer sent: every failure,
    nesting bombs included, is a :class:`DecodeError` naming ``what``."""
    try:
        return decode(data)
    except (msgspec.DecodeError, RecursionError) as e:
        raise _malformed(what, e) from e


_ARRAY_HEADERS = {0xDC: 2, 0xDD: 4}
"""msgpack's array16 and array32 headers: the bytes of their big-endian length."""


def msgpack_array_length(raw: msgspec.Raw) -> int | None:
    """The length of the msgpack array in ``raw`` (``None``: another value, nil included), read
    from its header: counting a peer's array never costs an object per element."""
    data = memoryview(raw)
    if not data.nbytes:
        return None
    first = data[0]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    size = _ARRAY_HEADERS.get(first)
    return None if size is None else int.from_bytes(data[1:1 + size], "big")


def _decode_slice(obj: Any) -> slice:
    if not isinstance(obj, (list, tuple)) or len(obj) != 3:
        raise DecodeError(f"A slice must be encoded as [start, stop, step], got {describe(obj)}")
    for v in obj:
        if v is not None and type(v) is not int:
            raise DecodeError(f"Slice bounds must be ints or nil, got {short(v)}")
    if obj[2] == 0:
        raise DecodeError("A slice step cannot be zero")
    return slice(*obj)


def _decode_flat_slices(obj: Any) -> list[slice] | list[tuple[slice, ...]]:
    """Flat-field slices: an array of slices (dim 0) or of arrays of slices (dim > 0)."""
    if not isinstance(obj, list):
        raise DecodeError(f"Flat field slices must be an array, got {describe(obj)}")
    out: list[Any] = []
    for entry in obj:
        if isinstance(entry, list) and all(isinstance(s, list) for s in entry) and len(entry) <= MAX_RANK:
            out.append(tuple(_decode_slice(s) for s in entry))
        else:
            out.append(_decode_slice(entry))
    return out


def _decode_field(obj: Any, key: str) -> BaseMultiModalField:
    if not isinstance(obj, list) or len(obj) != 2 or not isinstance(obj[0], str) or not isinstance(obj[1], dict):
        raise DecodeError(f"Field of {short(key)} must be [factory name, {{field values}}], got {describe(obj)}")
    name, values = obj
    factory = _FIELD_FACTORIES.get(name)
    if factory is None:
        raise DecodeError(f"Field of {short(key)} names unknown layout {short(name)}; expected one of {sorted(_FIELD_FACTORIES)}")
    unknown = set(values) - _FIELD_NAMES[name]
    if unknown:
        raise DecodeError(f"A {short(name)} field of {short(key)} has unknown values {sorted(map(str, unknown))}")
    missing = _REQUIRED_FIELDS.get(name, frozenset()) - set(values)
    if missing:
        raise DecodeError(f"A {short(name)} field of {short(key)} lacks {sorted(missing)}")
    kwargs = dict(values)
    if type(kwargs.get("keep_on_cpu", False)) is not bool:
        raise DecodeError(f"keep_on_cpu of {short(key)} must be a bool")
    if name == "flat":
        kwargs["slices"] = _decode_flat_slices(kwargs["slices"])
        dim = kwargs.get("dim", 0)
        if type(dim) is not int or not -MAX_RANK <= dim < MAX_RANK:
            raise DecodeError(f"dim of {short(key)} must be an int in [-{MAX_RANK}, {MAX_RANK}), got {short(dim)}")
    if name == "shared" and (type(kwargs["batch_size"]) is not int or kwargs["batch_size"] < 0):
        raise DecodeError(f"batch_size of {short(key)} must be a non-negative int, got {short(kwargs['batch_size'])}")
    return factory("", **kwargs).field


__all__ = [
    "CUSTOM_TYPE_CLOUDPICKLE",
    "CUSTOM_TYPE_PICKLE",
    "CUSTOM_TYPE_RAW_VIEW",
    "DEFAULT_SIZE_THRESHOLD",
    "MAX_COPY_FACTOR",
    "MMF_CLASS_TO_FACTORY",
    "Frame",
    "MsgpackDecoder",
    "MsgpackEncoder",
    "decode_untrusted",
    "msgpack_array_length",
]
