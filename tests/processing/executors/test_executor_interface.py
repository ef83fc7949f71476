"""The item executor interface: a job's items are the same whichever executor runs it, and the
executor an owner hands the processor is the one that runs its misses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lane_inputs import png
from packaging.version import Version

from mmfront.errors import UnsupportedModelError
from mmfront.inputs import MultiModalFieldConfig, MultiModalKwargsItems
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.registry import create_processor
from mmfront.parse import ImageProcessorItems, MultiModalDataItems
from mmfront.processing.executors import (
    InPlaceExecutor,
    ItemExecutor,
    ItemJob,
    ItemProcessor,
    LaneSpec,
    LocalProcessExecutor,
)
from mmfront.testing.media import natural_image
from mmfront.testing.models import build_model_folder
from mmfront.wire import MsgpackEncoder

pytestmark = pytest.mark.usefixtures("preloaded_lane_parents")  # not a test of the parent's start


class _OwnImageItems(ImageProcessorItems):
    """An item container with no wire form: its job is processed in place."""


def _bytes(items: MultiModalKwargsItems) -> list[bytes]:
    return [bytes(f) for f in MsgpackEncoder().encode(items)]


def test_in_place_and_local_process_give_identical_items_for_one_job(gemma3_dir: Path) -> None:
    processor = create_processor(gemma3_dir)
    spec = LaneSpec.of(processor)
    assert spec is not None
    jobs = {
        "independent items": ItemJob(processor.info.parse_mm_data(
            {"image": [natural_image(48, 40, tag=t) for t in (1, 2, 3)]}), {}),
        "pan and scan": ItemJob(processor.info.parse_mm_data({"image": [natural_image(96, 24, tag=4)]}),
                                {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 16}),
        "cannot travel": ItemJob(MultiModalDataItems({"image": _OwnImageItems([natural_image(48, 40, tag=5)])}), {}),
    }
    in_place = InPlaceExecutor()
    with LocalProcessExecutor(spec, 1) as lanes:
        assert lanes.encode_job(jobs["cannot travel"]) is None
        for name, job in jobs.items():
            assert _bytes(lanes.run(job, processor)) == _bytes(in_place.run(job, processor)), name
    assert lanes.closed
    job = jobs["independent items"]
    assert _bytes(lanes.run(job, processor)) == _bytes(in_place.run(job, processor))  # closed: in place


def test_a_lane_sends_the_engine_layout_of_the_processor_it_serves(tmp_path: Path) -> None:
    """Qwen2.5-VL's native layout (vLLM's fields: no ``num_image_patches``, the grid kept on the
    CPU) and its image processor's speedups come from ``create_processor``; a lane rebuilds the
    processor through it, so its items are the caller's byte for byte."""
    processor = create_processor(build_model_folder("qwen2_5_vl", tmp_path / "qwen2_5_vl"))
    spec = LaneSpec.of(processor)
    assert spec is not None and spec.built_by == "mmfront.models.registry:create_processor"
    rebuilt = spec.build()
    # the speedups this transformers version takes (patchify since 5.15; process_image on every one)
    sped_up = {"patchify", "process_image"} & set(vars(processor.info.hf_processor.image_processor))
    assert "process_image" in sped_up
    assert sped_up <= set(vars(rebuilt.info.hf_processor.image_processor))
    ids = processor.info.tokenizer.encode(" and ".join([processor.get_placeholder_str("image", 0)] * 2))
    data = {"image": [natural_image(64, 48, tag=1), natural_image(40, 72, tag=2)]}
    one_ids = processor.info.tokenizer.encode(processor.get_placeholder_str("image", 0))
    one = {"image": [natural_image(56, 56, tag=3)]}
    with LocalProcessExecutor(spec, 1) as lanes:
        got = processor.apply(ids, data, executor=lanes)["mm_kwargs"]
        # the lane makes its next reply's rows where this reply's were: what the caller got stays
        got_one = processor.apply(one_ids, one, executor=lanes)["mm_kwargs"]
    want = processor.apply(ids, data)["mm_kwargs"]
    assert _bytes(got) == _bytes(want)
    assert _bytes(got_one) == _bytes(processor.apply(one_ids, one)["mm_kwargs"])
    for item in got["image"]:
        assert item is not None
        assert sorted(item) == ["image_grid_thw", "pixel_values"]
        assert item["image_grid_thw"].field.keep_on_cpu
        assert item["pixel_values"].data.dtype == torch.uint8


@pytest.mark.parametrize("kind", ["idefics3", "llava_onevision"])
def test_a_lane_of_another_native_family_sends_the_in_place_bytes(kind: str, tmp_path: Path,
                                                                  hf_version: Version) -> None:
    """Idefics3 and LLaVA-OneVision also lay their items out as vLLM's native class reads them,
    which a processor built from its classes alone did not (Idefics3's native layout needs
    transformers >= 5.15; before, it is refused by name)."""
    if kind == "idefics3" and hf_version < Version("5.15"):
        with pytest.raises(UnsupportedModelError, match="Legacy transformers backend"):
            create_processor(build_model_folder(kind, tmp_path / kind))
        return
    processor = create_processor(build_model_folder(kind, tmp_path / kind))
    assert processor.info.native is not None
    spec = LaneSpec.of(processor)
    assert spec is not None
    ids = processor.info.tokenizer.encode(processor.get_placeholder_str("image", 0))
    data = {"image": [natural_image(64, 48, tag=3)]}
    with LocalProcessExecutor(spec, 1) as lanes:
        got = processor.apply(ids, data, executor=lanes)["mm_kwargs"]
    assert _bytes(got) == _bytes(processor.apply(ids, data)["mm_kwargs"])


def test_a_job_splits_per_item_in_modality_then_item_order(gemma3_dir: Path) -> None:
    processor = create_processor(gemma3_dir)
    images = [natural_image(48, 40, tag=t) for t in (1, 2, 3)]
    job = ItemJob(processor.info.parse_mm_data({"image": images}), {"do_pan_and_scan": False})
    parts = job.per_item()
    assert [part.items["image"].get(0) for part in parts] == images
    assert all(part.hf_kwargs == job.hf_kwargs for part in parts)


class _Recording(ItemExecutor):
    """Runs every job in place and remembers how many items each had."""

    def __init__(self) -> None:
        self.jobs: list[dict[str, int]] = []
        self.closed = False

    def run(self, job: ItemJob, processor: ItemProcessor) -> MultiModalKwargsItems:
        self.jobs.append(job.items.get_all_counts())
        return InPlaceExecutor().run(job, processor)

    def close(self) -> None:
        self.closed = True


def test_a_custom_executor_runs_the_misses(gemma3_dir: Path) -> None:
    processor = create_processor(gemma3_dir)
    ids = processor.info.tokenizer.encode(" and ".join([processor.get_placeholder_str("image", 0)] * 3))
    data = {"image": [natural_image(48, 40, tag=t) for t in (6, 7, 6)]}
    with _Recording() as executor:
        got = processor.apply(ids, data, executor=executor)
    assert executor.jobs == [{"image": 2}]  # the repeated image once
    assert executor.closed
    want = processor.apply(ids, data)
    assert _bytes(got["mm_kwargs"]) == _bytes(want["mm_kwargs"])


def test_merged_items_are_placed_as_one_call_would_have_split_them() -> None:
    def items(rows: list[int]) -> MultiModalKwargsItems:
        data = torch.arange(sum(rows) * 2).reshape(sum(rows), 2)
        config = {"pixel_values": MultiModalFieldConfig.flat_from_sizes("image", torch.tensor(rows)),
                  "rows": MultiModalFieldConfig.batched("image")}
        return MultiModalKwargsItems.from_hf_inputs({"pixel_values": data, "rows": torch.tensor(rows)}, config)

    merged = MultiModalKwargsItems.merge([items([2]), items([3]), items([1])])
    whole = items([2, 3, 1])
    assert [item["pixel_values"].field for item in merged["image"] if item is not None] == \
        [item["pixel_values"].field for item in whole["image"] if item is not None]
    assert merged.get_count("image") == 3


def test_in_place_decodes_lazy_items_and_runs_a_job_like_one_hf_call(gemma3_dir: Path) -> None:
    processor = create_processor(gemma3_dir)
    connector = MediaConnector(processor.info.config)
    lazy = [connector.load_image(png(natural_image(48, 40, tag=t)), budget=DecodeBudget(1 << 30)) for t in (8, 9)]
    assert not any(item.is_decoded for item in lazy)
    job = ItemJob(processor.info.parse_mm_data({"image": lazy}), {})
    got = InPlaceExecutor().run(job, processor)
    assert all(item.is_decoded for item in lazy)
    assert list(got["image"]) == list(processor.process_hf_items(job.items, job.hf_kwargs)["image"])
