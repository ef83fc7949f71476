"""Issue 9.6: mistakes are refused with a typed error naming the field, not absorbed.

(The stray-placeholder cases live in tests/hardening/test_placeholder_injection.py.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mmfront import MultiModalConfig
from mmfront.errors import ConfigError, ValidationError
from mmfront.preprocess import InputPreprocessor
from mmfront.testing.media import make_image

PROMPT = "<start_of_image>"


@pytest.mark.parametrize("key", ["images", "Image", "vision_chunk"])
def test_unknown_modality_in_limit_mm_per_prompt(key: str) -> None:
    with pytest.raises(ConfigError, match=f"limit_mm_per_prompt has unknown modalities '{key}'; use image, audio, "
                                          "video"):
        MultiModalConfig(limit_mm_per_prompt={key: 2})
    assert MultiModalConfig(limit_mm_per_prompt={"image": 2, "audio": 0}).get_limit_per_prompt("audio") == 0


def test_empty_prompt_list(gemma3_dir: Path) -> None:
    pre = InputPreprocessor(gemma3_dir)
    with pytest.raises(ValidationError, match="The decoder prompt cannot be empty: send a non-empty list of chat "
                                              "messages") as e:
        pre.preprocess([])
    assert e.value.parameter == "prompt"
    with pytest.raises(ValidationError, match="The decoder prompt cannot be empty"):
        pre.preprocess({"prompt_token_ids": []})


@pytest.mark.parametrize(("kwargs", "unknown"), [
    ({"do_pan_and_scn": True}, "['do_pan_and_scn']"),
    ({"images_kwargs": {"do_pan_and_scan": True, "bogus": 1}}, "['images_kwargs.bogus']"),
    ({"images_kwargs": 3}, "['images_kwargs']"),
])
def test_unknown_processor_kwargs_are_refused(gemma3_dir: Path, kwargs: dict[str, object], unknown: str) -> None:
    pre = InputPreprocessor(gemma3_dir)
    with pytest.raises(ValidationError, match=r"mm_processor_kwargs has key\(s\) " + unknown.replace("[", r"\[")
                       .replace("]", r"\]") + " that Gemma3Processor does not accept") as e:
        pre.preprocess(PROMPT, {"image": [make_image(40, 30)]}, hf_processor_mm_kwargs=kwargs)
    assert e.value.parameter == "mm_processor_kwargs"
    assert "do_pan_and_scan" in str(e.value).split("Accepted: ")[1].split(", ")


def test_known_processor_kwargs_still_work(gemma3_dir: Path) -> None:
    pre = InputPreprocessor(gemma3_dir)
    wide = make_image(128, 32, seed=2)
    out = pre.preprocess(PROMPT, {"image": [wide]}, hf_processor_mm_kwargs={
        "do_pan_and_scan": True, "images_kwargs": {"pan_and_scan_min_crop_size": 16}})
    assert out["mm_placeholders"]["image"][0].get_num_embeds() == 80


def test_unknown_deployment_processor_kwargs_fail_at_start_up(gemma3_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"mm_processor_kwargs has key\(s\) \['pan_and_scan'\]"):
        InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processor_kwargs={"pan_and_scan": True}))
