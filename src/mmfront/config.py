"""One typed configuration for every mmfront knob, with vLLM's names and defaults.

Validated on construction: a bad value raises :class:`~mmfront.errors.ConfigError` naming the
field and what would be accepted, so a misconfigured server fails at start-up, not on the first
request.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from difflib import get_close_matches
from pathlib import Path
from typing import Any, Literal

from mmfront.errors import ConfigError
from mmfront.flags import count, flag, human_int, port, positive_int

GiB_bytes = 1 << 30
MiB_bytes = 1 << 20

MODALITIES = ("image", "audio", "video")
"""Modalities mmfront knows; items of any other key are rejected with a typed error."""

DEFAULT_LIMIT_PER_PROMPT = 999

IMAGE_PEAK_BYTES_PER_PIXEL = 20
"""What one image costs per pixel at its peak in a request, decode and HF processing together
(10-17 measured across the shipped processors, docs/security.md): ``max_image_pixels`` defaults to
``max_media_request_decode_bytes`` divided by it, so the largest image accepted fits the budget."""
DEFAULT_MAX_PROMPT_CHARS = 1 << 19
"""``max_prompt_chars`` without ``max_model_len``: about 128 Ki tokens of English; tokenizing that
many characters takes at most ~2.5 s and ~350 MB (CJK text, 3 tokens per character)."""

DEFAULT_IMAGE_FORMATS = frozenset({"PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"})
"""Pillow formats accepted by default: what users of vLLM's API send. Any other format Pillow
opens may be added, except :data:`UNSAFE_IMAGE_FORMATS`. ``JPEG`` covers multi-picture JPEGs
(``MPO``, from cameras), which Pillow opens through its JPEG plugin."""

UNSAFE_IMAGE_FORMATS = {
    "ICO": "Pillow decodes an ICO's largest picture while opening it, before any limit can be checked",
    "ICNS": "an ICNS entry holds a PNG or JPEG 2000 of any size, which its header does not state",
    "EPS": "Pillow renders EPS by running Ghostscript",
    **dict.fromkeys(("WMF", "BUFR", "GRIB", "HDF5", "MPEG"), "Pillow only identifies it and cannot decode it"),
}
"""Formats that cannot be allowed, and why (vLLM also refuses the last five)."""

HasherAlgorithm = Literal["blake3", "sha256", "sha512"]
CacheType = Literal["lru", "shm"]
TransformersBackend = Literal["auto", "legacy", "offsets"]
ModelDtype = Literal["auto", "float32", "bfloat16", "float16"]
ModelImpl = Literal["auto", "vllm", "transformers"]
ContentFormatSetting = Literal["auto", "string", "openai"]
LaneExecutorKind = Literal["process", "ray"]


def _check_image_formats(formats: frozenset[str]) -> None:
    """Every name is a format Pillow opens, and none is unsafe to open."""
    from PIL import Image

    Image.init()
    for name in sorted(formats):
        if name in UNSAFE_IMAGE_FORMATS:
            raise ConfigError(f"allowed_image_formats cannot include {name}: {UNSAFE_IMAGE_FORMATS[name]}. "
                              "Convert such images to PNG before sending them.")
        if name not in Image.OPEN and name != "MPO":
            raise ConfigError(f"allowed_image_formats has {name!r}, which is not an image format Pillow opens; "
                              f"use names like {sorted(DEFAULT_IMAGE_FORMATS)}")


logger = logging.getLogger(__name__)

DEFAULT_RPC_PORT = 29550
"""vLLM's default ``--data-parallel-rpc-port``, where headless engines meet the API server."""


def chat_template_text(value: str) -> str:
    """vLLM's ``--chat-template``: a file's path (its text is read) or the template itself."""
    path = Path(value).expanduser()
    try:
        return path.read_text(encoding="utf-8") if path.is_file() else value
    except OSError:
        return value


@dataclass(frozen=True)
class DataParallelConfig:
    """Where the API server (P0) meets its engines, in vLLM's names: ``data_parallel_size`` ranks,
    the first ``data_parallel_size_local`` of them on this host; remote (headless) ones reach
    ``tcp://data_parallel_address:data_parallel_rpc_port``."""

    data_parallel_size: int = field(default=1, metadata=flag(aliases=("-dp",), parse=positive_int, metavar="N"))
    """Engine ranks."""
    data_parallel_size_local: int | None = field(default=None, metadata=flag(aliases=("-dpl",), parse=count,
                                                                             metavar="N", shown_default="all"))
    """Ranks started on this host by ``mmfront serve`` (the engines ``--engine`` names); ``None``:
    every rank; ``0``: none, every engine is headless and connects to the handshake port."""
    data_parallel_address: str = field(default="127.0.0.1", metadata=flag(aliases=("-dpa",), metavar="HOST"))
    """Where headless engines reach the API server's handshake and data sockets."""
    data_parallel_rpc_port: int = field(default=DEFAULT_RPC_PORT, metadata=flag(aliases=("-dpp",), parse=port,
                                                                                metavar="PORT"))
    """The handshake port headless engines connect to."""

    def __post_init__(self) -> None:
        if isinstance(self.data_parallel_size, bool) or not 1 <= self.data_parallel_size < 1 << 16:
            raise ConfigError(f"data_parallel_size must be in [1, 65535], got {self.data_parallel_size}.")
        if self.data_parallel_size_local is None:
            object.__setattr__(self, "data_parallel_size_local", self.data_parallel_size)
        if not 0 <= self.local_ranks <= self.data_parallel_size:
            raise ConfigError(f"data_parallel_size_local must be in [0, data_parallel_size={self.data_parallel_size}], "
                              f"got {self.data_parallel_size_local}.")
        if not 0 <= self.data_parallel_rpc_port < 1 << 16:
            raise ConfigError(f"data_parallel_rpc_port must be a port number, got {self.data_parallel_rpc_port}.")

    @property
    def local_ranks(self) -> int:
        """``data_parallel_size_local``, resolved: the ranks on this host."""
        return self.data_parallel_size if self.data_parallel_size_local is None else self.data_parallel_size_local

    @property
    def all_local(self) -> bool:
        return self.local_ranks == self.data_parallel_size


@dataclass(frozen=True)
class ModelOption:
    """A deployment setting a model module declares (an integer with a floor), read with
    :meth:`MultiModalConfig.model_option`: the key belongs to the model, and its check to the
    config, which names no model."""

    name: str
    default: int
    minimum: int
    doc: str
    """One line for the configuration reference (docs/index.md)."""

    def refuse(self, value: object) -> str | None:
        """Why ``value`` cannot be this option's value, or None."""
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            return f"must be an integer >= {self.minimum}, got {value!r}"
        return None


@dataclass(frozen=True)
class ModalityLimit:
    """``--limit-mm-per-prompt`` for one modality: a count plus optional dummy sizes."""

    count: int
    width: int | None = None
    height: int | None = None
    length: int | None = None


def _parse_limit(modality: str, value: Any) -> ModalityLimit:
    if isinstance(value, ModalityLimit):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, Mapping)):
        raise ConfigError(
            f"limit_mm_per_prompt[{modality!r}] must be a count or a mapping like "
            f"{{'count': 2, 'width': 512, 'height': 512}}, got {value!r}"
        )
    if isinstance(value, int):
        value = {"count": value}
    unknown = set(value) - {"count", "width", "height", "length"}
    if unknown:
        raise ConfigError(f"limit_mm_per_prompt[{modality!r}] has unknown keys {sorted(unknown)}; "
                          "use count, width, height, length")
    if "count" not in value:
        raise ConfigError(f"limit_mm_per_prompt[{modality!r}] has no 'count'; give the number of items, "
                          f"e.g. {({'count': 2, **value})!r}")
    limit = ModalityLimit(**value)
    for name in ("count", "width", "height", "length"):
        v = getattr(limit, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise ConfigError(f"limit_mm_per_prompt[{modality!r}].{name} must be a non-negative integer, got {v!r}")
    return limit


@dataclass(frozen=True)
class MultiModalConfig:
    """Every knob of the frontend. Field names follow vLLM's CLI flags without the dashes."""

    # --- processor cache (vLLM: --mm-processor-cache-*) ---
    mm_processor_cache_gb: float = field(default=4.0, metadata=flag(metavar="GB"))
    """Processor cache size in GiB, in the API server (P0) and in each engine (P1); 0 turns it off."""
    mm_processor_cache_type: CacheType = field(default="lru", metadata=flag())
    """``lru``: the engine mirrors the API server's LRU and only misses are sent. ``shm``: items go
    through a shared-memory ring (engines on this host only)."""
    mm_shm_cache_max_object_size_mb: int | None = field(default=None, metadata=flag(parse=positive_int, metavar="MB"))
    """Largest item the shm cache stores (default 128 MiB). Only used by the shm cache: with ``lru`` it
    is ignored (logged at debug level), as in vLLM, whose default always sets it."""
    mm_hasher_algorithm: HasherAlgorithm = field(default="blake3", metadata=flag())
    """Content hash of media items: ``sha256``/``sha512`` for FIPS deployments; blake3 is several times faster."""

    # --- request limits and processor kwargs ---
    limit_mm_per_prompt: Mapping[str, Any] = field(default_factory=dict, metadata=flag(
        metavar="JSON", example="'{\"image\": 4, \"audio\": 1}'", shown_default="999 each"))
    """Most items per modality in one prompt, e.g. ``{"image": 2}`` or
    ``{"image": {"count": 2, "width": 512, "height": 512}}``."""
    limit_per_prompt: Mapping[str, Any] | None = field(default=None, repr=False, compare=False)
    """vLLM's dataclass name for ``limit_mm_per_prompt`` (its CLI flag is ``--limit-mm-per-prompt``):
    either may be given, not both; it is folded into ``limit_mm_per_prompt``."""
    mm_processor_kwargs: Mapping[str, Any] | None = field(default=None, metadata=flag(
        metavar="JSON", example="'{\"do_pan_and_scan\": true}'"))
    """Deployment-wide HF processor kwargs, a JSON object on the command line; request kwargs
    override them. Not part of the hashes."""
    model_options: Mapping[str, Any] = field(default_factory=dict)
    """Settings a model module declares for itself (a :class:`ModelOption` each, listed in
    docs/index.md), e.g. ``{"max_pan_and_scan_crops": 4}``. Checked against the installed
    models' declarations when the processor is created."""
    media_io_kwargs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, metadata=flag(
        metavar="JSON", example="'{\"image\": {\"rgba_background_color\": [0, 0, 0]}}'"))
    """Per-modality media loading options, e.g. ``{"image": {"rgba_background_color": [0, 0, 0]}}``."""
    enable_mm_embeds: bool = field(default=False, metadata=flag())
    """Accept precomputed ``{modality}_embeds`` inputs (``image_embeds``, ``audio_embeds``)."""

    # --- model-level settings the frontend needs ---
    dtype: ModelDtype = field(default="auto", metadata=flag())
    """Model dtype (vLLM's ``--dtype``): floating processor outputs are cast to it, and the engines
    ``mmfront serve`` starts load the model in it. ``auto`` is what vLLM resolves for a GPU engine:
    the folder's ``torch_dtype``, a float32 checkpoint served as bfloat16."""
    model_impl: ModelImpl = field(default="auto", metadata=flag())
    """The implementation vLLM's engine runs (vLLM's ``--model-impl``), which decides what it must
    receive. ``auto``: vLLM 0.33's native class where it has one for the folder's architecture, else its
    transformers backend; ``vllm``: the native class (refused where there is none); ``transformers``:
    its transformers backend. A family whose native inputs mmfront has not proven equal to vLLM's is
    refused for ``auto``/``vllm`` (docs/models.md)."""
    mm_device_do_normalize: bool | None = field(default=None, metadata=flag(negation="--no-mm-device-do-normalize"))
    """vLLM's ``--mm-device-do-normalize``: send raw uint8 pixels and let the engine normalise them on
    the GPU. Unset: vLLM's default for the native class (on for Qwen2-VL, Qwen2.5-VL, Qwen3-VL,
    GLM-4.1V, Mistral 3, ...); where the class cannot, it is turned off, as vLLM does."""
    max_model_len: int | None = field(default=None, metadata=flag(parse=human_int, metavar="TOKENS"))
    """Longest prompt plus output accepted, in tokens (``8192``, ``8k``, ``8K`` on the command line);
    the engines' own limit still applies, the lower one wins. ``None``: the engines' limit alone."""
    max_prompt_chars: int | None = None
    """Longest prompt string (after the chat template) that is tokenized at all. ``None``: derived
    from ``max_model_len`` as ``max_model_len`` times the longest token string of the vocabulary
    (no longer prompt can fit), :data:`DEFAULT_MAX_PROMPT_CHARS` without ``max_model_len``. Set it
    for tokenizers whose normalizer drops characters, which the derived bound does not count."""
    encoder_cache_size: int | None = None
    """Most embedding tokens one item may have; ``None`` means no limit is checked."""
    enable_prefix_caching: bool = field(default=True, metadata=flag(negation="--disable-prefix-caching"))
    """Whether the engines cache prefixes (match the engines' setting): with both this and the
    processor cache off, items get per-request UUIDs instead of content hashes."""
    enable_tower_connector_lora: bool = field(default=False, metadata=flag())
    """Prefix ``identifier`` with the LoRA name, separating encoder/prefix caches per LoRA."""
    transformers_backend: TransformersBackend = field(default="auto", metadata=flag(vllm=False))
    """Transformers-backend processor: ``auto`` picks Offsets on transformers >= 5.15 (Legacy for a processor
    that reports no offsets), Legacy below."""

    # --- chat templates (vLLM: --chat-template, --chat-template-content-format, --trust-request-chat-template) ---
    chat_template: str | None = field(default=None, metadata=flag(parse=chat_template_text, metavar="TEMPLATE"))
    """The deployment's chat template, used instead of the model's (a folder without one needs it);
    on the command line, the template or the path of a file holding one."""
    chat_template_content_format: ContentFormatSetting = field(default="auto", metadata=flag())
    """``auto`` detects whether a template reads content as parts (``openai``) or as text (``string``)."""
    trust_request_chat_template: bool = field(default=False, metadata=flag())
    """Accept a ``chat_template`` sent with a request (bounded in size and render time); refused otherwise."""

    # --- processing lanes and threads (docs/processing.md, "Lanes") ---
    mm_processing_lanes: int | None = field(default=0, metadata=flag(
        name="--processing-lanes", vllm=False, parse=count, metavar="N", default=None,
        shown_default="none where mmfront's kernels process a miss, else cores - 1, at least 1"))
    """Worker processes (or Ray actors) that HF-process cache misses, each item of a request on
    its own lane; hashing and the cache commit stay in the calling process. ``0``: in the calling
    process, on the threads that prepare requests. ``None``: in the calling process where a miss's
    pixel work runs in mmfront's own kernels (Gemma 3, the Qwen2-VL family on transformers 5.15
    and later), else one lane per core of the thread budget but one (at least 1)."""
    mm_lane_executor: LaneExecutorKind = field(default="process", metadata=flag(name="--lane-executor", vllm=False))
    """``process``: local worker processes. ``ray``: Ray actors (``pip install mmfront[ray]``),
    for when one machine's cores are not enough."""
    mm_thread_budget: int | None = field(default=None, metadata=flag(
        name="--thread-budget", vllm=False, parse=positive_int, metavar="N"))
    """Runnable threads the frontend's processing may use at once (torch threads, image decode
    threads and lanes together); ``None``: the cores this process may run on."""

    # --- deployment shape (decides the cache type, vLLM §4.5) ---
    api_process_count: int = 1
    """API server processes, each with its own processor cache."""
    data_parallel_size: int = 1
    """Engine ranks; with more than one, the processor cache is the mirrored LRU."""
    data_parallel_external_lb: bool = False
    """Whether an external load balancer spreads requests over the ranks (vLLM's ``--data-parallel-external-lb``)."""

    # --- loading the model folder ---
    tokenizer: str | None = field(default=None, metadata=flag(metavar="DIR_OR_ID"))
    """The folder to load the tokenizer from instead of the model's (``None``: the model's); ``mmfront
    serve`` also takes a hub id, resolved as ``MODEL`` is, at ``--tokenizer-revision``."""
    trust_remote_code: bool = field(default=False, metadata=flag())
    """Let transformers run the code a model folder ships (``auto_map``) to load its processor,
    tokenizer and config; off, such a folder is refused."""

    # --- media loading ---
    allowed_local_media_path: str | None = field(default=None, metadata=flag(metavar="DIR"))
    """Local (``file://``) media is readable only below this absolute directory; ``None`` (or ``""``,
    vLLM's default) refuses every local path."""
    allowed_media_domains: tuple[str, ...] | None = field(default=None, metadata=flag(metavar="HOST"))
    """Hosts http(s) media may come from (exact, ``*.example.com`` or ``*``); ``None``: any host, as
    vLLM. A host is fetched only at a public address unless named here (not by ``*``): loopback,
    private, link-local and the server's own addresses are refused otherwise. ``()`` refuses every URL."""
    allowed_image_formats: frozenset[str] = DEFAULT_IMAGE_FORMATS
    """Pillow formats tried at all; ICO, ICNS, EPS and Pillow's stubs cannot be added (:data:`UNSAFE_IMAGE_FORMATS`)."""
    max_image_pixels: int | None = None
    """Images with more pixels are refused from their header, before decoding (decompression bombs).
    ``None``: ``max_media_request_decode_bytes // 20`` (:data:`IMAGE_PEAK_BYTES_PER_PIXEL`), 35.8 M
    pixels by default, so one image at the limit, decoded and processed, fits the request's budget
    (read :attr:`image_pixel_limit`)."""
    max_media_request_decode_bytes: int = 715_827_880
    """Decoded bytes one request may spend: an image is charged the peak memory of its decode,
    mode conversion included (``w*h*4`` for an RGB PNG, more for WebP or a palette with transparency)."""
    max_media_bytes: int = 64 * MiB_bytes
    """Largest encoded media payload accepted from any source."""
    image_fetch_timeout: float = 5.0
    """Seconds an http(s) image may take to fetch."""
    audio_fetch_timeout: float = 10.0
    """Seconds an http(s) audio clip may take to fetch."""
    video_fetch_timeout: float = 30.0
    """Seconds an http(s) video may take to fetch."""
    max_video_duration: float = 600.0
    """Longest video accepted, in seconds (from the container header, before decoding): decoding
    runs through every frame up to the last one kept, so the length bounds the decode time."""
    max_video_frames: int = 36_000
    """Most frames a video may have (10 minutes at 60 fps), for the same reason."""
    image_mode: str = "RGB"
    """The PIL mode images are converted to."""
    rgba_background_color: tuple[int, int, int] = (255, 255, 255)
    """What transparent pixels become when an image is converted to RGB (white)."""

    def __post_init__(self) -> None:
        self._check_number("mm_processor_cache_gb", self.mm_processor_cache_gb, minimum=0)
        self._check_choice("mm_processor_cache_type", self.mm_processor_cache_type, ("lru", "shm"))
        if self.mm_shm_cache_max_object_size_mb is not None:
            self._check_int("mm_shm_cache_max_object_size_mb", self.mm_shm_cache_max_object_size_mb, minimum=1)
            if self.mm_processor_cache_type != "shm":
                logger.debug("mm_shm_cache_max_object_size_mb=%s is ignored: mm_processor_cache_type is %r, not 'shm'.",
                             self.mm_shm_cache_max_object_size_mb, self.mm_processor_cache_type)
        if self.limit_per_prompt is not None:
            if self.limit_mm_per_prompt:
                raise ConfigError("limit_per_prompt is vLLM's name for limit_mm_per_prompt; give one of them, not both.")
            object.__setattr__(self, "limit_mm_per_prompt", self.limit_per_prompt)
            object.__setattr__(self, "limit_per_prompt", None)
        if self.allowed_local_media_path == "":
            object.__setattr__(self, "allowed_local_media_path", None)  # vLLM's default: no local files
        self._check_choice("mm_hasher_algorithm", self.mm_hasher_algorithm, ("blake3", "sha256", "sha512"))
        self._check_choice("dtype", self.dtype, ("auto", "float32", "bfloat16", "float16"))
        self._check_choice("transformers_backend", self.transformers_backend, ("auto", "legacy", "offsets"))
        self._check_choice("model_impl", self.model_impl, ("auto", "vllm", "transformers"))
        if self.mm_device_do_normalize is not None and not isinstance(self.mm_device_do_normalize, bool):
            raise ConfigError(f"mm_device_do_normalize must be true, false or unset, got {self.mm_device_do_normalize!r}")
        self._check_choice("chat_template_content_format", self.chat_template_content_format,
                           ("auto", "string", "openai"))
        if self.chat_template is not None and (not isinstance(self.chat_template, str) or not self.chat_template.strip()):
            raise ConfigError("chat_template must be the text of a Jinja chat template (read a .jinja file with "
                              f"Path.read_text()), got {self.chat_template!r}")
        if not isinstance(self.limit_mm_per_prompt, Mapping):
            raise ConfigError(f"limit_mm_per_prompt must be a mapping modality -> count, got {self.limit_mm_per_prompt!r}")
        unknown_modalities = sorted(map(repr, set(self.limit_mm_per_prompt) - set(MODALITIES)))
        if unknown_modalities:
            raise ConfigError(f"limit_mm_per_prompt has unknown modalities {', '.join(unknown_modalities)}; "
                              f"use {', '.join(MODALITIES)}")
        limits = {m: _parse_limit(m, v) for m, v in self.limit_mm_per_prompt.items()}
        object.__setattr__(self, "limit_mm_per_prompt", limits)
        if self.mm_processor_kwargs is not None and not isinstance(self.mm_processor_kwargs, Mapping):
            raise ConfigError(f"mm_processor_kwargs must be a mapping, got {type(self.mm_processor_kwargs).__name__}")
        if not isinstance(self.media_io_kwargs, Mapping) or not all(
            isinstance(v, Mapping) for v in self.media_io_kwargs.values()
        ):
            raise ConfigError("media_io_kwargs must map a modality to a mapping of options, e.g. "
                              "{'image': {'rgba_background_color': [0, 0, 0]}}")
        for name in ("max_model_len", "encoder_cache_size", "max_prompt_chars"):
            value = getattr(self, name)
            if value is not None:
                self._check_int(name, value, minimum=1)
        self._check_choice("mm_lane_executor", self.mm_lane_executor, ("process", "ray"))
        if self.mm_processing_lanes is not None:
            self._check_int("mm_processing_lanes", self.mm_processing_lanes, minimum=0)
        if self.mm_thread_budget is not None:
            self._check_int("mm_thread_budget", self.mm_thread_budget, minimum=1)
        if not isinstance(self.model_options, Mapping) or not all(isinstance(k, str) for k in self.model_options):
            raise ConfigError(f"model_options must map option names to values, e.g. {{'max_pan_and_scan_crops': 4}}, "
                              f"got {self.model_options!r}")
        object.__setattr__(self, "model_options", dict(self.model_options))
        for name in ("api_process_count", "data_parallel_size"):
            self._check_int(name, getattr(self, name), minimum=1)
        if self.max_image_pixels is not None:
            self._check_int("max_image_pixels", self.max_image_pixels, minimum=1)
        for name in ("max_media_request_decode_bytes", "max_media_bytes"):
            self._check_int(name, getattr(self, name), minimum=1)
        self._check_int("max_video_frames", self.max_video_frames, minimum=1)
        for name in ("image_fetch_timeout", "audio_fetch_timeout", "video_fetch_timeout", "max_video_duration"):
            self._check_number(name, getattr(self, name), minimum=0, exclusive=True)
        if self.allowed_local_media_path is not None:
            path = self.allowed_local_media_path
            if not isinstance(path, str) or not os.path.isabs(path) or not os.path.isdir(path):
                raise ConfigError(f"allowed_local_media_path must be an existing absolute directory, got {path!r}")
        if self.allowed_media_domains is not None:
            domains = self.allowed_media_domains
            if not isinstance(domains, (list, tuple, set, frozenset)) or not all(isinstance(d, str) and d for d in domains):
                raise ConfigError(f"allowed_media_domains must be a list of host names, got {domains!r}")
            object.__setattr__(self, "allowed_media_domains", tuple(d.lower() for d in domains))
        formats = self.allowed_image_formats
        if not isinstance(formats, (list, tuple, set, frozenset)) or not all(isinstance(f, str) for f in formats):
            raise ConfigError(f"allowed_image_formats must be a set of Pillow format names like {{'PNG', 'JPEG'}}, "
                              f"got {formats!r}")
        formats = frozenset(f.upper() for f in formats)
        _check_image_formats(formats)
        object.__setattr__(self, "allowed_image_formats", formats)
        color = self.rgba_background_color
        if (not isinstance(color, (list, tuple)) or len(color) != 3
                or not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 255 for c in color)):
            raise ConfigError(f"rgba_background_color must be three integers in 0..255, got {self.rgba_background_color!r}")
        object.__setattr__(self, "rgba_background_color", tuple(color))

    # --- derived values ---

    @property
    def mm_processor_cache_bytes(self) -> int:
        return int(self.mm_processor_cache_gb * GiB_bytes)

    @property
    def mm_shm_cache_max_object_size_bytes(self) -> int:
        return (self.mm_shm_cache_max_object_size_mb or 128) * MiB_bytes

    @property
    def image_pixel_limit(self) -> int:
        """The pixels an image may have: ``max_image_pixels``, or derived from the decode budget."""
        if self.max_image_pixels is not None:
            return self.max_image_pixels
        return max(1, self.max_media_request_decode_bytes // IMAGE_PEAK_BYTES_PER_PIXEL)

    @property
    def needs_content_hashes(self) -> bool:
        """Whether an item without a UUID is keyed by its content hash. Only a cache can hit on
        it (the processor cache, the engine's prefix cache); with both off, items are named per
        request instead, and hashing would be wasted work."""
        return self.mm_processor_cache_gb > 0 or self.enable_prefix_caching

    def get_limit_per_prompt(self, modality: str) -> int:
        limit = self.limit_mm_per_prompt.get(modality)
        return DEFAULT_LIMIT_PER_PROMPT if limit is None else limit.count

    def get_dummy_options(self, modality: str) -> ModalityLimit | None:
        return self.limit_mm_per_prompt.get(modality)

    def model_option(self, option: ModelOption) -> int:
        """``option``'s value: the deployment's, else the model module's default."""
        return int(self.model_options.get(option.name, option.default))

    def check_model_options(self, declared: Mapping[str, ModelOption]) -> None:
        """Refuse a ``model_options`` key no installed model declares (a typo would otherwise be
        ignored) and a value out of its option's range."""
        for name, value in self.model_options.items():
            option = declared.get(name)
            if option is None:
                close = get_close_matches(name, declared, n=1, cutoff=0.6)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"MultiModalConfig.model_options has {name!r}, which no installed model declares."
                                  f"{hint} Declared options: {sorted(declared) or 'none'}.")
            reason = option.refuse(value)
            if reason is not None:
                raise ConfigError(f"MultiModalConfig.model_options.{name} {reason}")

    def replace(self, **changes: Any) -> MultiModalConfig:
        return dataclasses.replace(self, **changes)

    # --- checks ---

    @staticmethod
    def _check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
        if value not in choices:
            raise ConfigError(f"{name} must be one of {list(choices)}, got {value!r}")

    @staticmethod
    def _check_int(name: str, value: object, *, minimum: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")

    @staticmethod
    def _check_number(name: str, value: object, *, minimum: float, exclusive: bool = False) -> None:
        ok = (
            not isinstance(value, bool)
            and isinstance(value, (int, float))
            and math.isfinite(value)
            and (value > minimum if exclusive else value >= minimum)
        )
        if not ok:
            op = ">" if exclusive else ">="
            raise ConfigError(f"{name} must be a finite number {op} {minimum}, got {value!r}")
