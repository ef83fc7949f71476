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

import os
import tempfile
from pathlib import Path

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


__all__ = ["DEFAULT_PYTHON", "ENV_VAR", "SEARCHED_PYTHONS", "SKIP_REASON", "vllm_peer_model_dir", "vllm_peer_python"]
