"""The reference engine on videos: for random-weight Qwen2.5-VL and LLaVA-OneVision folders, a
chat with a video and an image gives the prompt ids and greedy tokens of transformers' own
``generate`` on the HF processor's outputs for the same conversation (the frames vLLM's sampler
keeps, with their metadata)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from runner_cases import DEVICE, run, wire_round_trip

from markers import NEEDS_TORCHVISION, VIDEO_SERVED
from mmfront import InputPreprocessor, InputProcessor, MultiModalConfig
from mmfront.engine.runner import ModelRunner
from mmfront.fixtures.catalog import fixture_kinds
from mmfront.media import DecodeBudget, load_video_bytes
from mmfront.testing.media import image_data_url, make_image, make_video
from mmfront.testing.models import build_model_folder, load_processor
from mmfront.wire import SamplingParams

pytestmark = [pytest.mark.slow, VIDEO_SERVED, NEEDS_TORCHVISION]

MAX_TOKENS = 6
CLIP = make_video(seconds=1.5, fps=8, seed=6)
IMAGE = make_image(48, 40, seed=7)
QUESTION = {"type": "text", "text": "What happens?"}


def messages(hf: bool) -> list[dict[str, Any]]:
    if hf:
        return [{"role": "user", "content": [{"type": "image"}, {"type": "video"}, QUESTION]}]
    url = "data:video/mp4;base64," + base64.b64encode(CLIP).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_data_url(IMAGE)}},
                                         {"type": "video_url", "video_url": {"url": url}}, QUESTION]}]


@pytest.mark.parametrize("kind", ["qwen2_5_vl", "llava_onevision"])
def test_video_chat_tokens_equal_transformers_generate(kind: str, tmp_path: Path) -> None:
    folder = build_model_folder(kind, tmp_path / kind, with_weights=True)
    processor = InputProcessor(InputPreprocessor(folder, MultiModalConfig(mm_processor_cache_gb=0)))
    request = wire_round_trip(processor.process_inputs("r", messages(hf=False),
                                                       SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)))
    [(tokens, _)] = run(ModelRunner(folder), [request]).values()

    hf = load_processor(folder)
    config = MultiModalConfig()
    video = load_video_bytes(CLIP, config=config, budget=DecodeBudget.from_config(config),
                             video_processor=type(hf.video_processor).__name__)
    kwargs: dict[str, Any] = {"videos": [video.media], "do_sample_frames": False}
    if kind == "qwen2_5_vl":
        kwargs["video_metadata"] = [{k: v for k, v in video.info["metadata"].items() if k != "do_sample_frames"}]
    text = hf.apply_chat_template(messages(hf=True), add_generation_prompt=True, tokenize=False)
    inputs = hf(text=text, images=[IMAGE], add_special_tokens=False, return_tensors="pt", **kwargs).to(DEVICE)
    model = getattr(transformers, fixture_kinds()[kind].architecture).from_pretrained(folder).to(DEVICE)
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_TOKENS)
    prompt = inputs["input_ids"][0].tolist()
    assert request.prompt_token_ids == prompt
    assert tokens == out[0, len(prompt):].tolist()
