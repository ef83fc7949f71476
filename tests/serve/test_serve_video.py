"""A chat with a video through ``mmfront serve`` (tiny Qwen2.5-VL with random weights behind the
reference worker): a ``video_url`` data URL and an image through the openai client, the answer
equal to transformers' own ``generate`` on the HF processor's outputs for the same conversation;
the same chat again takes the video from the caches."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import torch
import transformers
from serve_harness import MODEL_NAME, Served, expected_text, serve

from markers import NEEDS_TORCHVISION, VIDEO_SERVED
from mmfront import MultiModalConfig
from mmfront.media import DecodeBudget, load_video_bytes
from mmfront.testing.media import image_data_url, make_image, make_video
from mmfront.testing.models import build_model_folder, load_processor

pytestmark = [pytest.mark.slow, VIDEO_SERVED, NEEDS_TORCHVISION]

MAX_TOKENS = 6
CLIP = make_video(seconds=2.0, fps=6, seed=4)
IMAGE = make_image(40, 32, seed=5)
QUESTION = {"type": "text", "text": "What happens?"}


def messages() -> list[dict[str, Any]]:
    url = "data:video/mp4;base64," + base64.b64encode(CLIP).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": image_data_url(IMAGE)}},
                                         {"type": "video_url", "video_url": {"url": url}}, QUESTION]}]


def generate(folder: Path) -> list[int]:
    """transformers' greedy tokens for the same chat: the frames vLLM's sampler keeps, with their
    metadata, HF sampling none."""
    hf = load_processor(folder)
    config = MultiModalConfig()
    video = load_video_bytes(CLIP, config=config, budget=DecodeBudget.from_config(config),
                             video_processor=type(hf.video_processor).__name__)
    metadata = {k: v for k, v in video.info["metadata"].items() if k != "do_sample_frames"}
    text = hf.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {"type": "video"}, QUESTION]}],
                                  add_generation_prompt=True, tokenize=False)
    inputs = hf(text=text, images=[IMAGE], videos=[video.media], video_metadata=[metadata], do_sample_frames=False,
                add_special_tokens=False, return_tensors="pt")
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(folder)
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=MAX_TOKENS)
    return [int(t) for t in out[0, inputs["input_ids"].shape[1]:]]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, str]]:
    folder = build_model_folder("qwen2_5_vl", tmp_path_factory.mktemp("qwen2_5_vl-weights"), with_weights=True)
    tokens = generate(folder)
    with serve(folder) as s:
        yield s, expected_text(s.preprocessor.tokenizer, tokens)


def test_chat_with_a_video_equals_transformers_generate(served: tuple[Served, str]) -> None:
    s, want = served
    client = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0, timeout=120)
    first = client.chat.completions.create(model=MODEL_NAME, messages=messages(), max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
                                           temperature=0.0)
    assert first.choices[0].message.content == want
    hits = s.preprocessor.stats.hits
    again = client.chat.completions.create(model=MODEL_NAME, messages=messages(), max_tokens=MAX_TOKENS,  # type: ignore[arg-type]
                                           temperature=0.0)
    assert again.choices[0].message.content == want
    assert s.preprocessor.stats.hits >= hits + 2  # the image and the video came from the P0 cache
