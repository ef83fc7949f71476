"""Dummy inputs and warm-up on the offline folders."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mmfront import InputPreprocessor, MultiModalConfig
from mmfront.config import ModalityLimit
from mmfront.models.registry import create_processor
from mmfront.processing.dummy import BaseDummyInputsBuilder


def test_gemma3_dummy_inputs(gemma3_dir: Path) -> None:
    builder = BaseDummyInputsBuilder(create_processor(gemma3_dir))
    assert builder.get_dummy_text({"image": 2}) == "<start_of_image><start_of_image>"
    ids, data = builder.get_dummy_processor_inputs({"image": 2})
    assert [im.size for im in data["image"]] == [(32, 32), (32, 32)]
    out = builder.processor.apply(ids, data)
    assert [r.get_num_embeds() for r in out["mm_placeholders"]["image"]] == [16, 16]


def test_pan_and_scan_profiles_the_image_with_the_most_crops(gemma3_dir: Path) -> None:
    config = MultiModalConfig(mm_processor_kwargs={"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 16})
    processor = create_processor(gemma3_dir, config)
    assert processor.get_dummy_image_size() == (32, 128)
    ids, data = BaseDummyInputsBuilder(processor).get_dummy_processor_inputs({"image": 1})
    out = processor.apply(ids, data)
    assert out["mm_placeholders"]["image"][0].get_num_embeds() == processor.get_max_tokens_per_item()["image"] == 80


def test_options_shrink_but_never_grow(gemma3_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    builder = BaseDummyInputsBuilder(create_processor(gemma3_dir))
    data = builder.get_dummy_mm_data({"image": 1}, {"image": ModalityLimit(count=1, width=16, height=8)})
    assert data["image"][0].size == (16, 8)
    data = builder.get_dummy_mm_data({"image": 1}, {"image": ModalityLimit(count=1, width=4096)})
    assert data["image"][0].size == (32, 32)
    assert "more than the model's largest" in caplog.text


def test_audio_dummy_is_one_window(glmasr_dir: Path) -> None:
    processor = create_processor(glmasr_dir, MultiModalConfig(model_impl="transformers"))
    data = BaseDummyInputsBuilder(processor).get_dummy_mm_data({"audio": 1})
    assert data["audio"][0].shape == (2 * 16000,) and not np.any(data["audio"][0])


def test_warmup_leaves_every_cache_empty(gemma3_dir: Path) -> None:
    pre = InputPreprocessor(gemma3_dir)
    pre.warmup()
    assert pre.cache is not None and pre.cache.make_stats().total == 0
    assert pre.tokenize_only_cache is not None and pre.tokenize_only_cache.make_stats().total == 0


def test_warmup_processes_the_largest_dummy_under_the_limits_options(gemma3_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """In place, the warm-up is one HF call on one dummy per modality, its size shrunk by the
    ``limit_mm_per_prompt`` options as vLLM's profiling shrinks it, with the config's kwargs."""
    config = MultiModalConfig(mm_processing_lanes=0, limit_mm_per_prompt={"image": {"count": 1, "width": 24}},
                              mm_processor_kwargs={"do_pan_and_scan": False})
    pre = InputPreprocessor(gemma3_dir, config)
    calls: list[tuple[list[tuple[int, int]], dict]] = []
    process = pre.processor.process_hf_items
    monkeypatch.setattr(pre.processor, "process_hf_items", lambda items, kwargs: calls.append(
        ([im.size for im in items["image"].get_all()], kwargs)) or process(items, kwargs))
    pre.warmup()
    assert [sizes for sizes, _ in calls] == [[(24, 32)]]
    assert calls[0][1]["images_kwargs"]["do_pan_and_scan"] is False
