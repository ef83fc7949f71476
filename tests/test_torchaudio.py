"""mmfront's torchaudio import hook (docs/models.md, "torchaudio"): installed by
``import mmfront``, it lets PyPI's CUDA torchaudio import beside CPU torch without its compiled
extension, and changes nothing elsewhere."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from markers import NEEDS_TORCHAUDIO
from mmfront import _torchaudio


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_import_mmfront_puts_the_finder_first_once() -> None:
    finders = [f for f in sys.meta_path if isinstance(f, _torchaudio.TorchaudioExtensionFinder)]
    assert len(finders) == 1
    _torchaudio.install()
    assert [f for f in sys.meta_path if isinstance(f, _torchaudio.TorchaudioExtensionFinder)] == finders


def test_the_finder_answers_only_for_torchaudios_extension_utils() -> None:
    finder = _torchaudio.TorchaudioExtensionFinder()
    assert finder.find_spec("json") is None
    assert finder.find_spec("torchaudio._extension") is None


def test_a_library_that_fails_to_load_is_reported_absent() -> None:
    calls: list[str] = []

    def load_lib(lib: str) -> bool:
        calls.append(lib)
        if lib == "_torchaudio":
            raise OSError("Could not load this library: _torchaudio.so")
        if lib == "broken":
            raise RuntimeError("not a load failure")
        return lib == "present"

    tolerant = _torchaudio.tolerate_unloadable(load_lib)
    assert tolerant("_torchaudio") is False
    assert tolerant("present") is True
    assert tolerant("absent") is False
    with pytest.raises(RuntimeError, match="not a load failure"):
        tolerant("broken")
    assert calls == ["_torchaudio", "present", "absent", "broken"]


def test_import_mmfront_loads_no_torchaudio() -> None:
    assert _run("import sys, mmfront; print('torchaudio' in sys.modules)") == "False"


@NEEDS_TORCHAUDIO
def test_torchaudio_and_granite_speech_features_after_mmfront() -> None:
    """With the CUDA wheel beside CPU torch the extension is reported absent; with a working one it
    loads. Either way Granite Speech's feature extractor computes its log-mel features: 1 s at
    16 kHz is 100 frames of 80 mels, stacked in pairs (50 x 160), 12 audio embeddings."""
    out = _run("""
        import mmfront
        import numpy as np
        import torchaudio
        from transformers import GraniteSpeechFeatureExtractor
        features = GraniteSpeechFeatureExtractor()([np.zeros(16000, dtype=np.float32)])
        print(tuple(features["input_features"].shape), features["audio_embed_sizes"])
    """)
    assert out == "(1, 50, 160) [12]"
