"""Tensors and ndarrays on the wire: the ``(dtype, shape, data)`` triple of vLLM 0.33.

``data`` is either ``Ext(3, raw bytes)`` inlined in the msgpack body (small tensors) or the index
of an aux frame that carries the raw bytes zero-copy (large ones). Decoding treats every part of
the triple as untrusted: the dtype must be on an explicit allowlist, the shape must be a short
list of non-negative ints, and ``prod(shape) * itemsize`` must *equal* the byte count of the data
it points at. So a forged shape can never make the decoder allocate more than the frames it was
given, and no byte pattern reaches torch or numpy in a form they would reject. A forged body can
still point many triples at one aux frame: views of it cost nothing, and what a decode copies or
scans is charged to a :class:`CopyBudget` of a small multiple of its input.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from msgspec import msgpack

from mmfront.errors import DecodeError, EncodeError

CUSTOM_TYPE_PICKLE = 1
"""vLLM's pickle extension; mmfront refuses it."""
CUSTOM_TYPE_CLOUDPICKLE = 2
"""vLLM's cloudpickle extension; mmfront refuses it."""
CUSTOM_TYPE_RAW_VIEW = 3
"""Raw bytes of a small tensor or array, inlined in the msgpack body."""

MAX_RANK = 16
"""Highest tensor rank accepted on decode; no multimodal kwarg comes close."""

_MAX_EMPTY_EXTENT = 2**48
"""Bound on the product of the non-zero dims of an *empty* tensor: its byte count (0) cannot bound
the shape, and torch overflows computing strides for shapes like ``(0, 2**40, 2**40)``."""

_TORCH_DTYPE_NAMES = (
    "bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex32", "complex64", "complex128",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu",
)

TORCH_DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, name) for name in _TORCH_DTYPE_NAMES if isinstance(getattr(torch, name, None), torch.dtype)
}
"""Wire name (``str(dtype)`` without ``torch.``) -> dtype, for every dtype the codec carries.

Quantized, bit-packed and sub-byte dtypes are left out: their bytes cannot be reinterpreted with
``Tensor.view(dtype)``, and no processor emits them."""

_TORCH_WIRE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in TORCH_DTYPES.items()}

NUMPY_KINDS = frozenset("biufcmMSU")
"""ndarray dtype kinds the codec carries: everything but object (``O``) and void (``V``), whose
bytes are pointers or arbitrary records and could only travel by pickle."""

MAX_COPY_FACTOR = 2
"""A decode copies and scans at most this many times the bytes of its frames. An honest message
needs at most 2: each tensor's bytes copied once (``share_mem=False``, inline data) and, for a
bool, checked once."""

_NUMPY_DTYPE_STR = re.compile(r"[<>|][biufcmMSU][0-9]{1,7}(\[[0-9]{0,6}[A-Za-z]{1,2}\])?")

Frame = bytes | bytearray | memoryview
"""One wire frame: frame 0 is the msgpack body, the others are aux buffers."""


# --- encode -----------------------------------------------------------------------------------


def _place(raw: memoryview, inline: bool, aux: list[Frame]) -> msgpack.Ext | int:
    if inline:
        return msgpack.Ext(CUSTOM_TYPE_RAW_VIEW, raw)
    aux.append(raw)
    return len(aux) - 1


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes in C order: a view of its storage when it is a contiguous CPU tensor,
    otherwise one copy."""
    t = tensor.detach()
    if t.numel() == 0:
        return memoryview(b"")  # an empty tensor's strides can be anything, which view(uint8) rejects
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    try:
        flat = t.flatten().cpu()
        if flat.stride(0) != 1:  # also a 1-element view with a step, which torch calls contiguous
            flat = flat.clone(memory_format=torch.contiguous_format)
        return flat.view(torch.uint8).numpy().data
    except (RuntimeError, TypeError) as e:
        raise EncodeError(f"Cannot read the bytes of a {t.dtype} tensor on {t.device}: {e}") from e


def encode_tensor(tensor: torch.Tensor, aux: list[Frame], size_threshold: int) -> tuple[str, tuple[int, ...], Any]:
    name = _TORCH_WIRE_NAMES.get(tensor.dtype)
    if name is None:
        raise EncodeError(
            f"Cannot encode a tensor of dtype {tensor.dtype}; supported dtypes: {sorted(TORCH_DTYPES)}. "
            "Convert it (e.g. dequantize) before sending."
        )
    if tensor.layout is not torch.strided:
        raise EncodeError(f"Cannot encode a {tensor.layout} tensor; call .to_dense() before sending.")
    raw = tensor_bytes(tensor)
    return name, tuple(tensor.shape), _place(raw, tensor.nbytes < size_threshold and tensor.is_cpu, aux)


def encode_ndarray(array: np.ndarray, aux: list[Frame], size_threshold: int) -> tuple[str, tuple[int, ...], Any]:
    dtype = array.dtype
    if dtype.kind not in NUMPY_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise EncodeError(
            f"Cannot encode an ndarray of dtype {dtype!r} (kind {dtype.kind!r}): object and structured arrays "
            "would need pickle, which mmfront never uses. Convert it to a numeric array."
        )
    raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
    return dtype.str, array.shape, _place(raw, array.ndim == 0 or array.nbytes < size_threshold, aux)


# --- decode -----------------------------------------------------------------------------------


def frame_view(frame: Any, index: int) -> memoryview:
    """A flat byte view of one frame, so lengths are byte counts whatever the exporter's format."""
    try:
        view = memoryview(frame)
        if view.ndim != 1 or view.format != "B":
            view = view.cast("B")
    except TypeError as e:
        raise DecodeError(f"Frame {index} is a {type(frame).__name__}, not a contiguous bytes-like buffer: {e}") from e
    if not view.c_contiguous:
        raise DecodeError(f"Frame {index} is a {type(frame).__name__}, not a contiguous bytes-like buffer: it is strided")
    return view


def as_frames(frames: Any) -> Sequence[Any]:
    """A message's frames as a sequence: a list or tuple as is, one bytes-like object (anything
    with the buffer protocol, such as a ``zmq.Frame``) as a message without aux frames, any other
    iterable (a generator, a deque) collected into a list."""
    if isinstance(frames, (list, tuple)):
        return frames
    try:
        memoryview(frames)
    except TypeError:
        pass
    else:
        return (frames,)
    try:
        return list(frames)
    except TypeError as e:
        raise DecodeError(
            f"Frames must be a bytes-like object or an iterable of them (list, tuple, generator), "
            f"got a {type(frames).__name__}"
        ) from e


def frame_views(frames: Iterable[Any]) -> list[memoryview]:
    frames = as_frames(frames)
    if len(frames) == 0:
        raise DecodeError("Got no frames to decode; a message has at least its msgpack body (frame 0).")
    return [frame_view(frame, i) for i, frame in enumerate(frames)]


class CopyBudget:
    """The bytes one decode may still copy or scan: ``MAX_COPY_FACTOR`` times its frames; and,
    with ``max_references``, how often a tensor may point at one aux frame.

    Without it a 28 KB body that points 2,000 tensors at one 4 MiB aux frame would decode, with
    ``share_mem=False``, into 8 GiB of copies. The input size is taken at the first charge, so a
    message whose tensors are all zero-copy views never pays for it."""

    __slots__ = ("_frames", "_left", "_max_references", "_references")

    def __init__(self, frames: Sequence[Any], max_references: int | None = None) -> None:
        self._frames = frames
        self._left: int | None = None
        self._max_references = max_references
        self._references: dict[int, int] = {}

    def refer(self, index: int, what: str) -> None:
        """Count one more tensor pointing at aux frame ``index``."""
        if self._max_references is None:
            return
        count = self._references.get(index, 0) + 1
        if count > self._max_references:
            times = "twice" if count == 2 else f"{count} times"
            raise DecodeError(
                f"A {what} points at aux frame {index} {times}; an encoder gives every tensor its own frame "
                f"(at most {self._max_references} here), so the message was refused."
            )
        self._references[index] = count

    def charge(self, nbytes: int, what: str) -> None:
        if self._left is None:
            self._left = MAX_COPY_FACTOR * sum(_nbytes(frame) for frame in self._frames)
        self._left -= nbytes
        if self._left < 0:
            given = sum(_nbytes(frame) for frame in self._frames)
            raise DecodeError(
                f"Decoding this {what} would copy or scan more than {MAX_COPY_FACTOR}x the {given} bytes of the message: "
                "its tensors point at the same data over and over. A sender gives each tensor its own bytes."
            )


def _nbytes(frame: Any) -> int:
    try:
        return memoryview(frame).nbytes
    except TypeError:
        return 0  # not a buffer: refused where a triple points at it


def _triple(obj: Any, what: str) -> tuple[Any, Any, Any]:
    if not isinstance(obj, (list, tuple)) or len(obj) != 3:
        raise DecodeError(f"A {what} must be encoded as [dtype, shape, data], got {describe(obj)}")
    return obj[0], obj[1], obj[2]


def short(value: Any, limit: int = 60) -> str:
    """The repr of an untrusted value, cut short so a forged message cannot bloat an error."""
    if isinstance(value, (list, tuple, dict)):
        return describe(value)
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe(obj: Any) -> str:
    """Names what a malformed value is, for error messages, without echoing large data."""
    if isinstance(obj, (list, tuple)):
        return f"a {len(obj)}-element array"
    return f"a value of type {type(obj).__name__}"


def _data_buffer(data: Any, frames: Sequence[Any], what: str, budget: CopyBudget) -> tuple[memoryview, bool]:
    """The bytes a triple's ``data`` names, and whether they live in an aux frame."""
    if isinstance(data, bytes):
        return memoryview(data), False
    if type(data) is int:
        if not 1 <= data < len(frames):
            raise DecodeError(
                f"The {what} data points at aux frame {data}, but the message has aux frames 1..{len(frames) - 1}"
            )
        budget.refer(data, what)
        return frame_view(frames[data], data), True
    raise DecodeError(
        f"The {what} data must be inline raw bytes (ext {CUSTOM_TYPE_RAW_VIEW}) or an aux frame index, "
        f"got {describe(data)}"
    )


def _checked_shape(shape: Any, itemsize: int, nbytes: int, what: str) -> tuple[int, ...]:
    if not isinstance(shape, (list, tuple)) or len(shape) > MAX_RANK:
        raise DecodeError(f"The {what} shape must be an array of at most {MAX_RANK} ints, got {describe(shape)}")
    for dim in shape:
        if type(dim) is not int or dim < 0:
            raise DecodeError(f"The {what} shape must hold non-negative ints, got {short(dim)}")
    count = math.prod(shape)
    if count * itemsize != nbytes:
        raise DecodeError(
            f"The {what} shape {list(shape)} with {itemsize}-byte elements needs {count * itemsize} bytes, "
            f"but its data holds {nbytes}"
        )
    if count == 0 and math.prod(max(dim, 1) for dim in shape) > _MAX_EMPTY_EXTENT:
        raise DecodeError(f"The empty {what} shape {list(shape)} is implausibly large")
    return tuple(shape)


def _check_bool_bytes(buffer: memoryview, what: str) -> None:
    """Bools must be 0 or 1: other bytes make torch and numpy bool ops disagree with themselves."""
    if buffer.tobytes().translate(None, b"\x00\x01"):
        raise DecodeError(f"A bool {what} holds bytes other than 0 and 1")


def _copy_bytes(buffer: memoryview) -> torch.Tensor:
    """An owned uint8 tensor holding ``buffer`` (read-only frames included, without torch's
    non-writable-buffer warning)."""
    out = torch.empty(buffer.nbytes, dtype=torch.uint8)
    out.numpy().data[:] = buffer
    return out


def decode_tensor(obj: Any, frames: Sequence[Any], share_mem: bool, budget: CopyBudget) -> torch.Tensor:
    """Rebuild a tensor: zero-copy over its aux frame with ``share_mem``, otherwise an owned copy
    (inline data is always copied, so the tensor never pins the msgpack body)."""
    name, shape, data = _triple(obj, "tensor")
    dtype = TORCH_DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        raise DecodeError(f"Unknown tensor dtype {short(name)}; expected one of {sorted(TORCH_DTYPES)}")
    buffer, is_aux = _data_buffer(data, frames, "tensor", budget)
    dims = _checked_shape(shape, dtype.itemsize, buffer.nbytes, "tensor")
    if buffer.nbytes == 0:
        return torch.empty(dims, dtype=dtype)
    view = is_aux and share_mem
    if dtype is torch.bool:
        budget.charge(buffer.nbytes, "tensor")
        _check_bool_bytes(buffer, "tensor")
    if not view:
        budget.charge(buffer.nbytes, "tensor")
    raw = torch.frombuffer(buffer, dtype=torch.uint8) if view else _copy_bytes(buffer)
    return raw.view(dtype).view(dims)


@functools.lru_cache(maxsize=256)
def _numpy_dtype(name: str) -> np.dtype[Any]:
    if not _NUMPY_DTYPE_STR.fullmatch(name):
        raise DecodeError(f"Unsupported ndarray dtype {short(name)}; expected a numeric dtype string such as '<f4'")
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError) as e:
        raise DecodeError(f"Unsupported ndarray dtype {short(name)}: {e}") from e
    if dtype.str != name or dtype.kind not in NUMPY_KINDS or dtype.itemsize == 0:
        raise DecodeError(f"Unsupported ndarray dtype {short(name)}; expected a sized numeric dtype such as '<f4'")
    return dtype


def decode_ndarray(obj: Any, frames: Sequence[Any], share_mem: bool, budget: CopyBudget) -> np.ndarray:
    name, shape, data = _triple(obj, "ndarray")
    if not isinstance(name, str):
        raise DecodeError(f"The ndarray dtype must be a string, got {describe(name)}")
    dtype = _numpy_dtype(name)
    buffer, is_aux = _data_buffer(data, frames, "ndarray", budget)
    dims = _checked_shape(shape, dtype.itemsize, buffer.nbytes, "ndarray")
    if buffer.nbytes == 0:
        return np.empty(dims, dtype=dtype)
    if dtype.kind == "b":
        budget.charge(buffer.nbytes, "ndarray")
        _check_bool_bytes(buffer, "ndarray")
    array = np.frombuffer(buffer, dtype=dtype)
    if not (is_aux and share_mem):
        budget.charge(buffer.nbytes, "ndarray")
        array = array.copy()
    return array.reshape(dims)
