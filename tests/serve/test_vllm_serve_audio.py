"""``mmfront serve`` and ``vllm serve`` side by side on Qwen2-Audio, each in front of a STOCK vLLM
0.33 engine core with the stub executor (the harness of test_vllm_serve_parity.py), both started
with at most 2 audios a prompt: the same chat gets the same answer, field by field (the rendered
prompt, its token count, the text).

The folder (:func:`mmfront.testing.peer.qwen2_audio_peer_folder`) has a real checkpoint's Whisper
feature extractor (128 mel bins, 30 s windows), so a clip of n seconds at 16 kHz is 100 n mel
frames and ``((100 n - 1) // 2 + 1 - 2) // 2 + 1`` ``<|AUDIO|>`` tokens (25 for 1 s), and a clip
over 30 s is truncated to 750.

Compared: ``input_audio`` as WAV, FLAC, Ogg Vorbis and MP3 (vLLM ignores ``format``, which only
names a data URL's media type it never reads, and sniffs the bytes: so does mmfront), with the
format left out or unknown; ``audio_url`` data URLs; 8, 22.05, 44.1 and 48 kHz (resampled to 16
kHz with vLLM's torchaudio sinc kernel: the same sample count); stereo (averaged to mono); 50 ms,
exactly 30 s and 45 s clips; two audios in a message; text before and after; parts without
``type``; a ``uuid``; a stream. Refused alike (status, ``type``, ``code``): more audios than
``--limit-mm-per-prompt`` (the same ``param``), bytes that are no audio, a truncated WAV header,
a WAV without frames, a clip too short for one token, data that is not base64, a data URL that is
not base64 (501), empty data without a ``uuid`` (the same ``param``).

The samples themselves, which no answer shows (the stub engine reads no features), are compared
without servers: vLLM's resampler run in the peer venv and mmfront's give the same bytes.

Left different on purpose (docs/serving.md, "Differences from vllm serve"): where audio does not
load, mmfront names ``multi_modal_data`` (or ``audio`` for a clip too short for a token) in
``param`` where vLLM gives none, and its messages say what to send instead. Audio only PyAV
decodes (AAC in MP4, Opus in WebM or Matroska), which vLLM's loader falls back to, is decoded the
same way and compared, answers and samples.

The peer venv needs vLLM's ``audio`` extra (librosa, soundfile, PyAV) and torchaudio, which vLLM
0.33 resamples with; without them vLLM answers 500. Skipped where the peer is absent.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_vllm_serve_parity import (
    MODEL,
    PEER,
    PEER_DIR,
    SERVED,
    Pair,
    both,
    error,
    explain,
    masked,
    read_stream,
    running_pair,
)

from mmfront import MultiModalConfig
from mmfront.media import DecodeBudget, resample_audio
from mmfront.media.audio import load_audio_bytes
from mmfront.testing.media import encoded_audio, make_audio, wav_bytes
from mmfront.testing.peer import SKIP_REASON, qwen2_audio_peer_folder

AUDIO_EXTRAS = ("librosa", "soundfile", "av", "torchaudio")
"""What vLLM 0.33 needs for audio besides itself: its ``audio`` extra and torchaudio, its resampler."""


def _peer_lacks_audio_extras() -> bool:
    """Whether the peer venv cannot import :data:`AUDIO_EXTRAS` (then vLLM answers audio with 500)."""
    if PEER is None:
        return False
    done = subprocess.run([str(PEER), "-c", "import " + ", ".join(AUDIO_EXTRAS)], capture_output=True, timeout=120,
                          check=False)
    return done.returncode != 0


pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side,
              pytest.mark.skipif(PEER is None or MODEL is None or not PEER_DIR.is_dir(), reason=SKIP_REASON),
              pytest.mark.skipif(_peer_lacks_audio_extras(), reason=(
                  f"the vLLM peer venv cannot import {', '.join(AUDIO_EXTRAS)}, which vLLM's audio path needs: "
                  "install them into it (docs/benchmarks.md, under 'To reproduce')"))]

LIMITS = '{"audio": 2}'
FLAGS = ["--limit-mm-per-prompt", LIMITS]
TEXT = {"type": "text", "text": "What do you hear?"}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def encoded(waveform: np.ndarray, rate: int, container: str, subtype: str | None = None) -> str:
    """``waveform`` written by libsndfile as ``container`` (FLAC, OGG, MP3), base64."""
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, waveform, rate, format=container, subtype=subtype)
    return b64(buffer.getvalue())


def wav(seconds: float, rate: int = 16000, seed: int = 3) -> str:
    return b64(wav_bytes(make_audio(seconds, rate, seed=seed), rate))


ONE_S = make_audio(1.0, seed=3)
WAV = wav(1.0)
STEREO = b64(wav_bytes(np.stack([ONE_S, -0.5 * ONE_S], axis=1), 16000))


def input_audio(data: str, fmt: str | None = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": data, **({} if fmt is None else {"format": fmt})}}


def audio_url(data: str, mime: str = "audio/wav") -> dict[str, Any]:
    return {"type": "audio_url", "audio_url": {"url": f"data:{mime};base64,{data}"}}


def chat(*parts: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "max_tokens": 3, "return_prompt_text": True,
            "messages": [{"role": "user", "content": list(parts)}], **fields}


SAME: dict[str, tuple[dict[str, Any], int]] = {
    "input_audio_wav": (chat(input_audio(WAV), TEXT), 68),
    "audio_url_wav": (chat(audio_url(WAV), TEXT), 68),
    "input_audio_flac": (chat(input_audio(encoded(ONE_S, 16000, "FLAC"), "flac"), TEXT), 68),
    "audio_url_flac": (chat(audio_url(encoded(ONE_S, 16000, "FLAC"), "audio/flac"), TEXT), 68),
    "input_audio_ogg_vorbis": (chat(input_audio(encoded(ONE_S, 16000, "OGG", "VORBIS"), "ogg"), TEXT), 68),
    "input_audio_mp3": (chat(input_audio(encoded(ONE_S, 16000, "MP3"), "mp3"), TEXT), 68),
    "audio_url_mp3": (chat(audio_url(encoded(ONE_S, 16000, "MP3"), "audio/mpeg"), TEXT), 68),
    "format_left_out": (chat(input_audio(WAV, None), TEXT), 68),
    "format_unknown": (chat(input_audio(WAV, "aiff"), TEXT), 68),
    "format_not_the_bytes": (chat(input_audio(WAV, "mp3"), TEXT), 68),
    "rate_8000": (chat(input_audio(wav(1.0, 8000, seed=4)), TEXT), 68),
    "rate_22050": (chat(input_audio(wav(1.0, 22050, seed=4)), TEXT), 68),
    "rate_44100": (chat(input_audio(wav(1.0, 44100, seed=4)), TEXT), 68),
    "rate_48000": (chat(input_audio(wav(1.0, 48000, seed=4)), TEXT), 68),
    "rate_44100_odd_length": (chat(input_audio(wav(0.77, 44100, seed=7)), TEXT), 62),
    "stereo": (chat(input_audio(STEREO), TEXT), 68),
    "clip_of_50_ms": (chat(input_audio(wav(0.05, seed=5)), TEXT), 44),
    "clip_of_30_s": (chat(input_audio(wav(30.0, seed=6)), TEXT), 793),
    "clip_of_45_s_truncated": (chat(input_audio(wav(45.0, seed=6)), TEXT), 793),
    "two_audios": (chat(input_audio(WAV), TEXT, input_audio(wav(2.0, seed=9))), 126),
    "text_before_and_after": (chat(TEXT, input_audio(WAV), {"type": "text", "text": "And after?"}), 77),
    "audio_only": (chat(input_audio(WAV)), 59),
    "input_audio_without_type": (chat({"input_audio": {"data": WAV, "format": "wav"}}, TEXT), 68),
    "audio_url_without_type": (chat({"audio_url": {"url": f"data:audio/wav;base64,{WAV}"}}, TEXT), 68),
    "audio_url_as_a_string_without_type": (chat({"audio_url": f"data:audio/wav;base64,{WAV}"}, TEXT), 68),
    "input_audio_with_uuid": (chat({**input_audio(WAV), "uuid": "clip-1"}, TEXT), 68),
    "audio_url_with_uuid": (chat({**audio_url(WAV), "uuid": "clip-2"}, TEXT), 68),
}
"""Each case: the body and vLLM's prompt tokens: 43 around one audio's tokens (text and template),
25 for 1 s, 19 for 0.77 s, 1 for 50 ms, 750 for 30 s or more, 50 for 2 s."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    if PEER is None or MODEL is None or not PEER_DIR.is_dir():
        pytest.skip(SKIP_REASON)
    folder = tmp_path_factory.mktemp("qwen2-audio")
    with running_pair(folder, model=qwen2_audio_peer_folder(folder), server_args=FLAGS,
                      engine_args=["--limit-mm-per-prompt", LIMITS]) as servers:
        yield servers


@pytest.mark.parametrize("case", SAME)
def test_the_same_chat_gets_the_same_answer(pair: Pair, case: str) -> None:
    body, prompt_tokens = SAME[case]
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", body)
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    assert masked(mmfront.json()) == masked(vllm.json()), explain(pair, vllm, mmfront)
    assert vllm.json()["usage"]["prompt_tokens"] == prompt_tokens, explain(pair, vllm, mmfront)


def test_a_stream_with_audio_says_the_same(pair: Pair) -> None:
    body = chat(input_audio(WAV), TEXT, stream=True, stream_options={"include_usage": True})
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", body)
    want, got = read_stream(vllm), read_stream(mmfront)
    for name in ("role", "text", "finish", "usage", "done"):
        assert getattr(got, name) == getattr(want, name), f"{name} differs" + explain(pair, vllm, mmfront)
    assert want.usage[0]["usage"]["prompt_tokens"] == 68, explain(pair, vllm, mmfront)


REFUSED: dict[str, tuple[dict[str, Any], int, str, tuple[str | None, str | None]]] = {
    "more_audios_than_the_limit": (chat(input_audio(WAV), input_audio(WAV), input_audio(WAV), TEXT), 400,
                                   "BadRequestError", ("audio", "audio")),
    "bytes_that_are_no_audio": (chat(input_audio(b64(b"not audio at all, just text" * 4)), TEXT), 400,
                                "BadRequestError", (None, "multi_modal_data")),
    "truncated_wav_header": (chat(input_audio(b64(b"RIFF" + bytes(40))), TEXT), 400, "BadRequestError",
                             (None, "multi_modal_data")),
    "wav_without_frames": (chat(input_audio(b64(wav_bytes(np.zeros(0, np.float32), 16000))), TEXT), 400,
                           "BadRequestError", (None, "multi_modal_data")),
    "clip_too_short_for_a_token": (chat(input_audio(wav(0.01, seed=5)), TEXT), 400, "BadRequestError",
                                   (None, "audio")),
    "data_not_base64": (chat(input_audio("!!!!"), TEXT), 400, "BadRequestError", (None, "multi_modal_data")),
    "data_url_not_base64": (chat({"type": "audio_url", "audio_url": {"url": "data:audio/wav," + WAV}}, TEXT), 501,
                            "NotImplementedError", (None, "multi_modal_data")),
    "empty_data": (chat(input_audio(""), TEXT), 400, "BadRequestError", ("multi_modal_uuids", "multi_modal_uuids")),
    "data_left_out": (chat({"type": "input_audio", "input_audio": {"format": "wav"}}, TEXT), 400, "BadRequestError",
                      ("multi_modal_uuids", "multi_modal_uuids")),
}
"""Each case: the body, the status and error type both answer, and the ``param`` of each (vLLM's,
mmfront's)."""


@pytest.mark.parametrize("case", REFUSED)
def test_a_request_both_refuse_is_refused_alike(pair: Pair, case: str) -> None:
    body, status, kind, params = REFUSED[case]
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", body)
    assert vllm.status == mmfront.status == status, explain(pair, vllm, mmfront)
    want, got = error(vllm), error(mmfront)
    assert (want["type"], want["code"]) == (got["type"], got["code"]) == (kind, status), explain(pair, vllm, mmfront)
    assert (want["param"], got["param"]) == params, explain(pair, vllm, mmfront)


def _sine(rate: int, channels: int) -> np.ndarray:
    wave = (0.1 * np.sin(np.arange(rate) / 5)).astype(np.float32)
    return np.stack([wave, -0.5 * wave][:channels])


PYAV_CLIPS = {"m4a_aac": ("mp4", "aac", 16000, 1), "webm_opus": ("webm", "libopus", 48000, 1),
              "m4a_aac_stereo_44100": ("mp4", "aac", 44100, 2), "mkv_opus_stereo": ("matroska", "libopus", 48000, 2)}
"""1 s clips libsndfile does not open: container, codec, rate, channels."""
_VLLM_LOADS = """
import base64, hashlib, json, sys
from io import BytesIO
import numpy as np
from vllm.multimodal.media.audio import load_audio
out = {}
for name, data in json.loads(sys.stdin.read()).items():
    samples, sr = load_audio(BytesIO(base64.b64decode(data)), sr=None)
    out[name] = [len(samples), str(samples.dtype), int(sr), hashlib.sha256(np.ascontiguousarray(samples).tobytes()).hexdigest()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def pyav_clips() -> dict[str, list[Any]]:
    """The clips (:func:`mmfront.testing.media.encoded_audio`), each with what vLLM's own loader
    reads from it in the peer venv: ``[base64, samples, dtype, rate, sha256 of the samples]``."""
    assert PEER is not None
    pytest.importorskip("av")
    encoded = {name: b64(encoded_audio(_sine(rate, channels), rate, container=container, codec=codec))
               for name, (container, codec, rate, channels) in PYAV_CLIPS.items()}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run([str(PEER), "-c", _VLLM_LOADS], input=json.dumps(encoded), capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: [data, *loaded[name]] for name, data in encoded.items()}


@pytest.mark.parametrize(("clip", "prompt_tokens"), [("m4a_aac", 70), ("webm_opus", 68), ("m4a_aac_stereo_44100", 69),
                                                     ("mkv_opus_stereo", 68)])
def test_audio_only_pyav_decodes_answers_as_vllm(pair: Pair, pyav_clips: dict[str, list[Any]], clip: str,
                                                 prompt_tokens: int) -> None:
    """AAC in MP4 and Opus in WebM/Matroska, which libsndfile does not open and vLLM's loader
    decodes with PyAV, as ``input_audio`` and as an ``audio_url``: the same answer (the AAC clips decode to more than 1 s, their encoder's
    priming and padding: 17,408 samples at 16 kHz, 27 tokens; 46,080 at 44.1 kHz, 26), whatever
    ``format`` says."""
    for part in (input_audio(pyav_clips[clip][0], "m4a"), audio_url(pyav_clips[clip][0], "audio/mp4")):
        vllm, mmfront = both(pair, "POST", "/v1/chat/completions", chat(part, TEXT))
        assert vllm.status == 200, explain(pair, vllm, mmfront)
        assert vllm.json()["usage"]["prompt_tokens"] == prompt_tokens, explain(pair, vllm, mmfront)
        assert masked(mmfront.json()) == masked(vllm.json()), explain(pair, vllm, mmfront)


def test_pyav_decodes_give_vllms_samples(pyav_clips: dict[str, list[Any]]) -> None:
    """The samples, which the answers cannot show: vLLM's ``load_audio`` in the peer venv and
    mmfront's decode of the same bytes, at the stream's own rate, byte for byte. No servers."""
    config = MultiModalConfig()
    for name, (data, length, dtype, rate, digest) in pyav_clips.items():
        item = load_audio_bytes(base64.b64decode(data), config=config,
                                budget=DecodeBudget(config.max_media_request_decode_bytes))
        samples, sr = item.media
        got = [len(samples), str(samples.dtype), sr, hashlib.sha256(samples.tobytes()).hexdigest()]
        assert got == [length, dtype, rate, digest], name


RATES = [(8000, 16000), (11025, 16000), (22050, 16000), (44100, 16000), (48000, 16000), (96000, 16000), (3, 16000),
         (22050, 24000)]
_VLLM_RESAMPLES = """
import hashlib, json, sys
import numpy as np
from vllm.multimodal.audio import AudioResampler
out = {}
for orig, target in json.loads(sys.argv[1]):
    audio = np.random.default_rng(orig).uniform(-1, 1, 3 * orig + 7).astype(np.float32)
    samples = AudioResampler(target_sr=target).resample(audio, orig_sr=orig)
    out[f"{orig}-{target}"] = [len(samples), str(samples.dtype), hashlib.sha256(samples.tobytes()).hexdigest()]
print(json.dumps(out))
"""


def test_resampling_gives_vllms_samples() -> None:
    """The samples the HTTP answers cannot show (the stub engine reads no features): vLLM's own
    resampler, run in the peer venv, and mmfront's give the same bytes for 3 s (and 7 samples) at
    each rate. No servers."""
    assert PEER is not None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run([str(PEER), "-c", _VLLM_RESAMPLES, json.dumps(RATES)], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    want = json.loads(done.stdout.strip().splitlines()[-1])
    got = {}
    for orig, target in RATES:
        audio = np.random.default_rng(orig).uniform(-1, 1, 3 * orig + 7).astype(np.float32)
        samples = resample_audio(audio, orig_sr=orig, target_sr=target)
        got[f"{orig}-{target}"] = [len(samples), str(samples.dtype), hashlib.sha256(samples.tobytes()).hexdigest()]
    assert got == want
    assert want["44100-16000"][:2] == [48003, "float32"]
