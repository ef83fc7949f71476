"""HF's merge of a processor call's kwargs, kept per distinct set (``MergedHfKwargs``): the same
result as HF's own merge on every call, kwargs told apart by type as HF's validation tells them,
and no caller's edit of a result reaching the next caller."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from markers import NEEDS_TORCHVISION
from mmfront.processing.hf import MergedHfKwargs, freeze_kwargs, thaw_kwargs
from mmfront.testing.models import build_model_folder, load_processor


@pytest.fixture(scope="module")
def hf(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return load_processor(build_model_folder("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl")))


def test_frozen_kwargs_give_back_the_same_values_and_types() -> None:
    kwargs = {"min_pixels": 3136, "scale": 1.0, "flag": True, "none": None, "size": {"shortest_edge": 56},
              "mean": [0.5, 0.5, 0.5], "pair": (1, "x"), "images_kwargs": {"max_pixels": 12845056}}
    frozen = freeze_kwargs(kwargs)
    assert frozen is not None
    thawed = thaw_kwargs(frozen)
    assert thawed == kwargs
    assert [type(v) for v in thawed.values()] == [int, float, bool, type(None), dict, list, tuple, dict]
    assert type(thawed["pair"][0]) is int and type(thawed["mean"][0]) is float
    assert len({freeze_kwargs({"x": 1}), freeze_kwargs({"x": 1.0}), freeze_kwargs({"x": True})}) == 3
    assert freeze_kwargs({"image_mean": torch.zeros(3)}) is None
    assert freeze_kwargs({"images_kwargs": {"size": [np.float64(0.5)]}}) is None


@pytest.fixture
def merges(hf: Any, monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The kwargs of every call of the processor's ``_merge_kwargs`` from here on."""
    calls: list[dict[str, Any]] = []
    merge = hf._merge_kwargs

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return merge(*args, **kwargs)

    monkeypatch.setattr(hf, "_merge_kwargs", counted)
    return calls


@NEEDS_TORCHVISION
def test_the_merge_is_hfs_and_runs_once_per_distinct_kwargs(hf: Any, merges: list[dict[str, Any]]) -> None:
    kwargs = {"images_kwargs": {"do_normalize": False, "do_rescale": False}, "min_pixels": 3136, "return_tensors": "pt"}
    want = type(hf)._merge_kwargs(hf, type(hf).valid_processor_kwargs, tokenizer_init_kwargs=hf.tokenizer.init_kwargs,
                                  **kwargs)
    merged = MergedHfKwargs(hf)
    first = merged(kwargs)
    assert first == want and first["images_kwargs"]["min_pixels"] == 3136
    first["images_kwargs"]["min_pixels"] = 1  # a caller's edit stays its own
    assert merged(dict(kwargs)) == want
    assert len(merges) == 1
    assert merged({**kwargs, "min_pixels": 6272})["images_kwargs"]["min_pixels"] == 6272
    assert len(merges) == 2


@NEEDS_TORCHVISION
def test_kwargs_that_cannot_be_frozen_are_merged_on_every_call(hf: Any, merges: list[dict[str, Any]]) -> None:
    mean = [np.float64(0.5)] * 3  # a float to HF's validation, not a plain one to the key
    merged = MergedHfKwargs(hf)
    for _ in range(2):
        assert merged({"images_kwargs": {"image_mean": mean}})["images_kwargs"]["image_mean"] == mean
    assert len(merges) == 2


# --- an image processor's kwargs prepared once per set (KwargsPreparedOnce, Qwen2-VL's speedup) ----


@pytest.fixture(scope="module")
def sped_up(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The qwen2_5_vl fixture's image processor as ``create_processor`` leaves it (its speedups on)."""
    from mmfront.models.registry import create_processor
    processor = create_processor(build_model_folder("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl_fast")))
    return processor.info.hf_processor.image_processor


def _image(seed: int, height: int, width: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, height, width), generator=generator, dtype=torch.uint8)


_KWARG_SETS = [  # each names the fixture's own temporal_patch_size: no set the processor's construction called with
    {"do_normalize": False, "do_rescale": False, "return_tensors": "pt", "temporal_patch_size": 2},
    {"do_normalize": False, "do_rescale": False, "return_tensors": "pt", "min_pixels": 256, "max_pixels": 1024,
     "temporal_patch_size": 2},
    {"return_tensors": "pt", "temporal_patch_size": 2},  # normalised on the CPU
    {"return_tensors": "pt", "size": {"shortest_edge": 64, "longest_edge": 2048}, "temporal_patch_size": 2},
]


def _hf_own(image_processor: Any, images: list[torch.Tensor], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    return dict(type(image_processor).preprocess(image_processor, images, **kwargs))


def _same(got: Any, want: dict[str, torch.Tensor]) -> bool:
    return sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)


@NEEDS_TORCHVISION
def test_kwargs_prepared_once_give_hfs_outputs_and_prepare_each_set_once(sped_up: Any,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    assert "preprocess" in vars(sped_up)
    checks: list[dict[str, Any]] = []
    validate = sped_up._validate_preprocess_kwargs
    monkeypatch.setattr(sped_up, "_validate_preprocess_kwargs", lambda **kw: (checks.append(kw), validate(**kw))[1])
    prepared = []
    for round_ in range(3):
        ours = 0
        for n, kwargs in enumerate(_KWARG_SETS):
            images = [_image(10 * n + round_, 40 + 8 * round_, 56), _image(99, 24, 72)]
            before = len(checks)
            got = sped_up(images=images, **kwargs)
            ours += len(checks) - before
            assert _same(got, _hf_own(sped_up, images, kwargs)), (round_, n)
        prepared.append(ours)
    assert prepared == [len(_KWARG_SETS), 0, 0]  # each set prepared on its first call only


@NEEDS_TORCHVISION
def test_kwargs_that_cannot_be_keyed_go_through_preprocess_whole(sped_up: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    checks: list[int] = []
    validate = sped_up._validate_preprocess_kwargs
    monkeypatch.setattr(sped_up, "_validate_preprocess_kwargs", lambda **kw: (checks.append(1), validate(**kw))[1])
    from transformers.image_utils import ChannelDimension

    kwargs = {"return_tensors": "pt", "image_mean": [0.5, 0.5, 0.5]}
    with_object = {"return_tensors": "pt", "input_data_format": ChannelDimension.FIRST}  # an enum: no frozen form
    images = [_image(7, 32, 32)]
    for _ in range(2):
        sped_up(images=images, **kwargs)
        sped_up(images=images, **with_object)
    assert len(checks) == 1 + 2  # the keyable set once, the other on both calls
    assert _same(sped_up(images=images, **with_object), _hf_own(sped_up, images, with_object))


@NEEDS_TORCHVISION
def test_kwargs_prepared_once_from_many_threads_give_each_call_its_own_outputs(sped_up: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    calls = [(_KWARG_SETS[n % len(_KWARG_SETS)], [_image(n, 32 + 8 * (n % 3), 48)]) for n in range(24)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda call: sped_up(images=call[1], **call[0]), calls))
    for (kwargs, images), out in zip(calls, got):
        assert _same(out, _hf_own(sped_up, images, kwargs))
