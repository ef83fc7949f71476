"""Qwen2.5-VL through the transformers backend, on the offline ``qwen2_5_vl`` fixture: prompt ids,
placeholder ranges and each image's tensors equal what the HF processor produces; the fixture's
random-weight config is the real architecture's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from vision_cases import check_placeholders, hf_call, images, item, prompt

from markers import NEEDS_TORCHVISION
from mmfront import MultiModalConfig, create_processor
from mmfront.fixtures.models.qwen2_5_vl import QWEN2_VL_CHAT_TEMPLATE
from mmfront.testing.models import build_model_folder, load_processor

pytestmark = [pytest.mark.backend, NEEDS_TORCHVISION]

PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_folder("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl"))


@pytest.fixture(scope="module")
def hf(folder: Path) -> Any:
    return load_processor(folder)


@pytest.fixture(scope="module")
def processor(folder: Path) -> Any:
    return create_processor(folder, MultiModalConfig(dtype="float32", model_impl="transformers"))


def test_the_folder_loads_as_qwen2_5_vl_with_a_video_processor(folder: Path, hf: Any) -> None:
    assert type(hf).__name__ == "Qwen2_5_VLProcessor"
    assert type(hf.video_processor).__name__ == "Qwen2VLVideoProcessor"
    assert hf.chat_template == QWEN2_VL_CHAT_TEMPLATE
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2_5_vl"


@pytest.mark.parametrize("count", [1, 2, 3])
def test_ids_placeholders_and_tensors_equal_hf(processor: Any, hf: Any, count: int) -> None:
    text, items = prompt(PLACEHOLDER, count), images(count)
    out = processor.apply(text, {"image": items})
    want = hf_call(hf, text, items)
    grids = want["image_grid_thw"]
    merge = hf.image_processor.merge_size
    patches = [int(n) for n in grids.prod(-1)]
    assert grids[0].tolist() == [1, 6, 8]  # 64x48 px in 8 px patches: 12 tokens of 2x2 patches (docs/testing.md)
    check_placeholders(out, want["input_ids"][0].tolist(), hf.image_token_id, [n // merge**2 for n in patches])
    rows = want["pixel_values"].split(patches)
    for i in range(count):
        assert torch.equal(item(out, i, "image_grid_thw").reshape(3), grids[i])
        assert torch.equal(item(out, i, "pixel_values"), rows[i])


def test_an_image_processed_alone_equals_it_beside_others(processor: Any) -> None:
    together = processor.apply(prompt(PLACEHOLDER, 3), {"image": images(3)})
    alone = processor.apply(prompt(PLACEHOLDER, 1), {"image": images(3)[2:]})
    assert torch.equal(item(together, 2, "pixel_values"), item(alone, 0, "pixel_values"))


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
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
    assert request.prompt_token_ids == hf(text=text, images=[image])["input_ids"][0]


def test_weights_config_is_the_real_architecture_at_tiny_sizes(hf: Any) -> None:
    from mmfront.fixtures.catalog import fixture_kinds

    kind = fixture_kinds()["qwen2_5_vl"]
    assert kind.weights_config is not None
    config = kind.weights_config(hf)
    assert type(config).__name__ == "Qwen2_5_VLConfig"
    assert config.image_token_id == hf.image_token_id
    assert config.vision_config.patch_size == hf.image_processor.patch_size
    assert config.vision_config.out_hidden_size == config.text_config.hidden_size
    section = config.text_config.rope_parameters["mrope_section"]
    assert sum(section) * 2 == config.text_config.hidden_size // config.text_config.num_attention_heads


@pytest.mark.parametrize("size", [(1000, 750), (1024, 768)], ids=["resized", "as-is"])
def test_mmfronts_steps_give_hfs_bytes(processor: Any, hf: Any, size: tuple[int, int]) -> None:
    """The processor's image processor runs mmfront's steps (``ModelSpec.hf_speedups``: the RGB
    view, and :func:`mmfront.bicubic.resize_planes` and :func:`mmfront.pixels.patch_rows` where
    the extension is built), and a real-size
    image's rows are HF's own processor's, byte for byte, resized or not (the parity suite
    proves the same against vLLM)."""
    from mmfront import pixels

    image_processor = processor.info.hf_processor.image_processor
    assert "process_image" in vars(image_processor) and "process_image" not in vars(hf.image_processor)
    assert "resize" in vars(image_processor) and "resize" not in vars(hf.image_processor)
    hf_patchify = hasattr(type(image_processor), "patchify")  # transformers < 5.15 inlines it
    if hf_patchify and pixels.patch_rows(torch.zeros((1, 3, 28, 28), dtype=torch.uint8), 14, 2, 1) is not None:
        assert "patchify" in vars(image_processor)
    image = images(1)[0].resize(size)
    kwargs = {"do_normalize": False, "do_rescale": False, "size": {"shortest_edge": 3136, "longest_edge": 12845056},
              "return_tensors": "pt"}
    ours = image_processor(images=[image], **kwargs)
    want = hf.image_processor(images=[image], **kwargs)
    assert ours["image_grid_thw"].tolist() == want["image_grid_thw"].tolist()
    assert ours["pixel_values"].dtype == torch.uint8 and torch.equal(ours["pixel_values"], want["pixel_values"])


def test_the_resize_takes_both_of_hfs_call_forms_and_leaves_the_rest_to_hf(
        processor: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The image processor's own ``resize(images=, size=<pixel limits>, resample=, factor=)``
    (transformers >= 5.15) and the base ``resize(image=, size=SizeDict(height=, width=),
    resample=)`` that earlier releases call with the size they computed: both give torch's bytes
    as planes where :func:`mmfront.bicubic.resize_planes` takes the image; another resample, or a
    call it does not know, goes to HF's own resize."""
    import inspect

    from torchvision.transforms import InterpolationMode
    from torchvision.transforms.v2 import functional as tvF
    from transformers.image_utils import SizeDict

    from mmfront import bicubic
    from mmfront.models import qwen2_vl

    if bicubic.resize_planes(torch.zeros((1, 28, 28, 3), dtype=torch.uint8).permute(0, 3, 1, 2), 28, 56) is None:
        pytest.skip("the resize's C loop is not built or this CPU has no AVX2: HF's resize runs")
    calls: list[bool] = []

    def spy(*args: Any) -> Any:
        planes = bicubic.resize_planes(*args)
        calls.append(planes is not None)
        return planes

    monkeypatch.setattr(qwen2_vl, "resize_planes", spy)
    image_processor = processor.info.hf_processor.image_processor
    generator = torch.Generator().manual_seed(5)
    pixels = torch.randint(0, 256, (1, 75, 100, 3), generator=generator, dtype=torch.uint8).permute(0, 3, 1, 2)

    def torch_resize(height: int, width: int, mode: InterpolationMode = InterpolationMode.BICUBIC) -> torch.Tensor:
        return tvF.resize(pixels, [height, width], interpolation=mode, antialias=True)

    limits = SizeDict(shortest_edge=3136, longest_edge=12845056)
    by_limits = image_processor.resize(images=pixels, size=limits, resample=3, factor=56)
    assert by_limits.shape == (1, 3, 56, 112) and torch.equal(by_limits, torch_resize(56, 112))
    by_size = image_processor.resize(image=pixels, size=SizeDict(height=84, width=140), resample=InterpolationMode.BICUBIC)
    assert torch.equal(by_size, torch_resize(84, 140)) and calls == [True, True]
    hf_form = {"images": pixels, "size": limits, "factor": 56} if "factor" in inspect.signature(
        type(image_processor).resize).parameters else {"image": pixels, "size": SizeDict(height=56, width=112)}
    bilinear = image_processor.resize(**hf_form, resample=2)  # PIL's BILINEAR: HF's resize
    assert calls == [True, True] and torch.equal(bilinear, torch_resize(56, 112, InterpolationMode.BILINEAR))
    image_processor.resize(**hf_form, resample=3, antialias=True)  # a kwarg the swap does not know: HF's
    assert calls == [True, True]
