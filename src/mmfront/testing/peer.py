"""Where the vLLM 0.33 peer venv is, for the side-by-side benchmarks and the compatibility tests.

The peer is built by ``../shared/peer/vllm_peer_setup.sh`` (``VENV=/tmp/vllm-peer-venv``, as
docs/benchmarks.md says); ``MMFRONT_VLLM_PEER`` names another one's python. It is never a
dependency: without it the ratios are skipped, and so are the tests, with that reason.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

ENV_VAR = "MMFRONT_VLLM_PEER"
DEFAULT_PYTHON = Path(tempfile.gettempdir()) / "vllm-peer-venv" / "bin" / "python"
SKIP_REASON = f"no vLLM 0.33 peer venv (set {ENV_VAR} or run ../shared/peer/vllm_peer_setup.sh)"


def vllm_peer_python() -> Path | None:
    """The peer venv's python, or ``None`` where there is none."""
    python = Path(os.environ.get(ENV_VAR) or DEFAULT_PYTHON)
    return python if python.exists() else None


def vllm_peer_model_dir(python: Path, name: str = "tiny-gemma3-896") -> Path | None:
    """A model folder the setup script wrote into the peer venv (``<venv>/models/<name>``)."""
    folder = python.parents[1] / "models" / name
    return folder if folder.is_dir() else None


__all__ = ["DEFAULT_PYTHON", "ENV_VAR", "SKIP_REASON", "vllm_peer_model_dir", "vllm_peer_python"]
