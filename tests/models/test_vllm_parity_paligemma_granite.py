"""PaliGemma and Granite 4 Vision send what vLLM 0.33's native frontend sends (the harness is
``vllm_parity``, see ``test_vllm_parity.py``).

PaliGemma (``src/mmfront/models/paligemma.py``): vLLM names no placeholder and inserts an image's
``<image>`` tokens and a BOS at the start of the prompt (a range of 257 tokens whose BOS is not
embedded), appends a newline, and takes one image per prompt; its one field is the image's batched
``pixel_values``. Images of three sizes and aspect ratios; two images are refused on both sides.

Granite 4 Vision (``src/mmfront/models/granite4_vision.py``): LLaVA-NeXT's processing with the
config's ``downsample_rate`` (the fixture's 128 px tiles of 4 x 4 patches, which the real checkpoints'
rate "4/8" divides): an image's anyres tiles and its ``image_sizes`` (on the CPU), batched, ranges
without a mask. Images of several sizes, two images, the same image twice, and two images of different
tile counts, where vLLM pads the smaller image's tiles with zero tiles (the intended difference of
docs/vllm-parity.md, proven here as LLaVA-NeXT's is).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from vllm_parity import (
    Case,
    assert_a_hit_sends_the_miss,
    default_cases,
    family_folder,
    prompt_for,
    run_family,
    wire_frames,
)

from mmfront import MultiModalConfig
from mmfront.cache.factory import processor_only_cache_from_config
from mmfront.chat import parse_chat_messages
from mmfront.errors import PromptUpdateError, UnsupportedModelError, ValidationError
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.granite4_vision import GRANITE4_VISION_NATIVE
from mmfront.models.paligemma import PALIGEMMA_NATIVE, paligemma_newline
from mmfront.models.registry import create_processor
from mmfront.models.transformers import OFFSETS_MIN_VERSION, TRANSFORMERS_VERSION
from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()
needs_peer = pytest.mark.skipif(PEER is None, reason=SKIP_REASON)
LEGACY = TRANSFORMERS_VERSION < OFFSETS_MIN_VERSION
PALIGEMMA_ON_LEGACY = ("the Legacy transformers backend refuses PaliGemma whatever the implementation "
                       "(test_paligemma_is_refused_on_the_legacy_backend)")

IMAGE_TOKENS = 256
"""PaliGemma's tokens per image: (224 px / 14 px patches)^2, the fixture's ``image_seq_length`` and what
vLLM counts from its vision config."""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity-paligemma-granite")


def _digest(tensor: torch.Tensor) -> str:
    """The peer's hash of a tensor's bytes (``data/vllm_apply_peer.py``)."""
    raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
    return hashlib.sha256(raw).hexdigest()[:16]


# --- PaliGemma ----------------------------------------------------------------------------------


def _paligemma_cases() -> list[Case]:
    """One image of three sizes and aspect ratios (vLLM's limit), and two images, which both refuse."""
    one = [c for c in default_cases(["image"]) if len(c.media) == 1]
    return [*one, Case("image_wide", "image", [make_image(300, 100, seed=5)]),
            Case("image_two", "image", [make_image(48, 40, seed=0), make_image(64, 32, seed=1)])]


def _paligemma(root: Path, **config: Any) -> Any:
    folder, _ = family_folder("PaliGemmaProcessor", root)
    return create_processor(folder, MultiModalConfig(**config))


def _special_ids(proc: Any) -> tuple[int, int, int]:
    """``(<image>, BOS, "\\n")`` of the folder's tokenizer."""
    tokenizer = proc.info.get_tokenizer()
    return (tokenizer.convert_tokens_to_ids("<image>"), tokenizer.bos_token_id, tokenizer.convert_tokens_to_ids("\n"))


@needs_peer
@pytest.mark.slow
@pytest.mark.skipif(LEGACY, reason=PALIGEMMA_ON_LEGACY)
def test_paligemma_equals_vllm_native(root: Path) -> None:
    cases = _paligemma_cases()
    result = run_family("PaliGemmaProcessor", root, cases=cases)
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    resolved = result["vllm"]["resolved"]
    assert resolved["processor"] == "PaliGemmaMultiModalProcessor"
    assert resolved["placeholders"]["image"] is None  # vLLM's chat template writes no placeholder; mmfront's neither
    assert (resolved["dtype"], resolved["mm_device_do_normalize"], result["mmfront_impl"]) == ("bfloat16", False, "native")
    assert set(result["diff"]) == {c.name for c in cases}
    limit = "At most 1 image(s) may be provided in one prompt."
    two = result["diff"].pop("image_two")
    assert (two["differs"], two["vllm_error"]) == (["error"], f"VLLMValidationError: {limit} (parameter=image)")
    assert two["mmfront_error"].startswith(f"ValidationError: {limit} vLLM 0.33's native PaliGemma class takes one image")
    for name, diff in result["diff"].items():
        assert diff == {"differs": [], "details": []}, f"PaliGemma {name}: {diff}"

    proc = _paligemma(root)
    image, bos, newline = _special_ids(proc)
    prompt = proc.info.get_tokenizer().encode(prompt_for("", 1), add_special_tokens=False)
    for name in ("image_one", "image_tall", "image_wide"):
        vllm = result["vllm"]["cases"][name]
        assert vllm["prompt_token_ids"] == [image] * IMAGE_TOKENS + [bos] + prompt + [newline]
        assert vllm["mm_placeholders"] == {"image": [[0, IMAGE_TOKENS + 1, [True] * IMAGE_TOKENS + [False]]]}
        (item,) = vllm["mm_kwargs"]["image"]
        assert set(item) == {"pixel_values"}
        assert item["pixel_values"]["field"] == ["batched", {"keep_on_cpu": False}]
        assert item["pixel_values"]["data"][1:3] == ["bfloat16", [3, 224, 224]]
        assert result["mmfront"][name]["mm_kwargs"]["image"] == [item]


def test_paligemma_lays_the_prompt_out_as_vllm(root: Path) -> None:
    """vLLM's layout on a text prompt and on ids; a placeholder typed into the prompt is a token no image fills."""
    if LEGACY:
        pytest.skip(PALIGEMMA_ON_LEGACY)
    proc = _paligemma(root)
    assert proc.info.native is PALIGEMMA_NATIVE
    assert proc.get_placeholder_str("image", 0) == ""
    assert proc.info.get_supported_mm_limits() == {"image": 1}
    image, bos, newline = _special_ids(proc)
    tokenizer = proc.info.get_tokenizer()
    picture = make_image(48, 40, seed=0)
    caption = tokenizer.encode("caption en", add_special_tokens=False)
    out = proc.apply("caption en", {"image": [picture]}, add_special_tokens=False)
    assert out["prompt_token_ids"] == [image] * IMAGE_TOKENS + [bos] + caption + [newline]
    (placeholder,) = out["mm_placeholders"]["image"]
    assert (placeholder.offset, placeholder.length) == (0, IMAGE_TOKENS + 1)
    assert placeholder.is_embed is not None and placeholder.is_embed.tolist() == [True] * IMAGE_TOKENS + [False]
    (item,) = out["mm_kwargs"]["image"]
    assert item is not None and set(item) == {"pixel_values"}
    assert item["pixel_values"].data.dtype == torch.bfloat16 and item["pixel_values"].data.shape == (3, 224, 224)
    # a prompt that already ends in the newline gets no second one; an empty prompt is the image alone
    ended = proc.apply([*caption, newline], {"image": [picture]})["prompt_token_ids"]
    assert ended == [image] * IMAGE_TOKENS + [bos] + caption + [newline]
    assert proc.apply([], {"image": [picture]})["prompt_token_ids"] == [image] * IMAGE_TOKENS + [bos, newline]
    # without an image the prompt is the text alone, as vLLM runs no multimodal processor for it
    assert proc.apply(caption, {})["prompt_token_ids"] == caption

    with pytest.raises(PromptUpdateError, match=r"holds 1 '<image>' that no image item fills"):
        proc.apply(tokenizer.encode("<image>caption en", add_special_tokens=False), {"image": [picture]})
    with pytest.raises(ValidationError, match=r"^At most 1 image\(s\) may be provided in one prompt\. vLLM 0\.33's native PaliGemma class "
                                               r"takes one image per prompt .*--model-impl transformers"):
        proc.apply(caption, {"image": [picture, picture]})


def test_paligemma_inserts_after_the_bos_its_tokenizer_adds(root: Path) -> None:
    """PaliGemma 1's tokenizer adds a BOS (``add_bos_token``; PaliGemma 2's does not): vLLM inserts the
    image after it."""
    if LEGACY:
        pytest.skip(PALIGEMMA_ON_LEGACY)
    proc = _paligemma(root)
    image, bos, newline = _special_ids(proc)
    tokenizer = proc.info.hf_processor.tokenizer
    assert tokenizer.add_bos_token is False  # the fixture's, as PaliGemma 2's
    tokenizer.add_bos_token = True
    caption = tokenizer.encode("caption en", add_special_tokens=False)
    out = proc.apply([bos, *caption], {"image": [make_image(48, 40, seed=0)]})
    assert out["prompt_token_ids"] == [bos] + [image] * IMAGE_TOKENS + [bos] + caption + [newline]
    (placeholder,) = out["mm_placeholders"]["image"]
    assert (placeholder.offset, placeholder.length) == (1, IMAGE_TOKENS + 1)


def test_paligemma_newline_is_the_tokenizers_own_token(root: Path) -> None:
    if LEGACY:
        pytest.skip(PALIGEMMA_ON_LEGACY)
    tokenizer = _paligemma(root).info.get_tokenizer()
    newline = tokenizer.convert_tokens_to_ids("\n")
    assert paligemma_newline([5, 6], tokenizer) == [5, 6, newline]
    assert paligemma_newline([5, newline], tokenizer) == [5, newline]


def test_paligemma_chat_names_no_placeholder(root: Path) -> None:
    """vLLM's PaliGemma names no placeholder, so a chat's image part adds no text: the image goes where
    the processor inserts it."""
    if LEGACY:
        pytest.skip(PALIGEMMA_ON_LEGACY)
    proc = _paligemma(root, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_data_url(make_image(40, 30))}},
                                             {"type": "text", "text": "caption en"}]}]
    chat = parse_chat_messages(messages, proc, MediaConnector(proc.info.config), budget=DecodeBudget(1 << 30))
    assert chat.prompt == "caption en"
    assert len(chat.mm_data["image"]) == 1
    out = proc.apply(chat.prompt, chat.mm_data, add_special_tokens=False)
    image, bos, newline = _special_ids(proc)
    caption = proc.info.get_tokenizer().encode("caption en", add_special_tokens=False)
    assert out["prompt_token_ids"] == [image] * IMAGE_TOKENS + [bos] + caption + [newline]


def test_paligemma_cache_hit_sends_what_a_miss_sends(root: Path) -> None:
    if LEGACY:
        pytest.skip(PALIGEMMA_ON_LEGACY)
    proc = _paligemma(root)
    cache = processor_only_cache_from_config(proc.info.config)
    assert cache is not None
    ids = proc.info.get_tokenizer().encode("caption en", add_special_tokens=False)
    picture = make_image(64, 32, seed=1)
    miss = proc.apply(ids, {"image": [picture]}, cache=cache)
    hit = proc.apply(ids, {"image": [picture]}, cache=cache)
    assert cache.make_stats().hits == 1
    assert (hit["prompt_token_ids"], hit["mm_hashes"]) == (miss["prompt_token_ids"], miss["mm_hashes"])
    assert [(p.offset, p.length, p.is_embed.tolist()) for p in hit["mm_placeholders"]["image"]] == [
        (p.offset, p.length, p.is_embed.tolist()) for p in miss["mm_placeholders"]["image"]]
    assert wire_frames(hit) == wire_frames(miss)


def test_paligemma_transformers_backend_keeps_hf_layout(root: Path) -> None:
    """``--model-impl transformers``: HF's layout (the image where the prompt names it, BOS after it, a
    256-token range), which the coverage suite proves equal to HF's processor."""
    if LEGACY:
        pytest.skip(PALIGEMMA_ON_LEGACY)
    proc = _paligemma(root, model_impl="transformers")
    assert proc.info.native is None and proc.get_placeholder_str("image", 0) == "<image>"
    image, bos, newline = _special_ids(proc)
    tokenizer = proc.info.get_tokenizer()
    out = proc.apply("<image>caption en", {"image": [make_image(48, 40, seed=0)]}, add_special_tokens=False)
    caption = tokenizer.encode("caption en", add_special_tokens=False)
    assert out["prompt_token_ids"] == [image] * IMAGE_TOKENS + [bos] + tokenizer.encode(
        "caption en\n", add_special_tokens=False)
    assert out["prompt_token_ids"][IMAGE_TOKENS + 1:] == [*caption, newline]
    (placeholder,) = out["mm_placeholders"]["image"]
    assert (placeholder.offset, placeholder.length) == (0, IMAGE_TOKENS)


@pytest.mark.skipif(not LEGACY, reason="the Legacy backend is the default under transformers < 5.15 only")
def test_paligemma_is_refused_on_the_legacy_backend(root: Path) -> None:
    """Legacy cannot lay PaliGemma's prompt out apart from its items: refused with the cause, whatever
    the implementation."""
    for impl in ("auto", "transformers"):
        with pytest.raises(UnsupportedModelError, match=r"Legacy transformers backend cannot reproduce how "
                                                         r"PaliGemmaProcessor rewrites the text"):
            _paligemma(root, model_impl=impl)


# --- Granite 4 Vision ---------------------------------------------------------------------------


RANGES = {32: {"image_one": [[2, 10]], "image_big": [[2, 24]], "image_two_tile_counts": [[2, 14], [18, 24]]},
          16: {"image_one": [[2, 36]], "image_big": [[2, 88]], "image_two_tile_counts": [[2, 52], [56, 88]]}}
"""Granite 4 Vision's ranges by the folder's patch size (the model type's default vision tower: 32 px
patches under the newest transformers, 16 px under 5.14.1): 128 px tiles of 4 x 4 or 8 x 8 patches,
which the rate "4/8" halves."""


def _tile_counts_case() -> Case:
    """A wide image (a row of two 128 px tiles) beside a large square one (a 2 x 2 grid): vLLM pads the first."""
    return Case("image_two_tile_counts", "image", [make_image(256, 100, seed=5), make_image(200, 200, seed=6)])


def _granite_items(root: Path, case: Case) -> list[Any]:
    folder, _ = family_folder("Granite4VisionProcessor", root)
    proc = create_processor(folder)
    ids = proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str("image", 0), len(case.media)),
                                           add_special_tokens=False)
    return list(proc.apply(ids, {"image": case.media})["mm_kwargs"]["image"])


@needs_peer
@pytest.mark.slow
def test_granite4_vision_equals_vllm_native(root: Path) -> None:
    padded = _tile_counts_case()
    cases = [*default_cases(["image"]), Case("image_big", "image", [make_image(200, 200, seed=6)]), padded]
    result = run_family("Granite4VisionProcessor", root, cases=cases)
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    resolved = result["vllm"]["resolved"]
    assert resolved["processor"] == "Granite4VisionMultiModalProcessor"
    assert (resolved["dtype"], resolved["mm_device_do_normalize"], result["mmfront_impl"]) == ("bfloat16", False, "native")
    assert set(result["diff"]) == {c.name for c in cases}
    for name, diff in result["diff"].items():
        if name != padded.name:
            assert diff == {"differs": [], "details": []}, f"Granite4-Vision {name}: {diff}"
    vllm = result["vllm"]["cases"]
    # the counts vLLM takes from the config's downsample_rate
    patch = json.loads((family_folder("Granite4VisionProcessor", root)[0] / "config.json").read_text())[
        "vision_config"]["patch_size"]
    for name, ranges in RANGES[patch].items():
        assert [r[:2] for r in vllm[name]["mm_placeholders"]["image"]] == ranges, name
    assert all(r[2] is None for r in vllm["image_two"]["mm_placeholders"]["image"])
    (alone,) = result["mmfront"]["image_one"]["mm_kwargs"]["image"]
    assert result["mmfront"]["image_two"]["mm_kwargs"]["image"][0] == alone == vllm["image_one"]["mm_kwargs"]["image"][0]
    assert set(alone) == {"pixel_values", "image_sizes"}
    assert alone["pixel_values"]["field"] == ["batched", {"keep_on_cpu": False}]
    assert alone["pixel_values"]["data"][1:3] == ["bfloat16", [3, 3, 128, 128]]
    assert alone["image_sizes"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert alone["image_sizes"]["data"][1:3] == ["int64", [2]]

    # vLLM's item of the smaller image: mmfront's tiles, then zero tiles up to the larger image's count.
    (small, large) = _granite_items(root, padded)
    mine = small["pixel_values"].data
    vllm_small, vllm_large = vllm[padded.name]["mm_kwargs"]["image"]
    _, dtype, shape, digest = vllm_small["pixel_values"]["data"]
    assert (dtype, shape, list(mine.shape)) == ("bfloat16", [5, 3, 128, 128], [3, 3, 128, 128])
    assert digest == _digest(torch.cat([mine, mine.new_zeros((2, *mine.shape[1:]))]))
    assert result["diff"][padded.name] == {
        "differs": ["shape"], "details": ["image[0].pixel_values shape vLLM [5, 3, 128, 128] mmfront [3, 3, 128, 128]"]}
    assert vllm_large == result["mmfront"][padded.name]["mm_kwargs"]["image"][1]
    assert large["pixel_values"].data.shape == (5, 3, 128, 128)


def test_granite4_vision_fixture_matches_a_checkpoints_rate(root: Path) -> None:
    """The folder's processor and config carry the real checkpoints' ``downsample_rate`` and
    ``num_additional_image_tokens``, on tiles that rate divides."""
    folder, _ = family_folder("Granite4VisionProcessor", root)
    proc = create_processor(folder)
    assert proc.info.native is GRANITE4_VISION_NATIVE
    hf = proc.info.hf_processor
    config = proc.info.get_hf_config()
    assert (hf.downsample_rate, hf.num_additional_image_tokens, config.downsample_rate) == ("4/8", 1, "4/8")
    assert hf.patch_size == config.vision_config.patch_size in RANGES
    assert hf.image_processor.crop_size["height"] == config.vision_config.image_size == 128


def test_granite4_vision_cache_hit_sends_what_a_miss_sends(root: Path) -> None:
    folder, _ = family_folder("Granite4VisionProcessor", root)
    proc = create_processor(folder)
    miss, _ = assert_a_hit_sends_the_miss(proc, "image", _tile_counts_case().media)
    small, large = miss["mm_kwargs"]["image"]
    assert small is not None and large is not None
    assert small["pixel_values"].data.dtype == torch.bfloat16
    assert (small["pixel_values"].data.shape, large["pixel_values"].data.shape) == ((3, 3, 128, 128), (5, 3, 128, 128))
    assert small["image_sizes"].data.tolist() == [100, 256]
    ranges = RANGES[proc.info.hf_processor.patch_size]["image_two_tile_counts"]
    assert [[p.offset, p.length] for p in miss["mm_placeholders"]["image"]] == ranges
    assert all(p.is_embed is None for p in miss["mm_placeholders"]["image"])
