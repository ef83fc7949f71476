"""LLaVA-OneVision through the transformers backend, on the offline ``llava_onevision`` fixture:
prompt ids, placeholder ranges and each image's tiles equal what the HF processor produces; the
fixture's random-weight config is the real architecture's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from vision_cases import check_placeholders, hf_call, images, item, prompt

from markers import NEEDS_TORCHVISION
from mmfront import MultiModalConfig, create_processor
from mmfront.fixtures.models.llava_onevision import LLAVA_ONEVISION_CHAT_TEMPLATE
from mmfront.testing.models import build_model_folder, load_processor

pytestmark = [pytest.mark.backend, NEEDS_TORCHVISION]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_folder("llava_onevision", tmp_path_factory.mktemp("llava_onevision"))


@pytest.fixture(scope="module")
def hf(folder: Path) -> Any:
    return load_processor(folder)


@pytest.fixture(scope="module")
def processor(folder: Path) -> Any:
    return create_processor(folder, MultiModalConfig(dtype="float32", model_impl="transformers"))


def tiles(pixels: torch.Tensor) -> torch.Tensor:
    """An item's tiles ``[tiles, 3, size, size]``, whether or not it keeps its batch axis."""
    return pixels.reshape(-1, *pixels.shape[-3:])


def test_the_folder_loads_as_llava_onevision_with_a_video_processor(folder: Path, hf: Any) -> None:
    assert type(hf).__name__ == "LlavaOnevisionProcessor"
    assert type(hf.video_processor).__name__ == "LlavaOnevisionVideoProcessor"
    assert hf.chat_template == LLAVA_ONEVISION_CHAT_TEMPLATE
    assert json.loads((folder / "config.json").read_text())["model_type"] == "llava_onevision"


@pytest.mark.parametrize("count", [1, 2, 3])
def test_ids_placeholders_and_tiles_equal_hf(processor: Any, hf: Any, count: int) -> None:
    text, items = prompt("<image>", count), images(count)
    out = processor.apply(text, {"image": items})
    want = hf_call(hf, text, items)
    ids = want["input_ids"][0].tolist()
    image_token = hf.image_token_id
    # every image is tiled on its own ("anyres"), so its token count follows from its size alone
    embeds = [hf(text="<image>", images=[image])["input_ids"][0].count(image_token) for image in items]
    assert sum(embeds) == ids.count(image_token)
    check_placeholders(out, ids, image_token, embeds)
    for i in range(count):
        mine = tiles(item(out, i, "pixel_values"))
        padded = want["pixel_values"][i]
        assert torch.equal(mine, padded[:mine.shape[0]])
        assert not padded[mine.shape[0]:].any()  # the rest of HF's row is padding to the batch's most tiles
        assert torch.equal(item(out, i, "image_sizes").reshape(2), want["image_sizes"][i])


def test_an_image_processed_alone_equals_it_beside_others(processor: Any) -> None:
    together = processor.apply(prompt("<image>", 3), {"image": images(3)})
    alone = processor.apply(prompt("<image>", 1), {"image": images(3)[2:]})
    assert torch.equal(tiles(item(together, 2, "pixel_values")), tiles(item(alone, 0, "pixel_values")))


def test_chat_prompt_equals_hf_chat_template(folder: Path, hf: Any) -> None:
    from mmfront import InputPreprocessor, InputProcessor
    from mmfront.testing.media import image_data_url, make_image
    from mmfront.wire import SamplingParams

    image = make_image(64, 48, seed=0)
    question = {"type": "text", "text": "What is this?"}
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_data_url(image)}},
                                             question]}]
    request = InputProcessor(InputPreprocessor(folder, MultiModalConfig(model_impl="transformers"))).process_inputs("r", messages, SamplingParams(max_tokens=1))
    text = hf.apply_chat_template([{"role": "user", "content": [{"type": "image"}, question]}],
                                  add_generation_prompt=True, tokenize=False)
    assert text == "<|im_start|>user <image>\nWhat is this?<|im_end|><|im_start|>assistant\n"
    assert request.prompt_token_ids == hf(text=text, images=[image])["input_ids"][0]


def test_weights_config_is_the_real_architecture_at_tiny_sizes(hf: Any) -> None:
    from mmfront.fixtures.catalog import fixture_kinds

    kind = fixture_kinds()["llava_onevision"]
    assert kind.weights_config is not None
    config = kind.weights_config(hf)
    assert type(config).__name__ == "LlavaOnevisionConfig"
    assert config.image_token_id == hf.image_token_id
    vision = config.vision_config
    assert (vision.image_size // vision.patch_size) ** 2 == hf.num_image_tokens
    assert config.image_grid_pinpoints == hf.image_processor.image_grid_pinpoints
