"""Where the vLLM 0.33 peer venv is, for the side-by-side benchmarks and the compatibility tests.

The peer is built by ``../shared/peer/vllm_peer_setup.sh``. docs/benchmarks.md runs it with
``VENV=/tmp/vllm-peer-venv``; run without ``VENV`` it builds ``.venv-vllm`` in the folder it is run
from, which for a new user following the project guide (``bash ../shared/peer/vllm_peer_setup.sh``
from the checkout) is the checkout, and for one who runs it where it lies is ``../shared/peer``.
All three are looked for, so no way of building it leaves the tests silently skipped;
``MMFRONT_VLLM_PEER`` names another one's python. It is never a dependency: without it the
ratios are skipped, and so are the tests, with that reason.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from mmfront.testing.models import build_model_folder

ENV_VAR = "MMFRONT_VLLM_PEER"
DEFAULT_PYTHON = Path(tempfile.gettempdir()) / "vllm-peer-venv" / "bin" / "python"
_CHECKOUT = Path(__file__).resolve().parents[3]
"""The checkout's root where mmfront is run from its source tree (``src/mmfront/testing/``)."""
SEARCHED_PYTHONS = (
    DEFAULT_PYTHON,
    _CHECKOUT / ".venv-vllm" / "bin" / "python",
    _CHECKOUT.parent / "shared" / "peer" / ".venv-vllm" / "bin" / "python",
)
"""Where the setup script puts the venv, in the order looked at, when ``MMFRONT_VLLM_PEER`` is unset."""
SKIP_REASON = f"no vLLM 0.33 peer venv (set {ENV_VAR} or run ../shared/peer/vllm_peer_setup.sh)"


def vllm_peer_python() -> Path | None:
    """The peer venv's python, or ``None`` where there is none. ``MMFRONT_VLLM_PEER``, when set,
    is the only place looked at."""
    named = os.environ.get(ENV_VAR)
    candidates = (Path(named),) if named else SEARCHED_PYTHONS
    return next((python for python in candidates if python.exists()), None)


def vllm_peer_model_dir(python: Path, name: str = "tiny-gemma3-896") -> Path | None:
    """A model folder the setup script wrote into the peer venv (``<venv>/models/<name>``)."""
    folder = python.parents[1] / "models" / name
    return folder if folder.is_dir() else None


QWEN_MIN_PIXELS = 3136
"""A real Qwen2.5-VL checkpoint's ``min_pixels``."""
QWEN_POSITIONS = 128000
"""A real Qwen2.5-VL checkpoint's ``max_position_embeddings``: room for the standard limit's
largest image (16384 tokens), which vLLM checks against ``--max-model-len``."""
STUB_VOCAB_SIZE = 2048
"""Above every token the peer's stub engine generates in the tests and benchmarks (1000 + 10 * images + k)."""


def qwen2_5_vl_peer_folder(work: Path, max_pixels: int) -> Path:
    """An offline Qwen2.5-VL folder that ``vllm serve`` and ``mmfront serve`` both serve in front
    of the peer's stub engine: the real patch (14) and merge (2) sizes and the given pixel limit,
    with its full ``config.json``; ``min_pixels``/``max_pixels`` written as a real checkpoint's
    ``preprocessor_config`` has them (``vllm-rs`` ignores a ``size``-only limit). Built once under
    ``work``."""
    folder = work / f"qwen2_5_vl-{max_pixels}"
    if (folder / ".done").is_file():
        return folder
    build_model_folder("qwen2_5_vl", folder, with_weights=True, patch_size=14, merge_size=2, max_pixels=max_pixels)
    config_path = folder / "processor_config.json"
    config = json.loads(config_path.read_text())
    config["image_processor"].update(size={"shortest_edge": QWEN_MIN_PIXELS, "longest_edge": max_pixels},
                                     min_pixels=QWEN_MIN_PIXELS, max_pixels=max_pixels)
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    _words_for_stub_tokens(folder)
    (folder / ".done").write_text("")
    return folder


QWEN2_AUDIO_MEL_BINS = 128
"""A real Qwen2-Audio checkpoint's ``feature_size``."""
QWEN2_AUDIO_CHUNK_S = 30
"""A real Qwen2-Audio checkpoint's ``chunk_length``: a longer clip is truncated to it (750 tokens)."""


def qwen2_audio_peer_folder(work: Path) -> Path:
    """An offline Qwen2-Audio folder that ``vllm serve`` and ``mmfront serve`` both serve in front
    of the peer's stub engine: a real checkpoint's Whisper feature extractor (128 mel bins, 30 s
    windows, so a longer clip is truncated where a real one's is) rather than the small test
    fixture's 2 s windows, and the stub's tokens in the vocabulary. Built once under ``work``."""
    folder = work / "qwen2_audio"
    if (folder / ".done").is_file():
        return folder
    build_model_folder("qwen2_audio", folder, with_weights=True, feature_size=QWEN2_AUDIO_MEL_BINS,
                       chunk_length=QWEN2_AUDIO_CHUNK_S)
    _words_for_stub_tokens(folder)
    (folder / ".done").write_text("")
    return folder


def _words_for_stub_tokens(folder: Path) -> None:
    """Gives the folder's small tokenizer a word for every id up to :data:`STUB_VOCAB_SIZE`, so
    that the stub engine's tokens (1000 and up) decode to text in every frontend: a stream without
    text has no first token for a client to time. The text config gets the real positions."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.add_tokens([f" w{n}" for n in range(len(tokenizer), STUB_VOCAB_SIZE)])
    tokenizer.save_pretrained(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    for section in (config, config.get("text_config")):
        if isinstance(section, dict) and "vocab_size" in section:
            section.update(vocab_size=len(tokenizer), max_position_embeddings=QWEN_POSITIONS)
    config_path.write_text(json.dumps(config, indent=2) + "\n")


__all__ = ["DEFAULT_PYTHON", "ENV_VAR", "QWEN2_AUDIO_CHUNK_S", "QWEN2_AUDIO_MEL_BINS", "QWEN_MIN_PIXELS",
           "QWEN_POSITIONS", "SEARCHED_PYTHONS", "SKIP_REASON", "STUB_VOCAB_SIZE", "qwen2_5_vl_peer_folder",
           "qwen2_audio_peer_folder", "vllm_peer_model_dir", "vllm_peer_python"]
