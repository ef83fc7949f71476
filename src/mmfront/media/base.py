"""A media object together with the bytes it was decoded from.

Hashing uses the bytes (cheaper than pixels, and stable), and the decode can be deferred: a
lazily loaded item holds only its bytes and a decode function, so a request whose items all hit
the processor cache never decodes anything.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import numpy as np
from PIL import Image

from mmfront.errors import InputTypeError

if TYPE_CHECKING:
    from mmfront.media.budget import DecodeBudget

T = TypeVar("T")

EXIF_IMAGE_ID = 0x800D  # Image.ExifTags.Base.ImageID, the tag vLLM reads (0xA420 is ImageUniqueID)


def exif_image_uuid(image: Image.Image) -> uuid.UUID | None:
    """The EXIF ``ImageID`` of ``image`` when it is a :class:`uuid.UUID` object, else ``None``.

    Only images built in memory can carry a UUID object there (EXIF read from bytes yields
    strings), which is how a client pins an image's identity. Malformed EXIF is ignored.
    """
    try:
        value = image.getexif().get(EXIF_IMAGE_ID)
    except Exception:
        return None
    return value if isinstance(value, uuid.UUID) else None


class MediaWithBytes(Generic[T]):
    """A media object together with the bytes it was decoded from.

    ``io_config`` records the decode settings that changed the media (e.g. an RGBA image
    composited onto a background colour); it is ``None`` when decoding was a plain decode, so
    the same bytes hash the same whichever way they were loaded. Attribute access, ``__array__``,
    iteration and indexing are forwarded to the media, so the wrapper behaves like it.

    Built with ``decode=`` instead of ``media``, the item is *lazy*: :attr:`media` decodes on
    first access (once, thread-safe), and :attr:`decode_count` tells tests how often that happened.
    ``info`` carries what the loader learned from the header without decoding (format, size, mode).
    ``budget`` is the request's decode budget the loader charged, so that a later stage which
    grows the media (audio resampling in the parser) charges the same request.

    An image loader may also pass ``decode_pixels``: a decode straight into the image's uint8
    (height, width, 3) RGB array (a plain JPEG: :func:`mmfront.media.jpeg.decode_jpeg_rgb`), which
    returns None where it cannot give exactly the pixels ``decode`` would. A lazy item asked for
    :attr:`pixels` first (a native processor: ``reads_pixels``) decodes that way, and :attr:`media`
    is then a PIL image made from the array on first access, at most once, for a consumer that
    needs PIL. A lazy item asked for :attr:`media` first decodes with ``decode`` as it always did
    (making PIL's image from an array costs more than the array saves), and :attr:`pixels` is None.
    """

    __slots__ = ("_decode", "_decode_pixels", "_lock", "_media", "_pixels", "budget", "decode_count", "info",
                 "io_config", "original_bytes", "prehashed")

    def __init__(
        self,
        media: T | None = None,
        original_bytes: bytes = b"",
        io_config: dict[str, Any] | None = None,
        *,
        decode: Callable[[], T] | None = None,
        decode_pixels: Callable[[], np.ndarray | None] | None = None,
        info: Mapping[str, Any] | None = None,
        budget: DecodeBudget | None = None,
    ) -> None:
        if (media is None) == (decode is None):
            raise InputTypeError("MediaWithBytes needs exactly one of `media` and `decode`", parameter="media")
        if decode_pixels is not None and decode is None:
            raise InputTypeError("MediaWithBytes's `decode_pixels` needs a `decode` to fall back on", parameter="media")
        self._media = media
        self._pixels: np.ndarray | None = None
        self._decode = decode
        self._decode_pixels = decode_pixels
        self._lock = threading.Lock()
        self.original_bytes = original_bytes
        self.io_config = io_config
        self.info: dict[str, Any] = dict(info or {})
        self.budget = budget
        self.decode_count = 0
        self.prehashed: dict[tuple[str, str], Any] = {}
        """Hasher states that already absorbed this item under a key, by ``(algorithm, key)``
        (see :func:`mmfront.hashing.prehash_media`)."""

    @property
    def is_decoded(self) -> bool:
        return self._media is not None or self._pixels is not None

    def ensure_decoded(self, *, pixels: bool = False) -> None:
        """Decode a lazy item now (once, thread-safe): with ``pixels``, into :attr:`pixels` where
        its loader offered that decode and it applies; otherwise, or where it does not, into
        :attr:`media`."""
        if not self.is_decoded:
            with self._lock:
                if not self.is_decoded:
                    array = self._decode_pixels() if pixels and self._decode_pixels is not None else None
                    if array is None:
                        assert self._decode is not None
                        self._media = self._decode()
                        self._decode = None
                    else:
                        self._pixels = array
                    self._decode_pixels = None
                    self.decode_count += 1

    @property
    def pixels(self) -> np.ndarray | None:
        """The decoded image as a uint8 (height, width, 3) RGB array, where the item was decoded
        straight into one (``decode_pixels``); None otherwise. Decodes a lazy item, into the
        array where it can."""
        self.ensure_decoded(pixels=True)
        return self._pixels

    @property
    def media(self) -> T:
        self.ensure_decoded()
        if self._media is None:
            with self._lock:
                if self._media is None:
                    assert self._pixels is not None
                    # only an image loader passes decode_pixels, so T is a PIL image here
                    self._media = cast(T, Image.fromarray(self._pixels))
                    self._decode = None
        return self._media

    def exif_image_uuid(self) -> uuid.UUID | None:
        """UUID ``ImageID`` of the decoded image, without forcing a decode: an item that is
        still lazy was read from bytes, and bytes cannot carry a UUID object."""
        if self._media is None or not isinstance(self._media, Image.Image):
            return None
        return exif_image_uuid(self._media)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.media, name)

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        pixels = self.pixels  # an array is wanted: no PIL image made for it
        return np.asarray(self.media if pixels is None else pixels, *args, **kwargs)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.media)  # type: ignore[call-overload]

    def __getitem__(self, index: Any) -> Any:
        return self.media[index]  # type: ignore[index]

    def __len__(self) -> int:
        return len(self.media)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        state = type(self._media).__name__ if self._media is not None else "pixels" if self._pixels is not None \
            else "lazy"
        return (f"MediaWithBytes({state}, {len(self.original_bytes)} bytes, io_config={self.io_config!r}, "
                f"info={self.info!r})")
