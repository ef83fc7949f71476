"""The backend's pure helpers: field layout, unpadding, the embedding-token rule, and Legacy's
locating of items in expanded ids (with a property test over random item layouts)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront.errors import FieldConfigError, UnsupportedModelError
from mmfront.inputs import MultiModalBatchedField, MultiModalFlatField
from mmfront.models.transformers.layout import (
    ModalityLayout,
    drop_prompt_outputs,
    field_config,
    merge_item_outputs,
    most_frequent_token,
    slice_dim,
    unpad_images,
)
from mmfront.models.transformers.legacy import PromptFrame, split_positions, token_runs, unwrap, widen_to_wrappers

pytestmark = pytest.mark.backend


def layout(rows: list[int]) -> ModalityLayout:
    return ModalityLayout(count=len(rows), keys=[], rows=rows)


def test_slice_dim_finds_idefics3_leading_batch_dim() -> None:
    assert slice_dim(torch.zeros(1, 8, 3, 4, 4), 8) == 1
    assert slice_dim(torch.zeros(8, 3, 4, 4), 8) == 0
    assert slice_dim(torch.zeros(1, 3, 4, 4), 1) == 0


def test_field_config_picks_flat_rows_batched_or_refuses() -> None:
    flat = field_config("image", "pixel_values", torch.zeros(1, 8, 3, 4, 4), layout([3, 5]))
    assert isinstance(flat.field, MultiModalFlatField) and flat.field.dim == 1
    assert flat.field.slices == [(slice(None), slice(0, 3)), (slice(None), slice(3, 8))]
    per_item = field_config("image", "image_sizes", torch.zeros(2, 2, dtype=torch.long), layout([3, 5]))
    assert isinstance(per_item.field, MultiModalBatchedField)
    listed = field_config("image", "pixel_values", [torch.zeros(3, 4, 4), torch.zeros(3, 2, 4)], layout([1, 1]))
    assert isinstance(listed.field, MultiModalBatchedField)
    with pytest.raises(FieldConfigError, match=r"matches neither 2 item\(s\) nor their 8 row\(s\)"):
        field_config("image", "odd", torch.zeros(7, 3), layout([3, 5]))
    with pytest.raises(FieldConfigError, match="list of 3 entries for 2 item"):
        field_config("image", "odd", [1, 2, 3], layout([1, 1]))
    with pytest.raises(FieldConfigError, match="has no item dimension"):
        field_config("image", "odd", torch.tensor(3), layout([1]))


def test_unpad_images_crops_each_image_to_its_size() -> None:
    pixels = torch.arange(2 * 3 * 4 * 6, dtype=torch.float32).reshape(2, 3, 4, 6)
    data = {"pixel_values": pixels, "image_sizes": torch.tensor([[4, 4], [2, 6]])}
    unpad_images(data)
    assert [tuple(p.shape) for p in data["pixel_values"]] == [(3, 4, 4), (3, 2, 6)]
    assert torch.equal(data["pixel_values"][1], pixels[1, :, :2, :6])
    unpadded = {"pixel_values": pixels, "image_sizes": torch.tensor([[4, 4], [2, 4]])}  # not padded to these sizes
    unpad_images(unpadded)
    assert unpadded["pixel_values"] is pixels


def test_prompt_laid_out_outputs_are_dropped_where_rebuilt_else_refused() -> None:
    mask = torch.ones(1, 5, 2, 4, dtype=torch.int64)
    out = {"input_ids": torch.zeros(1, 5), "pixel_values": torch.zeros(1, 2, 4, 3, 8, 8), "cross_attention_mask": mask}
    drop_prompt_outputs("P", out, {"cross_attention_mask"})
    assert set(out) == {"input_ids", "pixel_values"}
    drop_prompt_outputs("P", out, ())  # nothing laid out along the prompt: nothing to refuse
    assert set(out) == {"input_ids", "pixel_values"}
    with pytest.raises(UnsupportedModelError, match="P returns 'cross_attention_mask', one row per prompt token"):
        drop_prompt_outputs("P", {"cross_attention_mask": mask}, ())


def test_merge_item_outputs_concatenates_rows_or_keeps_per_item_tensors() -> None:
    merged = merge_item_outputs([{"a": torch.zeros(1, 5), "b": torch.zeros(1, 5)},
                                 {"a": torch.ones(2, 5), "b": torch.ones(1, 7)}])
    assert merged["a"].shape == (3, 5)
    assert [tuple(t.shape) for t in merged["b"]] == [(1, 5), (1, 7)]


def test_most_frequent_token() -> None:
    assert most_frequent_token([5, 9, 9, 9, 6, 5]) == 9
    assert most_frequent_token([7, 3, 3, 7]) == 7  # ties go to the first seen


def test_split_positions_by_sizes_splits_merged_runs() -> None:
    positions = np.arange(2, 55)  # Idefics3: two adjacent images marked as one run of 53
    assert split_positions(positions, 2, [20, 33]) == [(2, 22), (22, 55)]
    assert split_positions(positions, 2, None) is None
    two_runs = np.array([1, 2, 3, 7, 8])
    assert split_positions(two_runs, 2, None) == [(1, 4), (7, 9)]
    assert split_positions(two_runs, 2, [2, 3]) == [(1, 4), (7, 9)]  # sizes that straddle a gap fall back
    assert split_positions(two_runs, 3, None) is None
    assert token_runs(np.array([], dtype=np.int64)) == []


def test_widen_to_wrappers() -> None:
    boi, eoi, fake = frozenset({1}), frozenset({2}), frozenset({9})
    # Emu3-like: <boi> 4 * 4 <wrapper> run <eof> <eoi>
    ids = [0, 1, 50, 51, 50, 60, 7, 7, 7, 61, 2, 0]
    assert widen_to_wrappers(ids, [(6, 9)], [boi], [eoi]) == [(1, 11)]
    # an end token before the run belongs to something else: stop there
    ids = [1, 2, 7, 7, 0]
    assert widen_to_wrappers(ids, [(2, 4)], [boi], [eoi]) == [(2, 4)]
    # a shared <fake> between adjacent items goes to the first one
    ids = [0, 9, 7, 7, 9, 7, 7, 9, 0]
    assert widen_to_wrappers(ids, [(2, 4), (5, 7)], [fake, fake], [fake, fake]) == [(1, 5), (5, 8)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 6)), min_size=1, max_size=6), st.booleans())
def test_split_positions_recovers_every_item(layout_spec: list[tuple[int, int]], use_sizes: bool) -> None:
    """Items of ``size`` marked tokens after ``gap`` text tokens: sizes (when given) split even items
    that touch; without sizes, runs work whenever no two items touch."""
    positions: list[int] = []
    spans: list[tuple[int, int]] = []
    cursor = 0
    for gap, size in layout_spec:
        cursor += gap
        spans.append((cursor, cursor + size))
        positions.extend(range(cursor, cursor + size))
        cursor += size
    sizes = [size for _, size in layout_spec] if use_sizes else None
    found = split_positions(np.array(positions), len(spans), sizes)
    touching = any(gap == 0 for gap, _ in layout_spec[1:])
    if use_sizes or not touching:
        assert found == spans
    else:
        assert found is None


def test_unwrap_drops_only_complete_pairs_around_the_placeholder() -> None:
    bos, eos, audio = 1, 2, 7
    assert unwrap([5, bos, audio, eos, 6, audio, bos, audio, 6], [audio], (bos, eos)) == [5, audio, 6, audio, bos, audio, 6]
    ids = [audio, eos]
    assert unwrap(ids, [audio], (bos, eos)) is ids


def test_frame_rewrite_puts_text_around_placeholders_and_before_the_prompt() -> None:
    gemma3 = PromptFrame(lead="\n\n", trail="\n\n")
    assert gemma3.rewrite("a<img>b<img>", "<img>", 2) == "a\n\n<img>\n\nb\n\n<img>\n\n"
    assert PromptFrame(start="<s>", start_per_item=True).rewrite("x<img><img>", "<img>", 2) == "<s><s>x<img><img>"
    assert PromptFrame(start="<s>").rewrite("x<img><img>", "<img>", 2) == "<s>x<img><img>"
