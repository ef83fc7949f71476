"""mmfront's torchvision import hook (docs/models.md, "torchvision"): installed by ``import mmfront``,
it makes PyPI's CUDA torchvision import beside CPU torch, and changes nothing elsewhere."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from markers import NEEDS_TORCHVISION
from mmfront import _torchvision


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], check=False, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_import_mmfront_puts_the_finder_first_once() -> None:
    finders = [f for f in sys.meta_path if isinstance(f, _torchvision.TorchvisionOpsFinder)]
    assert len(finders) == 1
    _torchvision.install()
    assert [f for f in sys.meta_path if isinstance(f, _torchvision.TorchvisionOpsFinder)] == finders


def test_the_finder_finds_nothing_itself() -> None:
    finder = _torchvision.TorchvisionOpsFinder()
    assert finder.find_spec("json") is None


def test_import_mmfront_loads_no_torch() -> None:
    assert _run("import sys, mmfront; print('torch' in sys.modules, 'torchvision' in sys.modules)") == "False False"


@NEEDS_TORCHVISION
def test_torchvision_and_a_video_processor_import_after_mmfront() -> None:
    """With the CUDA wheel beside CPU torch the ops are missing and the hook defines two schemas;
    with a working torchvision it defines nothing. Either way torchvision and the processors that
    need it (here Qwen2-VL's, which takes a video processor) import."""
    out = _run("""
        import mmfront
        from mmfront import _torchvision
        import torchvision.extension
        from transformers import AutoProcessor, Qwen2VLVideoProcessor
        print(torchvision.extension._has_ops() != bool(_torchvision._libraries), Qwen2VLVideoProcessor.__name__)
    """)
    assert out == "True Qwen2VLVideoProcessor"
