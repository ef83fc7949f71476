"""Hostile AAC and Opus files: FFmpeg (through PyAV) parses audio from requests in the server's own
process since mmfront decodes what vLLM's loader falls back to PyAV for. A valid clip with bytes
overwritten, cut short or repeated is loaded and decoded: the outcome is the waveform or one of
mmfront's typed errors (``MMFrontError``: corrupt, unsupported or over the budget), never another
exception, and a decode never takes more than the request's budget allows.

The clips are encoded here by PyAV (AAC in MP4, Opus in WebM); hypothesis draws the damage."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmfront.config import MultiModalConfig
from mmfront.errors import MediaFormatError, MMFrontError
from mmfront.media import DecodeBudget, load_audio_bytes
from mmfront.testing.media import encoded_audio

pytest.importorskip("av")

BUDGET = 8 << 20
"""A request's decode budget here: 1 s clips decode to about 0.4 MB charged."""


def _clip(container: str, codec: str, rate: int) -> bytes:
    return encoded_audio((0.1 * np.sin(np.arange(rate) / 5)).astype(np.float32)[None], rate, container=container,
                         codec=codec)


CLIPS = {"aac": _clip("mp4", "aac", 16000), "opus": _clip("webm", "libopus", 48000)}


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """A clip with some of: bytes overwritten at random places, a cut, a stretch repeated."""
    data = bytearray(CLIPS[draw(st.sampled_from(sorted(CLIPS)))])
    for _ in range(draw(st.integers(0, 8))):
        at = draw(st.integers(0, len(data) - 1))
        data[at:at + 4] = draw(st.binary(min_size=1, max_size=4))
    if draw(st.booleans()):
        del data[draw(st.integers(8, len(data))):]
    if draw(st.booleans()):
        start = draw(st.integers(0, len(data) - 1))
        data[start:start] = data[start:start + draw(st.integers(1, 512))] * draw(st.integers(1, 64))
    return bytes(data)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=damaged())
def test_a_damaged_clip_decodes_or_is_a_typed_error(data: bytes) -> None:
    config = MultiModalConfig()
    budget = DecodeBudget(BUDGET)
    try:
        item = load_audio_bytes(data, config=config, budget=budget)
        waveform, rate = item.media
    except MMFrontError:
        assert budget.used_bytes <= BUDGET
        return
    assert waveform.dtype == np.float32 and waveform.ndim == 1 and rate > 0
    assert budget.used_bytes <= BUDGET


@pytest.mark.parametrize("name", sorted(CLIPS))
def test_the_clips_decode_undamaged(name: str) -> None:
    """So a damaged clip that fails fails by its damage."""
    item = load_audio_bytes(CLIPS[name], config=MultiModalConfig(), budget=DecodeBudget(BUDGET))
    assert len(item.media[0]) > 0


def test_a_track_of_a_codec_ffmpeg_lacks_is_refused_by_name() -> None:
    """Found by the property above: a WebM track whose codec id FFmpeg does not know has no codec
    context (PyAV gives None), which was read as one."""
    data = CLIPS["opus"].replace(b"A_OPUS", b"A_QQQQ")
    with pytest.raises(MediaFormatError, match="Unknown audio in this container is not decoded"):
        load_audio_bytes(data, config=MultiModalConfig(), budget=DecodeBudget(BUDGET))
