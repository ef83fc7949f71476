"""The Qwen2-VL family's images skip HF's ``__call__`` (``ModelSpec.image_expansions``): the image
processor runs alone with the kwargs HF's merge gives (merged once per distinct set), and each
image's expansion comes from its grid. What a processor sends must not change by a byte: every
case here runs through a processor that takes the shortcut and one that calls HF as before, and
compares prompt ids, placeholder ranges, hashes and every item's wire frames (keys, field types,
dtypes, shapes, bytes). The shortcut's own checks: HF's text path is not taken for images, the
merge runs once for many misses with the same kwargs, and a request's ``min_pixels``/
``max_pixels`` reach the image processor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from packaging.version import Version
from vllm_parity import family_folder, prompt_for, video_clip, wire_frames

from markers import NEEDS_TORCHVISION
from mmfront import MultiModalConfig
from mmfront.models.registry import create_processor
from mmfront.testing.media import make_image

pytestmark = [pytest.mark.backend, NEEDS_TORCHVISION]

FAMILIES = ("Qwen2VLProcessor", "Qwen2_5_VLProcessor", "Qwen3VLProcessor")
CONFIGS = {"native": {}, "transformers": {"model_impl": "transformers"},
           "legacy": {"model_impl": "transformers", "transformers_backend": "legacy"}}
"""vLLM's native layout (``--model-impl auto``), the transformers backend's own, and the Legacy
backend, which locates the expansion in HF's ids where the shortcut does not apply."""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qwen_direct")


def pair(folder: Path, **config: Any) -> tuple[Any, Any]:
    """``(the shortcut, HF's call)``: two processors of the folder, the second without the shortcut."""
    direct: Any = create_processor(folder, MultiModalConfig(**config))
    via_hf: Any = create_processor(folder, MultiModalConfig(**config))
    assert direct.image_expansions is not None, "the family's images must take the shortcut"
    via_hf.image_expansions = None
    return direct, via_hf


def sent(proc: Any, mm_data: dict[str, list[Any]], kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Everything the engine receives of one prompt holding ``mm_data``, in item order."""
    text = " and ".join(prompt_for(proc.get_placeholder_str(m, 0), len(items)) for m, items in mm_data.items())
    ids = proc.info.get_tokenizer().encode(text, add_special_tokens=False)
    out = proc.apply(ids, mm_data, hf_processor_mm_kwargs=kwargs)
    return {"ids": list(out["prompt_token_ids"]), "hashes": {m: list(h) for m, h in out["mm_hashes"].items()},
            "ranges": {m: [(r.offset, r.length, None if r.is_embed is None else r.is_embed.tolist()) for r in rs]
                       for m, rs in out["mm_placeholders"].items()},
            "keys": {m: [sorted(i.keys()) for i in items] for m, items in out["mm_kwargs"].items()},
            "frames": wire_frames(out), "out": out}


def same(a: dict[str, Any], b: dict[str, Any]) -> None:
    for key in ("ids", "hashes", "ranges", "keys", "frames"):
        assert a[key] == b[key], key


def images() -> list[Any]:
    return [make_image(48, 40, seed=0), make_image(40, 72, seed=1), make_image(100, 30, seed=2)]


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("family", FAMILIES)
def test_images_send_what_hfs_call_sends(family: str, config: str, root: Path) -> None:
    folder, _ = family_folder(family, root)
    direct, via_hf = pair(folder, **CONFIGS[config])
    one, two, three = images()
    for case in ([one], [one, two], [two, two], [three, one, two]):
        want = sent(via_hf, {"image": case})
        got = sent(direct, {"image": case})
        same(got, want)
        token = direct.info.hf_processor.image_token_id
        merge = direct.info.hf_processor.image_processor.merge_size
        for r, item in zip(got["out"]["mm_placeholders"]["image"], got["out"]["mm_kwargs"]["image"], strict=True):
            grid = item["image_grid_thw"].data.reshape(3)
            assert got["ids"][r.offset:r.offset + r.length] == [token] * (int(grid.prod()) // merge**2)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_requests_pixel_limits_reach_the_image_processor(family: str, root: Path) -> None:
    """Each request's kwargs give the grid HF's own call gives for them where HF reads them, and
    the grid of ``size`` with the limits as its edges where transformers 5.14 would drop them (its
    image processor reads ``size`` only; later releases, vLLM's among them, apply the limits over
    ``size``'s edges); a request's kwargs do not stay for the next request."""
    folder, _ = family_folder(family, root)
    direct, via_hf = pair(folder)
    hf = direct.info.hf_processor
    image = make_image(100, 30, seed=2)
    patch = hf.image_processor.patch_size * hf.image_processor.merge_size
    plain = sent(direct, {"image": [image]})
    grids: list[list[int]] = []
    for kwargs in ({"min_pixels": 16 * patch * patch}, {"images_kwargs": {"min_pixels": 16 * patch * patch}},
                   {"max_pixels": 2 * patch * patch}, {"size": {"shortest_edge": 16 * patch * patch,
                                                                "longest_edge": 20 * patch * patch}}):
        got, want = sent(direct, {"image": [image]}, kwargs), sent(via_hf, {"image": [image]}, kwargs)
        same(got, want)
        grid = got["out"]["mm_kwargs"]["image"][0]["image_grid_thw"].data.reshape(3).tolist()
        assert [grid] == hf(text=hf.image_token, images=[image], return_tensors="pt",
                            **as_size(kwargs, hf.image_processor.size))["image_grid_thw"].tolist()
        assert got["hashes"] != plain["hashes"]  # the request's kwargs are part of the item's hash, as in vLLM
        grids.append(grid)
    assert grids[3] != grids_of(plain)
    assert grids[0] == grids[1] != grids_of(plain) and grids[2] != grids_of(plain)
    same(sent(direct, {"image": [image]}), plain)  # the deployment's kwargs again, after the request's


def as_size(kwargs: dict[str, Any], default: Any) -> dict[str, Any]:
    """``kwargs`` with their pixel limits as ``size``'s edges (over ``default``'s), as transformers
    5.15 and later apply them; unchanged where they have none."""
    flat = {**kwargs, **kwargs.get("images_kwargs", {})}
    limits = {edge: flat[key] for edge, key in (("shortest_edge", "min_pixels"), ("longest_edge", "max_pixels"))
              if key in flat}
    if not limits:
        return kwargs
    return {"size": {"shortest_edge": default["shortest_edge"], "longest_edge": default["longest_edge"], **limits}}


def grids_of(result: dict[str, Any]) -> list[int]:
    grid: list[int] = result["out"]["mm_kwargs"]["image"][0]["image_grid_thw"].data.reshape(3).tolist()
    return grid


@pytest.mark.parametrize("family", ("Qwen2VLProcessor", "Qwen2_5_VLProcessor"))
def test_an_image_and_a_video_in_one_prompt(family: str, root: Path) -> None:
    folder, _ = family_folder(family, root)
    direct, via_hf = pair(folder)
    if "video" not in direct.info.get_supported_mm_limits():
        assert Version(transformers.__version__) < Version("5.18"), "videos are served from transformers 5.18"
        pytest.skip(f"transformers {transformers.__version__} serves no video through the transformers backend")
    data: dict[str, list[Any]] = {"image": [make_image(48, 40, seed=0)], "video": [video_clip(4, 2.0, range(4))]}
    got, want = sent(direct, data), sent(via_hf, data)
    same(got, want)
    assert set(got["ranges"]) == {"image", "video"}
    assert got["out"]["mm_kwargs"]["video"][0]["pixel_values_videos"].data.dtype == torch.uint8


def test_images_skip_hfs_call_and_merge_the_kwargs_once(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, _ = family_folder("Qwen2_5_VLProcessor", root)
    direct, _ = pair(folder)
    hf = direct.info.hf_processor
    calls = {"__call__": 0, "_merge_kwargs": 0}
    hf_call, merge = type(hf).__call__, hf._merge_kwargs

    def counted_call(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls["__call__"] += 1
        return hf_call(self, *args, **kwargs)

    def counted_merge(*args: Any, **kwargs: Any) -> Any:
        calls["_merge_kwargs"] += 1
        return merge(*args, **kwargs)

    monkeypatch.setattr(type(hf), "__call__", counted_call)
    monkeypatch.setattr(hf, "_merge_kwargs", counted_merge)
    for seed in range(4):  # four misses with the deployment's kwargs
        sent(direct, {"image": [make_image(48, 40, seed=10 + seed)]})
    assert calls == {"__call__": 0, "_merge_kwargs": 1}
    for seed in range(2):  # a request's own kwargs: merged once more, then kept too
        sent(direct, {"image": [make_image(48, 40, seed=20 + seed)]}, {"max_pixels": 12345})
    assert calls == {"__call__": 0, "_merge_kwargs": 2}


def test_a_refused_kwarg_is_refused_as_by_hfs_call(root: Path) -> None:
    from mmfront.errors import ProcessorError

    folder, _ = family_folder("Qwen2_5_VLProcessor", root)
    direct, via_hf = pair(folder)
    errors = []
    for proc in (direct, via_hf):
        with pytest.raises(ProcessorError) as caught:
            sent(proc, {"image": [make_image(48, 40, seed=0)]}, {"max_pixels": "many"})
        errors.append(str(caught.value))
    assert all("max_pixels" in e or "many" in e for e in errors), errors


def test_a_subclass_with_its_own_expansion_keeps_hfs_call(root: Path) -> None:
    from mmfront.models.catalog import image_expansions
    from mmfront.models.qwen2_vl import qwen2_vl_image_expansions

    folder, _ = family_folder("Qwen2VLProcessor", root)
    direct, _ = pair(folder)
    base = type(direct.info.hf_processor)

    class SameExpansion(base):  # type: ignore[misc, valid-type]
        pass

    class OwnExpansion(base):  # type: ignore[misc, valid-type]
        def replace_image_token(self, image_inputs: dict[str, Any], image_idx: int, **kwargs: Any) -> str:
            return f"{self.image_token}{super().replace_image_token(image_inputs, image_idx, **kwargs)}"

    assert image_expansions(base) is image_expansions(SameExpansion) is qwen2_vl_image_expansions
    assert image_expansions(OwnExpansion) is None
