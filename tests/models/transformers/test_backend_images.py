"""Both transformers-backend classes on the offline Gemma3, Idefics3 and Emu3 processors.

Expected ranges are spelled out from each processor's expansion (tiny sizes: Gemma3 16 soft tokens
per image; Idefics3 4 tokens per tile, a 64x32 image is 2 tiles + global, 20x20 is 2x2 + global;
Emu3 h*(w+1) ``<image>`` tokens plus 5 wrapper tokens before and 2 after), and every expansion is
also compared with the HF processor's own ``input_ids``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from backend_cases import BACKENDS, BACKENDS_ANY_VERSION, build, encode, token_id

from mmfront import MultiModalConfig
from mmfront.cache.factory import processor_only_cache_from_config
from mmfront.errors import ProcessorError, PromptUpdateError, ValidationError
from mmfront.fixtures.models.idefics3 import make_idefics3_processor
from mmfront.models.transformers import LegacyMultiModalProcessor, OffsetsMultiModalProcessor
from mmfront.testing.media import make_image
from mmfront.testing.processors import TF_VERSION

pytestmark = pytest.mark.backend

PAS = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 16}


def item_data(out: Any, modality: str, index: int, key: str) -> Any:
    return out["mm_kwargs"][modality][index][key].data


def ranges(out: Any, modality: str = "image") -> list[tuple[int, int]]:
    return [(r.offset, r.length) for r in out["mm_placeholders"][modality]]


def gemma3_seq(hf: Any, cls: type) -> list[int]:
    """What an image occupies: Offsets' range is the whole replacement, Legacy's the boi..eoi span."""
    core = [token_id(hf, "<start_of_image>"), *[token_id(hf, "<image_soft_token>")] * 16, token_id(hf, "<end_of_image>")]
    nl = encode(hf, "\n\n")
    return [*nl, *core, *nl] if cls is OffsetsMultiModalProcessor else core


# --- Gemma3 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", BACKENDS)
@pytest.mark.parametrize("prompt", ["Describe <start_of_image> and <start_of_image> now",
                                    "Look:<start_of_image><start_of_image>"], ids=["separated", "adjacent"])
def test_gemma3_two_images_give_two_placeholders_and_items(cls: type, prompt: str, gemma3_processor: Any) -> None:
    proc = build(cls, gemma3_processor)
    out = proc.apply(prompt, {"image": [make_image(32, 32, 0), make_image(40, 30, 1)]})
    seq = gemma3_seq(gemma3_processor, cls)
    ids = out["prompt_token_ids"]
    placed = ranges(out)
    assert len(placed) == 2 and len(out["mm_kwargs"]["image"]) == 2
    for offset, length in placed:
        assert length == len(seq) and ids[offset:offset + length] == seq
    assert placed[1][0] >= placed[0][0] + placed[0][1]
    for i in range(2):
        assert item_data(out, "image", i, "pixel_values").shape == (1, 3, 32, 32)
        assert int(item_data(out, "image", i, "num_image_patches")) == 1


@pytest.mark.parametrize("cls", BACKENDS)
def test_gemma3_is_embed_masks_structure_tokens(cls: type, gemma3_processor: Any) -> None:
    proc = build(cls, gemma3_processor)
    out = proc.apply("Describe <start_of_image> now", {"image": [make_image(32, 32)]})
    (placeholder,) = out["mm_placeholders"]["image"]
    edge = 2 if cls is OffsetsMultiModalProcessor else 1  # "\n\n", boi / boi
    expected = torch.tensor([False] * edge + [True] * 16 + [False] * edge)
    assert torch.equal(placeholder.is_embed, expected)
    assert 0 < int(placeholder.is_embed.sum()) < placeholder.length


@pytest.mark.parametrize("cls", BACKENDS)
@pytest.mark.parametrize("kind", ["gemma3", "idefics3", "emu3"])
def test_string_and_token_id_prompts_give_the_same_ids(cls: type, kind: str, request: pytest.FixtureRequest) -> None:
    hf = request.getfixturevalue(f"{kind}_processor")
    placeholder = "<start_of_image>" if kind == "gemma3" else "<image>"
    prompt = f"USER: {placeholder} and {placeholder} please"
    images = {"image": [make_image(32, 32, 0), make_image(48, 24, 1)]}
    proc = build(cls, hf)
    from_text = proc.apply(prompt, images)
    from_ids = proc.apply(hf.tokenizer.encode(prompt, add_special_tokens=True), images)
    assert from_text["prompt_token_ids"] == from_ids["prompt_token_ids"]
    assert from_text["mm_placeholders"] == from_ids["mm_placeholders"]
    assert from_text["mm_hashes"] == from_ids["mm_hashes"]


def _hf_expansion(hf: Any, prompt: str, images: list[Any], **kwargs: Any) -> list[int]:
    return hf(text=prompt, images=images, return_tensors="pt", **kwargs)["input_ids"][0].tolist()


@pytest.mark.parametrize("cls", BACKENDS)
def test_gemma3_spliced_ids_equal_hf_expansion(cls: type, gemma3_processor: Any) -> None:
    prompt = "Describe <start_of_image> and <start_of_image> now"
    images = [make_image(32, 32, 0), make_image(40, 30, 1)]
    out = build(cls, gemma3_processor).apply(prompt, {"image": images})
    assert out["prompt_token_ids"] == _hf_expansion(gemma3_processor, prompt, images)


@pytest.mark.parametrize("cls", BACKENDS)
def test_gemma3_pan_and_scan_splits_rows_per_image(cls: type, gemma3_processor: Any) -> None:
    images = [make_image(128, 32, 0), make_image(32, 32, 1), make_image(40, 30, 2)]
    prompt = "A <start_of_image> B <start_of_image> C <start_of_image>"
    proc = build(cls, gemma3_processor)
    if cls is LegacyMultiModalProcessor:
        # Before 5.15 nothing says how many crops an image got, so Legacy refuses clearly.
        with pytest.raises(ProcessorError, match="do_pan_and_scan"):
            proc.apply(prompt, {"image": images}, hf_processor_mm_kwargs=PAS)
        return
    out = proc.apply(prompt, {"image": images}, hf_processor_mm_kwargs=PAS)
    crops = [4, 0, 2]
    for i, image in enumerate(images):
        rows = item_data(out, "image", i, "pixel_values")
        assert int(item_data(out, "image", i, "num_image_patches")) == crops[i] + 1
        alone = gemma3_processor(text="<start_of_image>", images=[image], return_tensors="pt", **PAS)["pixel_values"]
        assert rows.shape == (crops[i] + 1, 3, 32, 32) and torch.equal(rows, alone)
    soft = token_id(gemma3_processor, "<image_soft_token>")
    boi = token_id(gemma3_processor, "<start_of_image>")
    for i, placeholder in enumerate(out["mm_placeholders"]["image"]):
        tokens = out["prompt_token_ids"][placeholder.offset:placeholder.offset + placeholder.length]
        assert tokens.count(boi) == crops[i] + 1
        assert int(placeholder.is_embed.sum()) == 16 * (crops[i] + 1) == tokens.count(soft)
    assert out["prompt_token_ids"] == _hf_expansion(gemma3_processor, prompt, images, **PAS)


@pytest.mark.hf_version(">=5.15", reason="Gemma3Processor reports text_replacement_offsets from transformers 5.15.0")
def test_offsets_repeated_image_hits_the_cache(gemma3_processor: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = build(OffsetsMultiModalProcessor, gemma3_processor)
    cache = processor_only_cache_from_config(MultiModalConfig())
    assert cache is not None
    calls: list[int] = []
    run_hf = proc.run_hf
    monkeypatch.setattr(proc, "run_hf", lambda *a, **k: calls.append(1) or run_hf(*a, **k))
    prompt = "Describe <start_of_image> now"
    first = proc.apply(prompt, {"image": [make_image(40, 30, 7)]}, cache=cache)
    second = proc.apply(prompt, {"image": [make_image(40, 30, 7)]}, cache=cache)
    assert cache.make_stats().hits > 0
    assert len(calls) == 1  # the hit never reached HF
    assert second["prompt_token_ids"] == first["prompt_token_ids"]
    assert second["mm_hashes"] == first["mm_hashes"]
    assert second["mm_placeholders"] == first["mm_placeholders"]
    item = second["mm_kwargs"]["image"][0]
    assert "image_replacement_ids" not in item  # taken out: the cached updates carry the expansion
    assert torch.equal(item["pixel_values"].data, first["mm_kwargs"]["image"][0]["pixel_values"].data)


# --- Idefics3 (offsets since 5.14.1, so Offsets runs under every version) ---------------------


@pytest.mark.parametrize("cls", BACKENDS_ANY_VERSION)
@pytest.mark.parametrize("prompt", ["User:<image> and <image>", "User:<image><image>"], ids=["separated", "adjacent"])
def test_idefics3_two_images_ranges_and_masks(cls: type, prompt: str, idefics3_processor: Any) -> None:
    images = [make_image(64, 32, 0), make_image(20, 20, 1)]
    out = build(cls, idefics3_processor).apply(prompt, {"image": images})
    gap = len(encode(idefics3_processor, " and ")) if "and" in prompt else 0
    assert ranges(out) == [(2, 20), (22 + gap, 33)]
    assert [int(p.is_embed.sum()) for p in out["mm_placeholders"]["image"]] == [12, 20]
    image = token_id(idefics3_processor, "<image>")
    for p in out["mm_placeholders"]["image"]:
        tokens = torch.tensor(out["prompt_token_ids"][p.offset:p.offset + p.length])
        assert torch.equal(p.is_embed, tokens == image)
    assert out["prompt_token_ids"] == _hf_expansion(idefics3_processor, prompt, images)


@pytest.mark.parametrize("cls", BACKENDS_ANY_VERSION)
def test_idefics3_nested_fields_split_along_dim_1(cls: type, idefics3_processor: Any) -> None:
    images = [make_image(64, 32, 0), make_image(20, 20, 1)]
    out = build(cls, idefics3_processor).apply("User:<image><image>", {"image": images})
    for i, (image, tiles) in enumerate(zip(images, [3, 5])):
        alone = idefics3_processor(text="<image>", images=[image], return_tensors="pt")
        pixels = item_data(out, "image", i, "pixel_values")
        assert pixels.shape == (1, tiles, 3, 32, 32)
        assert torch.equal(pixels, alone["pixel_values"])
        assert torch.equal(item_data(out, "image", i, "pixel_attention_mask"), alone["pixel_attention_mask"])
        assert int(item_data(out, "image", i, "num_image_patches")) == tiles


@pytest.mark.parametrize("cls", BACKENDS_ANY_VERSION)
def test_idefics3_mm_only_prompt(cls: type, idefics3_processor: Any) -> None:
    out = build(cls, idefics3_processor).apply("<image>", {"image": [make_image(64, 32)]})
    assert ranges(out) == [(0, 20)]
    assert len(out["prompt_token_ids"]) == 20


def test_idefics3_unsplit_image_has_one_tile(idefics3_processor: Any) -> None:
    """Idefics3 reports num_image_patches=0 for an image it does not split; it still has one tile."""
    out = build(OffsetsMultiModalProcessor, idefics3_processor).apply(
        "User:<image><image>", {"image": [make_image(64, 32, 0), make_image(20, 20, 1)]},
        hf_processor_mm_kwargs={"do_image_splitting": False})
    assert [int(item_data(out, "image", i, "num_image_patches")) for i in range(2)] == [1, 1]
    assert [item_data(out, "image", i, "pixel_values").shape[1] for i in range(2)] == [1, 1]
    assert ranges(out) == [(2, 7), (9, 7)]


def test_idefics3_size_query_leaves_class_defaults_alone(idefics3_processor: Any) -> None:
    """transformers 5.14.1's Idefics3 ``_get_num_multimodal_tokens(**kwargs)`` writes the kwargs into
    class-wide defaults; the backend restores them."""
    kwargs_cls = type(idefics3_processor).valid_processor_kwargs
    before = repr(getattr(kwargs_cls, "_defaults", None))
    build(LegacyMultiModalProcessor, idefics3_processor).apply(
        "User:<image>", {"image": [make_image(64, 32)]}, hf_processor_mm_kwargs={"do_image_splitting": False})
    assert repr(getattr(kwargs_cls, "_defaults", None)) == before


# --- Emu3 -----------------------------------------------------------------------------------


def _emu3_bos_count(cls: type) -> int:
    """HF's own expansion adds BOS: once per sample from 5.15, once per image before."""
    if cls is OffsetsMultiModalProcessor:
        return 0
    return 1 if TF_VERSION.release >= (5, 15) else 2


@pytest.mark.parametrize("cls", BACKENDS)
@pytest.mark.parametrize("prompt", ["USER: <image> hi <image>", "USER: <image><image>"], ids=["separated", "adjacent"])
def test_emu3_two_images_of_different_sizes(cls: type, prompt: str, emu3_processor: Any) -> None:
    images = [make_image(32, 32, 0), make_image(48, 24, 1)]
    out = build(cls, emu3_processor).apply(prompt, {"image": images})
    start = 6 + _emu3_bos_count(cls)
    gap = len(encode(emu3_processor, " hi ")) if "hi" in prompt else 0
    assert ranges(out) == [(start, 27), (start + 27 + gap, 28)]
    assert [int(p.is_embed.sum()) for p in out["mm_placeholders"]["image"]] == [20, 21]
    sizes = [(32, 32), (24, 48)]
    for i, (image, (h, w)) in enumerate(zip(images, sizes)):
        assert item_data(out, "image", i, "image_sizes").tolist() == [[h, w]]
        pixels = item_data(out, "image", i, "pixel_values")
        assert pixels.shape == (3, h, w)
        alone = emu3_processor(text="<image>", images=[image], return_tensors="pt")["pixel_values"][0]
        assert torch.equal(pixels, alone)


def test_emu3_legacy_ids_equal_hf_expansion(emu3_processor: Any) -> None:
    prompt = "USER: <image> hi <image>"
    images = [make_image(32, 32, 0), make_image(48, 24, 1)]
    out = build(LegacyMultiModalProcessor, emu3_processor).apply(prompt, {"image": images})
    assert out["prompt_token_ids"] == _hf_expansion(emu3_processor, prompt, images)


@pytest.mark.hf_version(">=5.15", reason="Emu3Processor gained replace_image_token in transformers 5.15.0")
@pytest.mark.xfail(strict=True, reason="Emu3Processor prepends BOS to the text itself, which a spliced prompt does "
                                       "not have; upstream transformers PR #47924 (its BOS fix) removes it")
def test_emu3_offsets_ids_equal_hf_expansion(emu3_processor: Any) -> None:
    prompt = "USER: <image> hi <image>"
    images = [make_image(32, 32, 0), make_image(48, 24, 1)]
    out = build(OffsetsMultiModalProcessor, emu3_processor).apply(prompt, {"image": images})
    assert out["prompt_token_ids"] == _hf_expansion(emu3_processor, prompt, images)


# --- prompts without items, too few placeholders, embeddings, dtype ---------------------------


@pytest.mark.parametrize("cls", BACKENDS_ANY_VERSION)
def test_text_only_prompt_holding_a_placeholder(cls: type, idefics3_processor: Any) -> None:
    """Idefics3 refuses ``<image>`` without images; the prompt is then tokenized as it is."""
    prompt = "User: what is <image>?"
    out = build(cls, idefics3_processor).apply(prompt, None)
    assert out["prompt_token_ids"] == idefics3_processor.tokenizer.encode(prompt, add_special_tokens=True)
    assert out["mm_placeholders"] == {} and out["mm_hashes"] == {}


def test_legacy_text_only_prompt_is_tokenized_by_hf(gemma3_processor: Any) -> None:
    out = build(LegacyMultiModalProcessor, gemma3_processor).apply("hello there", {})
    assert out["prompt_token_ids"] == gemma3_processor.tokenizer.encode("hello there", add_special_tokens=True)
    assert out["prompt_token_ids"][0] == token_id(gemma3_processor, "<bos>")


@pytest.mark.parametrize("cls", BACKENDS_ANY_VERSION)
def test_too_few_placeholders_is_a_prompt_error(cls: type, idefics3_processor: Any) -> None:
    proc = build(cls, idefics3_processor)
    with pytest.raises(PromptUpdateError, match=r"Expected 2 placeholder\(s\) for image items but found 1") as info:
        proc.apply("User:<image>", {"image": [make_image(64, 32, 0), make_image(20, 20, 1)]})
    assert (info.value.expected, info.value.found) == (2, 1)


@pytest.mark.parametrize("cls", BACKENDS_ANY_VERSION)
def test_precomputed_embeddings_are_refused(cls: type, idefics3_processor: Any) -> None:
    proc = build(cls, idefics3_processor, enable_mm_embeds=True)
    with pytest.raises(ValidationError, match="cannot place precomputed image embeddings"):
        proc.apply("User:<image>", {"image": torch.zeros(1, 4, 8)})


@pytest.mark.parametrize("cls", BACKENDS_ANY_VERSION)
def test_floating_outputs_take_the_model_dtype(cls: type) -> None:
    # PIL: transformers 5.14.1's torchvision Idefics3 processor returns a float pixel_attention_mask,
    # which then takes the model dtype like any floating output
    hf = make_idefics3_processor(backend="pil")
    out = build(cls, hf, dtype="bfloat16").apply("User:<image>", {"image": [make_image(64, 32)]})
    assert item_data(out, "image", 0, "pixel_values").dtype == torch.bfloat16
    assert item_data(out, "image", 0, "pixel_attention_mask").dtype != torch.bfloat16
