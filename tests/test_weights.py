"""mmfront.testing.weights: random-weight models of the real architectures, offline and seeded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from safetensors.torch import load_file

from mmfront.errors import ConfigError
from mmfront.fixtures.catalog import fixture_kinds
from mmfront.testing import models
from mmfront.testing.media import make_audio, make_image
from mmfront.testing.models import build_model_folder, cached_model_dir, load_processor

KINDS = ("gemma3", "idefics3", "qwen2_audio")


@pytest.fixture(params=KINDS)
def case(request: pytest.FixtureRequest) -> tuple[str, Path]:
    return request.param, request.getfixturevalue(f"{request.param}_weights_dir")


def _model(kind: str, folder: Path) -> Any:
    return getattr(transformers, fixture_kinds()[kind].architecture).from_pretrained(folder, local_files_only=True)


def _greedy(kind: str, folder: Path, model: Any, seed: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens and first-step logits for one item of seed ``seed`` and a question."""
    proc = load_processor(folder)
    audio = kind == "qwen2_audio"
    part = {"type": "audio", "audio_url": "clip.wav"} if audio else {"type": "image"}
    messages = [{"role": "user", "content": [part, {"type": "text", "text": "What is in this picture?"}]}]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    media = {"audio": [make_audio(1.0, seed=seed)]} if audio else {"images": [make_image(64, 48, seed=seed)]}
    inputs = proc(text=text, **media, add_special_tokens=False, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=8, output_logits=True,
                             return_dict_in_generate=True)
    return out.sequences[0, inputs["input_ids"].shape[1]:].tolist(), out.logits[0][0]


def _config(folder: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((folder / "config.json").read_text())
    return config


def test_the_config_agrees_with_the_folders_tokenizer(case: tuple[str, Path]) -> None:
    kind, folder = case
    tok = load_processor(folder).tokenizer
    config = _config(folder)
    text = config["text_config"]
    assert config["architectures"] == [fixture_kinds()[kind].architecture]
    assert (config["dtype"], text["vocab_size"], text["eos_token_id"]) == ("float32", len(tok), tok.eos_token_id)
    key, token = {"gemma3": ("image_token_index", "<image_soft_token>"), "idefics3": ("image_token_id", "<image>"),
                  "qwen2_audio": ("audio_token_index", "<|AUDIO|>")}[kind]
    assert config[key] == tok.convert_tokens_to_ids(token)
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"][0] == tok.eos_token_id


def test_gemma3_sizes_follow_the_processor(gemma3_weights_dir: Path) -> None:
    config = _config(gemma3_weights_dir)
    tok = load_processor(gemma3_weights_dir).tokenizer
    assert config["vision_config"]["image_size"] == 32 and config["vision_config"]["patch_size"] == 4
    assert (config["mm_tokens_per_image"], config["boi_token_index"], config["eoi_token_index"]) == (
        16, tok.boi_token_id, tok.eoi_token_id)
    assert config["text_config"]["layer_types"] == ["sliding_attention", "full_attention"]
    generation = json.loads((gemma3_weights_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [tok.eos_token_id, tok.convert_tokens_to_ids("<end_of_turn>")]


def test_the_folder_loads_offline_and_generates_from_its_items(case: tuple[str, Path]) -> None:
    """Each item steers the output and the tokens vary: a tower cut off by zero weights (HF
    initialises Gemma 3's projection to zero) or a model that repeats one token would make an
    equality test against it prove nothing."""
    kind, folder = case
    model = _model(kind, folder)
    assert model.dtype == torch.float32
    if kind != "qwen2_audio":  # Qwen2-Audio is not an image-text-to-text model
        auto = transformers.AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True)
        assert type(auto) is type(model)
    tokens, logits = _greedy(kind, folder, model, seed=0)
    other_tokens, other_logits = _greedy(kind, folder, model, seed=1)
    assert not torch.allclose(logits, other_logits, atol=1e-3)
    assert len(set(tokens)) > 2 and len(set(other_tokens)) > 2


def test_the_weights_are_the_same_for_the_same_seed(gemma3_weights_dir: Path, tmp_path: Path) -> None:
    again = build_model_folder("gemma3", tmp_path, with_weights=True)
    first, second = load_file(gemma3_weights_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_gemma3_896_has_the_real_sizes_and_tied_embeddings(tmp_path: Path) -> None:
    folder = build_model_folder("gemma3-896", tmp_path, with_weights=True)
    config = _config(folder)
    vision = config["vision_config"]
    assert (vision["image_size"], vision["patch_size"], config["mm_tokens_per_image"]) == (896, 28, 256)
    assert config["text_config"]["vocab_size"] == 262145
    model = transformers.Gemma3ForConditionalGeneration.from_pretrained(folder, local_files_only=True)
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    pooled = model.get_image_features(pixel_values=torch.zeros(1, 3, 896, 896), return_dict=True).pooler_output
    assert pooled.shape == (1, 256, 32)


@pytest.mark.parametrize("kind", ["emu3", "glmasr"])
def test_kinds_without_weights_are_refused_before_anything_is_written(kind: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"no weights for model kind '{kind}'"):
        build_model_folder(kind, tmp_path / "model", with_weights=True)
    assert not (tmp_path / "model").exists()


def test_gemma3_weights_need_a_poolable_token_count(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="image_seq_length a square number"):
        build_model_folder("gemma3", tmp_path, with_weights=True, image_seq_length=12)


def test_cached_folders_with_weights_are_built_once_apart_from_the_processor_only_ones(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.setenv("MMFRONT_HOME", str(tmp_path))
    folder = cached_model_dir("qwen2_audio", with_weights=True)
    assert folder.name.startswith(f"qwen2_audio-weights{models.WEIGHTS_VERSION}-v{models.FIXTURE_VERSION}-")
    assert (folder / "model.safetensors").is_file()

    def no_rebuild(*args: object, **kwargs: object) -> Path:
        raise AssertionError("cached_model_dir rebuilt a ready folder")

    monkeypatch.setattr(models, "build_model_folder", no_rebuild)
    assert cached_model_dir("qwen2_audio", with_weights=True) == folder
    assert not (tmp_path / "models" / folder.name.replace(f"-weights{models.WEIGHTS_VERSION}", "")).exists()


def test_write_weights_takes_a_dtype_and_a_seed(gemma3_weights_dir: Path, tmp_path: Path) -> None:
    from mmfront.engine.runner import ModelRunner
    from mmfront.fixtures.models.gemma3 import make_gemma3_processor
    from mmfront.testing.weights import write_weights

    processor = make_gemma3_processor()
    processor.save_pretrained(str(tmp_path))
    write_weights("gemma3", processor, tmp_path, dtype="bfloat16", seed=1)
    assert _config(tmp_path)["dtype"] == "bfloat16"
    weights = load_file(tmp_path / "model.safetensors")
    seed0 = load_file(gemma3_weights_dir / "model.safetensors")
    assert all(t.dtype == torch.bfloat16 for t in weights.values())
    key = "language_model.lm_head.weight"
    assert not torch.equal(weights[key].float(), seed0[key].bfloat16().float())
    assert ModelRunner(tmp_path).dtype == torch.bfloat16  # the runner takes the folder's dtype
    with pytest.raises(ConfigError, match="dtype 'int8' is not one of"):
        write_weights("gemma3", processor, tmp_path, dtype="int8")
