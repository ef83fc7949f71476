"""The native Gemma3 processor on the offline tiny Gemma3 folder (32 px, 16 soft tokens).

Expected ids are spelled out from the tokenizer's own ids (``\\n\\n`` then ``<start_of_image>``,
16 ``<image_soft_token>``, ``<end_of_image>``, ``\\n\\n``), and every expansion is also compared
with the HF processor's own ``input_ids``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from mmfront import MultiModalConfig
from mmfront.cache.factory import processor_only_cache_from_config
from mmfront.errors import PromptUpdateError
from mmfront.models.gemma3 import Gemma3MultiModalProcessor, pan_and_scan_grid
from mmfront.models.registry import create_processor
from mmfront.testing.media import make_image

PAS = {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 16}


@pytest.fixture(scope="module")
def proc(gemma3_dir: Path) -> Gemma3MultiModalProcessor:
    processor = create_processor(gemma3_dir)
    assert isinstance(processor, Gemma3MultiModalProcessor)
    return processor


@pytest.fixture(scope="module")
def ids(gemma3_processor: Any) -> dict[str, int]:
    tok = gemma3_processor.tokenizer
    names = {"bos": "<bos>", "boi": "<start_of_image>", "eoi": "<end_of_image>", "soft": "<image_soft_token>",
             "sot": "<start_of_turn>", "eot": "<end_of_turn>"}
    out = {k: tok.convert_tokens_to_ids(v) for k, v in names.items()}
    for text in ("\n", "\n\n", "\n\n\n", "\n\n\n\n"):
        (out[text],) = tok.encode(text, add_special_tokens=False)
    return out


def enc(processor: Any, text: str) -> list[int]:
    return processor.tokenizer.encode(text, add_special_tokens=False)


def image_seq(ids: dict[str, int]) -> list[int]:
    return [ids["\n\n"], ids["boi"], *[ids["soft"]] * 16, ids["eoi"], ids["\n\n"]]


def mask(*runs: tuple[bool, int]) -> torch.Tensor:
    return torch.tensor([v for v, n in runs for _ in range(n)])


def hf_ids(gemma3_processor: Any, prompt: str, images: list[Any], **kwargs: Any) -> list[int]:
    out = gemma3_processor(text=prompt, images=images, return_tensors="pt", add_special_tokens=False, **kwargs)
    return out["input_ids"][0].tolist()


def test_text_only_prompt_skips_the_processor(proc: Gemma3MultiModalProcessor, gemma3_processor: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proc, "_call_hf_processor", lambda *a, **k: pytest.fail("HF processor called"))
    prompt = "<start_of_turn>user\nDescribe this image.<end_of_turn>\n"
    out = proc.apply(prompt, None, add_special_tokens=False)
    assert out["prompt_token_ids"] == enc(gemma3_processor, prompt)
    assert out["mm_placeholders"] == {} and out["mm_hashes"] == {} and dict(out["mm_kwargs"]) == {}


def test_one_image_exact_ids_and_range(proc: Gemma3MultiModalProcessor, gemma3_processor: Any,
                                       ids: dict[str, int]) -> None:
    prompt = "<bos><start_of_turn>user\n<start_of_image>Describe this image.<end_of_turn>\n"
    image = make_image(40, 30, seed=0)
    out = proc.apply(prompt, {"image": [image]}, add_special_tokens=False)

    head = enc(gemma3_processor, "<bos><start_of_turn>user")
    tail = enc(gemma3_processor, "Describe this image.<end_of_turn>\n")
    # "user\n" + "\n\n<boi>" merges into "\n\n\n": the range starts at that merged token.
    expected = [*head, ids["\n\n\n"], *image_seq(ids)[1:], *tail]
    assert out["prompt_token_ids"] == expected
    assert out["prompt_token_ids"] == hf_ids(gemma3_processor, prompt, [image])
    (placeholder,) = out["mm_placeholders"]["image"]
    assert (placeholder.offset, placeholder.length) == (len(head), 20)
    assert torch.equal(placeholder.is_embed, mask((False, 2), (True, 16), (False, 2)))
    assert placeholder.get_num_embeds() == 16
    (item,) = out["mm_kwargs"]["image"]
    assert item is not None and tuple(item["pixel_values"].data.shape) == (1, 3, 32, 32)
    assert int(item["num_patches"].data) == 1
    assert item["pixel_values"].data.dtype == torch.bfloat16  # config.json says torch_dtype bfloat16


def test_two_separated_images(proc: Gemma3MultiModalProcessor, gemma3_processor: Any, ids: dict[str, int]) -> None:
    prompt = "<start_of_turn>user\nCompare <start_of_image> and <start_of_image><end_of_turn>\n"
    images = [make_image(40, 30, seed=0), make_image(48, 64, seed=1)]
    out = proc.apply(prompt, {"image": images}, add_special_tokens=False)
    a = enc(gemma3_processor, "<start_of_turn>user\nCompare ")
    b = enc(gemma3_processor, " and ")
    c = enc(gemma3_processor, "<end_of_turn>\n")
    assert out["prompt_token_ids"] == [*a, *image_seq(ids), *b, *image_seq(ids), *c]
    assert out["prompt_token_ids"] == hf_ids(gemma3_processor, prompt, images)
    first, second = out["mm_placeholders"]["image"]
    assert (first.offset, first.length) == (len(a), 20)
    assert (second.offset, second.length) == (len(a) + 20 + len(b), 20)
    assert len(out["mm_kwargs"]["image"]) == 2 and len(set(out["mm_hashes"]["image"])) == 2


def test_adjacent_images_do_not_overlap(proc: Gemma3MultiModalProcessor, gemma3_processor: Any,
                                        ids: dict[str, int]) -> None:
    prompt = "<start_of_turn>user\nX<start_of_image><start_of_image>Y<end_of_turn>\n"
    images = [make_image(40, 30, seed=0), make_image(48, 64, seed=1)]
    out = proc.apply(prompt, {"image": images}, add_special_tokens=False)
    head = enc(gemma3_processor, "<start_of_turn>user\nX")
    tail = enc(gemma3_processor, "Y<end_of_turn>\n")
    seq = image_seq(ids)
    # "<eoi>\n\n" + "\n\n<boi>" merge into one "\n\n\n\n" token, as HF tokenizes the expanded text.
    assert out["prompt_token_ids"] == [*head, *seq[:-1], ids["\n\n\n\n"], *seq[1:], *tail]
    assert out["prompt_token_ids"] == hf_ids(gemma3_processor, prompt, images)
    first, second = out["mm_placeholders"]["image"]
    # The shared token belongs to the first image; the second starts right after it.
    assert (first.offset, first.length) == (len(head), 20)
    assert (second.offset, second.length) == (len(head) + 20, 19)
    assert first.offset + first.length == second.offset
    assert torch.equal(first.is_embed, mask((False, 2), (True, 16), (False, 2)))
    assert torch.equal(second.is_embed, mask((False, 1), (True, 16), (False, 2)))
    assert first.get_num_embeds() == second.get_num_embeds() == 16


@pytest.mark.parametrize(
    ("before", "after", "lead", "trail"),
    [
        ("x", "y", "\n\n", "\n\n"),          # no merge
        ("x\n", "y", "\n\n\n", "\n\n"),      # "\n" + "\n\n"
        ("x", "\ny", "\n\n", "\n\n\n"),      # "\n\n" + "\n"
        ("x\n", "\ny", "\n\n\n", "\n\n\n"),  # both sides
        ("x\n\n", "y", "\n\n\n\n", "\n\n"),  # "\n\n" + "\n\n"
    ],
)
def test_newline_merges(proc: Gemma3MultiModalProcessor, gemma3_processor: Any, ids: dict[str, int],
                        before: str, after: str, lead: str, trail: str) -> None:
    prompt = f"{before}<start_of_image>{after}"
    image = make_image(40, 30, seed=0)
    out = proc.apply(prompt, {"image": [image]}, add_special_tokens=False)
    head = enc(gemma3_processor, before.rstrip("\n"))
    rest = enc(gemma3_processor, after.lstrip("\n"))
    expected = [*head, ids[lead], ids["boi"], *[ids["soft"]] * 16, ids["eoi"], ids[trail], *rest]
    assert out["prompt_token_ids"] == expected
    assert out["prompt_token_ids"] == hf_ids(gemma3_processor, prompt, [image])
    (placeholder,) = out["mm_placeholders"]["image"]
    assert (placeholder.offset, placeholder.length) == (len(head), 20)
    assert out["prompt_token_ids"][placeholder.offset + 1] == ids["boi"]
    assert out["prompt_token_ids"][placeholder.offset + placeholder.length - 1] == ids[trail]


def test_pan_and_scan_crops(proc: Gemma3MultiModalProcessor, gemma3_processor: Any, ids: dict[str, int]) -> None:
    prompt = "<start_of_turn>user\nA <start_of_image> B <start_of_image><end_of_turn>\n"
    wide, small = make_image(128, 32, seed=2), make_image(40, 30, seed=0)
    out = proc.apply(prompt, {"image": [wide, small]}, hf_processor_mm_kwargs=PAS, add_special_tokens=False)
    assert out["prompt_token_ids"] == hf_ids(gemma3_processor, prompt, [wide, small], **PAS)
    hf = gemma3_processor(text=prompt, images=[wide, small], return_tensors="pt", **PAS)
    first, second = out["mm_kwargs"]["image"]
    assert first is not None and second is not None
    assert int(first["num_patches"].data) == 5 and int(second["num_patches"].data) == 3
    rows = torch.cat([first["pixel_values"].data, second["pixel_values"].data]).float()
    assert rows.shape == hf["pixel_values"].shape == (8, 3, 32, 32)
    # Native pixels follow HF's torchvision backend; the PIL backend differs by <= 1 intensity level.
    assert (rows - hf["pixel_values"]).abs().max() <= 2 / 127.5 + 1e-6
    wide_ph, small_ph = out["mm_placeholders"]["image"]
    seq = image_seq(ids)
    intro = enc(gemma3_processor, "Here is the original image ")
    assert out["prompt_token_ids"][wide_ph.offset:wide_ph.offset + len(intro)] == intro
    assert wide_ph.get_num_embeds() == 5 * 16 and small_ph.get_num_embeds() == 3 * 16
    assert wide_ph.length == len(proc._replacement_ids(4)) and len(seq) < wide_ph.length
    assert pan_and_scan_grid(128, 32, proc.info.image_kwargs(PAS)) == (4, 1)


def test_repeated_image_hits_the_cache(gemma3_dir: Path) -> None:
    config = MultiModalConfig()
    proc = create_processor(gemma3_dir, config)
    cache = processor_only_cache_from_config(config)
    assert cache is not None
    prompt = "<start_of_turn>user\n<start_of_image>Hi<end_of_turn>\n"
    image = make_image(40, 30, seed=3)
    first = proc.apply(prompt, {"image": [image]}, cache=cache)
    second = proc.apply(prompt, {"image": [image]}, cache=cache)
    assert cache.make_stats().hits == 1
    assert first["prompt_token_ids"] == second["prompt_token_ids"]
    assert first["mm_hashes"] == second["mm_hashes"]
    assert first["mm_placeholders"] == second["mm_placeholders"]
    assert first["mm_kwargs"]["image"][0] == second["mm_kwargs"]["image"][0]


def test_fewer_placeholders_than_images(proc: Gemma3MultiModalProcessor) -> None:
    images = [make_image(40, 30, seed=0), make_image(48, 64, seed=1)]
    with pytest.raises(PromptUpdateError, match="Expected 2") as info:
        proc.apply("one <start_of_image> only", {"image": images})
    assert (info.value.modality, info.value.expected, info.value.found) == ("image", 2, 1)


def test_request_kwargs_beat_config_kwargs(gemma3_dir: Path) -> None:
    config = MultiModalConfig(mm_processor_kwargs={"do_pan_and_scan": False, "pan_and_scan_min_crop_size": 16})
    proc = create_processor(gemma3_dir, config)
    wide = make_image(128, 32, seed=2)
    off = proc.apply("<start_of_image>", {"image": [wide]})
    on = proc.apply("<start_of_image>", {"image": [wide]}, hf_processor_mm_kwargs={"do_pan_and_scan": True})
    scoped = proc.apply("<start_of_image>", {"image": [wide]},
                        hf_processor_mm_kwargs={"do_pan_and_scan": False, "images_kwargs": {"do_pan_and_scan": True}})
    assert off["mm_placeholders"]["image"][0].get_num_embeds() == 16
    assert on["mm_placeholders"]["image"][0].get_num_embeds() == 80
    assert scoped["mm_placeholders"]["image"][0].get_num_embeds() == 80
    assert off["mm_hashes"] != on["mm_hashes"]  # request kwargs are hash factors
    unknown = proc.apply("<start_of_image>", {"image": [wide]}, hf_processor_mm_kwargs={"no_such_kwarg": 1})
    assert unknown["prompt_token_ids"] == off["prompt_token_ids"]


def test_max_tokens_per_item(gemma3_dir: Path) -> None:
    assert create_processor(gemma3_dir).get_max_tokens_per_item() == {"image": 16}
    config = MultiModalConfig(mm_processor_kwargs={"do_pan_and_scan": True})
    assert create_processor(gemma3_dir, config).get_max_tokens_per_item() == {"image": 5 * 16}
