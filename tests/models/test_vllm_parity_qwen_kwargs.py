"""A request's ``min_pixels``/``max_pixels`` (``mm_processor_kwargs``) on the Qwen2-VL family send what
vLLM 0.33's native frontend sends (the harness is ``vllm_parity``, see ``test_vllm_parity.py``): the
image processor runs alone there (``ModelSpec.image_expansions``) with the request's kwargs merged
as HF merges them, so each request's grid, rows, expansion and hash are vLLM's. Flat and scoped
(``images_kwargs``) kwargs, one image and two, and the deployment's kwargs again after them.

transformers 5.14's Qwen2-VL image processor reads ``size`` only and would drop these kwargs, where
vLLM's (transformers 5.20) applies them: under it mmfront folds them into ``size``'s edges
(``ModelSpec.call_kwargs``), so the comparison holds under the Legacy venv too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_parity import Case, run_family

from mmfront.testing.media import make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()
needs_peer = pytest.mark.skipif(PEER is None, reason=SKIP_REASON)

PATCH = 28
"""The fixtures' patch (14 px) times the merge size (2): one image token's side."""


def cases() -> list[Case]:
    wide, tall = make_image(100, 30, seed=2), make_image(40, 72, seed=1)
    more, fewer = {"min_pixels": 16 * PATCH * PATCH}, {"max_pixels": 2 * PATCH * PATCH}
    return [Case("image_plain", "image", [wide]),
            Case("image_min_pixels", "image", [wide], mm_processor_kwargs=more),
            Case("image_min_pixels_scoped", "image", [wide], mm_processor_kwargs={"images_kwargs": more}),
            Case("image_two_max_pixels", "image", [wide, tall], mm_processor_kwargs=fewer),
            Case("image_two_both", "image", [tall, wide],
                 mm_processor_kwargs={"min_pixels": 8 * PATCH * PATCH, "max_pixels": 12 * PATCH * PATCH}),
            Case("image_plain_again", "image", [wide])]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity-qwen-kwargs")


@needs_peer
@pytest.mark.slow
@pytest.mark.parametrize("processor_class", ["Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor"])
def test_request_pixel_limits_equal_vllm_native(processor_class: str, root: Path) -> None:
    result = run_family(processor_class, root, cases=cases())
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    assert result["mmfront_impl"] == "native"
    assert set(result["diff"]) == {c.name for c in cases()}
    for name, diff in result["diff"].items():
        assert diff == {"differs": [], "details": []}, f"{processor_class} {name}: {diff}"
    vllm = result["vllm"]["cases"]

    def rows(name: str) -> list[int]:
        return [item["pixel_values"]["data"][2][0] for item in vllm[name]["mm_kwargs"]["image"]]

    assert rows("image_plain") == rows("image_plain_again") == [16]  # 100 x 30 px: a 2 x 8 grid
    assert rows("image_min_pixels") == rows("image_min_pixels_scoped") == [96]  # raised to a 6 x 16 grid
    assert rows("image_two_max_pixels")[0] < 16
    assert vllm["image_min_pixels"]["mm_hashes"] != vllm["image_plain"]["mm_hashes"]
