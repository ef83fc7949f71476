"""Issue 22, class 1: the default limits are safe on their own.

With the default config a 13000x13000 PNG (169 M pixels, under the old ``max_image_pixels`` of
179 M) took 5.6 s and 1.6 GiB, because only its decode (4 bytes a pixel) was measured against the
budget while the HF processor's copies took as much again; and a 5 MB text part was tokenized for
9 s and 1 GiB, because ``max_prompt_chars`` was unbounded without ``max_model_len``. Now
``max_image_pixels`` defaults to ``max_media_request_decode_bytes // 20`` (an image's whole peak
per pixel), and the prompt has a bound without ``max_model_len``.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import textwrap
import zlib
from pathlib import Path
from typing import Any

import pytest

import preloaded
from mmfront import MultiModalConfig
from mmfront.config import DEFAULT_MAX_PROMPT_CHARS, IMAGE_PEAK_BYTES_PER_PIXEL
from mmfront.errors import MediaTooLargeError, ValidationError
from mmfront.media import DecodeBudget, load_image_bytes
from mmfront.preprocess import InputPreprocessor

MiB = 1 << 20
SLACK = 8 * MiB
"""Allocator noise: the image path is warmed first, so the rest of the peak is the image's."""


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` RGB pixels and holds almost none of them."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + _chunk(b"IEND", b""))


@pytest.mark.filterwarnings("ignore::PIL.Image.DecompressionBombWarning")  # Pillow's own, at 89 M pixels
def test_a_169_megapixel_png_is_refused_from_its_header_by_default() -> None:
    config = MultiModalConfig()
    budget = DecodeBudget.from_config(config)
    with pytest.raises(MediaTooLargeError, match=r"13000x13000 = 169000000 pixels, more than max_image_pixels="
                                                 r"35791394, derived from max_media_request_decode_bytes") as info:
        load_image_bytes(png_header(13000, 13000), config=config, budget=budget)
    assert info.value.parameter == "multi_modal_data" and budget.used_bytes == 0


def test_the_pixel_limit_follows_the_budget_unless_set() -> None:
    default = MultiModalConfig()
    assert default.max_image_pixels is None
    assert default.image_pixel_limit == default.max_media_request_decode_bytes // IMAGE_PEAK_BYTES_PER_PIXEL
    assert default.image_pixel_limit * IMAGE_PEAK_BYTES_PER_PIXEL <= default.max_media_request_decode_bytes
    smaller = default.replace(max_media_request_decode_bytes=160 * MiB)
    assert smaller.image_pixel_limit == 8 * MiB  # derived again, not carried over
    assert default.replace(max_image_pixels=200_000_000).image_pixel_limit == 200_000_000  # raised knowingly
    assert MultiModalConfig(max_media_request_decode_bytes=8).image_pixel_limit == 1


_PEAK_SCRIPT = textwrap.dedent("""
    import base64, io, json, math, sys, tempfile
    from pathlib import Path
    import numpy as np
    from PIL import Image
    from mmfront.config import MultiModalConfig
    from mmfront.preprocess import InputPreprocessor
    from mmfront.testing.models import build_model_folder, fixture_model_impl

    def kib(key):
        return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith(key))

    kind, budget = sys.argv[1], int(sys.argv[2])
    config = MultiModalConfig(max_media_request_decode_bytes=budget, model_impl=fixture_model_impl(kind))
    # The largest square image both limits let through: the pixel limit, and the decode charge (4 B/px).
    side = math.isqrt(min(config.image_pixel_limit, budget // 4))
    pixels = np.zeros((side, side, 3), dtype=np.uint8)
    pixels[::7, ::5] = 200
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    del pixels
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    pre = InputPreprocessor(build_model_folder(kind, Path(tempfile.mkdtemp())), config)
    small = io.BytesIO()
    Image.fromarray(np.full((64, 48, 3), 9, dtype=np.uint8)).save(small, format="PNG")
    warm = "data:image/png;base64," + base64.b64encode(small.getvalue()).decode()
    pre.preprocess([{"role": "user", "content": [{"type": "text", "text": "hi"},  # warm: imports, first-use buffers
                                                 {"type": "image_url", "image_url": {"url": warm}}]}])
    before = kib("VmRSS")
    pre.preprocess([{"role": "user", "content": [{"type": "text", "text": "hi"},
                                                 {"type": "image_url", "image_url": {"url": url}}]}])
    print(json.dumps({"side": side, "peak": (kib("VmHWM") - before) * 1024}))
""")


@pytest.mark.parametrize("kind", ["gemma3", "idefics3", "emu3"])
def test_the_largest_image_the_defaults_accept_stays_inside_its_budget(kind: str) -> None:
    budget = 128 * MiB
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p))
    done = preloaded.run([sys.executable, "-c", _PEAK_SCRIPT, kind, str(budget)], env=env, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["peak"] <= budget + SLACK, result


# --- the prompt -----------------------------------------------------------------------------------


@pytest.fixture
def pre(gemma3_dir: Path) -> InputPreprocessor:
    return InputPreprocessor(gemma3_dir, MultiModalConfig())


def test_a_5mb_text_part_is_refused_before_tokenizing_by_default(
    pre: InputPreprocessor, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the prompt was tokenized")

    monkeypatch.setattr(pre.tokenizer, "encode", fail)
    messages = [{"role": "user", "content": [{"type": "text", "text": "x" * 5_000_000}]}]
    with pytest.raises(ValidationError, match=r"^The prompt has 50000[0-9]{2} characters; the limit is 524288 "
                                              r"\(the default bound without max_model_len") as info:
        pre.preprocess(messages)
    assert info.value.parameter == "prompt"
    assert "max_prompt_chars" in str(info.value)


def test_the_default_prompt_bound_without_max_model_len(pre: InputPreprocessor) -> None:
    assert pre.processor.info.max_prompt_chars == DEFAULT_MAX_PROMPT_CHARS == 524_288
    with pytest.raises(ValidationError, match=f"^The prompt has {DEFAULT_MAX_PROMPT_CHARS + 1} characters"):
        pre.preprocess("a" * (DEFAULT_MAX_PROMPT_CHARS + 1))
    assert len(pre.preprocess("word " * 2_000)["prompt_token_ids"]) > 2_000


def test_max_model_len_and_an_explicit_bound_still_decide(gemma3_dir: Path) -> None:
    with_len = InputPreprocessor(gemma3_dir, MultiModalConfig(max_model_len=1_000_000))
    longest = max(len(token) for token in with_len.tokenizer.get_vocab())
    assert with_len.processor.info.max_prompt_chars == 1_000_000 * longest  # nothing that fits is refused
    raised = InputPreprocessor(gemma3_dir, MultiModalConfig(max_prompt_chars=2_000_000))
    assert raised.processor.info.max_prompt_chars == 2_000_000
