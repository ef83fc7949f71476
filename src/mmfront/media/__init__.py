"""Media loading: images, audio and video from URLs, files, base64 and bytes, checked and decoded lazily.

Start with :class:`MediaConnector` (one per deployment) and a :class:`DecodeBudget` per request;
``load_image_bytes`` / ``load_audio_bytes`` / ``load_video_bytes`` load bytes you already have.
"""

from __future__ import annotations

from mmfront.media.audio import AudioWithRate, load_audio_bytes
from mmfront.media.budget import DecodeBudget, check_media_size
from mmfront.media.connector import (
    DecodedDataURL,
    MediaConnector,
    MediaSource,
    base64_length_fits,
    decode_base64,
    is_base64_header,
)
from mmfront.media.fetch import HttpFetcher, is_domain_allowed
from mmfront.media.image import (
    ImageIOOptions,
    convert_image_mode,
    has_alpha,
    load_image_bytes,
    normalize_pil_image,
    resolve_image_options,
)
from mmfront.media.resample import resample_audio, resampled_length
from mmfront.media.video import VideoIOOptions, load_video_bytes, resolve_video_options

__all__ = [
    "AudioWithRate",
    "DecodeBudget",
    "DecodedDataURL",
    "HttpFetcher",
    "ImageIOOptions",
    "MediaConnector",
    "MediaSource",
    "VideoIOOptions",
    "base64_length_fits",
    "check_media_size",
    "convert_image_mode",
    "decode_base64",
    "has_alpha",
    "is_base64_header",
    "is_domain_allowed",
    "load_audio_bytes",
    "load_image_bytes",
    "load_video_bytes",
    "normalize_pil_image",
    "resample_audio",
    "resampled_length",
    "resolve_image_options",
    "resolve_video_options",
]
