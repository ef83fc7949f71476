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
