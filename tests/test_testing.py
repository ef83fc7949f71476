"""mmfront.testing and mmfront.fixtures: the fixture catalog finds every kind, offline model folders
round-trip through AutoProcessor, and the exact tokenization and expansion facts other tests build
on. Runs under transformers 5.24 and 5.14.1."""

from __future__ import annotations

import base64
import importlib
import importlib.metadata
import io
import json
import threading
import wave
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from packaging.version import Version
from PIL import Image
from transformers import AutoProcessor, ProcessorMixin

from mmfront.errors import ConfigError, InputTypeError, ValidationError
from mmfront.fixtures import catalog as fixture_catalog
from mmfront.fixtures.catalog import fixture_kinds, register_fixtures
from mmfront.fixtures.models.emu3 import make_emu3_processor, make_emu3_tokenizer
from mmfront.fixtures.models.gemma3 import (
    GEMMA3_FIXTURES,
    GEMMA3_PREPROCESSOR,
    GEMMA3_REAL_IDS,
    GEMMA3_VOCAB_SIZE,
    gemma3_real_bpe,
    make_gemma3_896_processor,
    make_gemma3_processor,
    make_gemma3_tokenizer,
)
from mmfront.fixtures.models.glmasr import make_glmasr_processor, make_glmasr_tokenizer
from mmfront.fixtures.models.idefics3 import make_idefics3_processor, make_idefics3_tokenizer
from mmfront.fixtures.models.qwen2_audio import make_qwen2_audio_processor, make_qwen2_audio_tokenizer
from mmfront.testing import models, peer
from mmfront.testing.media import image_data_url, make_audio, make_image, make_raw_image, wav_bytes
from mmfront.testing.models import (
    FIXTURE_VERSION,
    build_model_folder,
    cached_model_dir,
    default_model_dir,
    load_processor,
    mmfront_home,
)
from mmfront.testing.processors import (
    offsets_kwargs,
)

GEMMA3_PROMPT = "<start_of_turn>user\n<start_of_image>Describe this image.<end_of_turn>\n<start_of_turn>model\n"
IDEFICS3_PROMPT = "<|im_start|>User:<image>Describe this image.<end_of_utterance>\nAssistant:"
EMU3_PROMPT = "USER: <image>Describe this image. ASSISTANT:"
QWEN2_AUDIO_PROMPT = (
    "<|im_start|>user\nAudio 1: <|audio_bos|><|AUDIO|><|audio_eos|>\nWhat is this?<|im_end|>\n<|im_start|>assistant\n"
)
GLMASR_PROMPT = "<|user|>\n<|begin_of_audio|><|pad|><|end_of_audio|>Transcribe"

# tiny Gemma3 ids: 256 bytes, "\n\n"=256, "\n\n\n"=257, "\n\n\n\n"=258, then word merges, then specials
NL, NL2, NL3, NL4 = 10, 256, 257, 258
G_BOS, G_SOT, G_EOT, G_BOI, G_EOI, G_SOFT = 527, 529, 530, 531, 532, 533


def _image_call(prompt: str, image: Image.Image) -> dict[str, Any]:
    return {"text": prompt, "images": [image], "return_tensors": "pt", **offsets_kwargs()}


def _audio_call(prompt: str, seconds: float) -> dict[str, Any]:
    return {"text": prompt, "audio": [make_audio(seconds)], "sampling_rate": 16000, "return_tensors": "pt", **offsets_kwargs()}


# kind -> (in-memory builder, call kwargs)
CASES: dict[str, tuple[Callable[[], ProcessorMixin], Callable[[], dict[str, Any]]]] = {
    "gemma3": (make_gemma3_processor, lambda: _image_call(GEMMA3_PROMPT, make_image(40, 30))),
    "gemma3-896": (make_gemma3_896_processor, lambda: _image_call(GEMMA3_PROMPT, make_image(300, 200))),
    "idefics3": (make_idefics3_processor, lambda: _image_call(IDEFICS3_PROMPT, make_image(64, 32))),
    "emu3": (make_emu3_processor, lambda: _image_call(EMU3_PROMPT, make_image(32, 32))),
    "qwen2_audio": (make_qwen2_audio_processor, lambda: _audio_call(QWEN2_AUDIO_PROMPT, 1.0)),
    "glmasr": (make_glmasr_processor, lambda: _audio_call(GLMASR_PROMPT, 1.0)),
}
# kind -> (processor class, config.json model_type, architecture, torch_dtype)
EXPECTED = {
    "gemma3": ("Gemma3Processor", "gemma3", "Gemma3ForConditionalGeneration", "bfloat16"),
    "gemma3-896": ("Gemma3Processor", "gemma3", "Gemma3ForConditionalGeneration", "bfloat16"),
    "idefics3": ("Idefics3Processor", "idefics3", "Idefics3ForConditionalGeneration", "float32"),
    "emu3": ("Emu3Processor", "emu3", "Emu3ForConditionalGeneration", "float32"),
    "qwen2_audio": ("Qwen2AudioProcessor", "qwen2_audio", "Qwen2AudioForConditionalGeneration", "float32"),
    "glmasr": ("GlmAsrProcessor", "glmasr", "GlmAsrForConditionalGeneration", "float32"),
}


# kind -> first transformers version whose processor reports text_replacement_offsets
OFFSETS_SINCE = {
    "gemma3": "5.15",
    "gemma3-896": "5.15",
    "idefics3": "5.14",
    "emu3": "5.15",
    "qwen2_audio": "5.16",
    "glmasr": "5.14",
}


def _fixture(request: pytest.FixtureRequest, kind: str, what: str) -> Any:
    return request.getfixturevalue(f"{kind.replace('-', '_')}_{what}")


def _sub_processor(processor: ProcessorMixin) -> Any:
    return getattr(processor, "image_processor", None) or processor.feature_extractor


def _assert_same_outputs(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert sorted(a) == sorted(b)
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), key
        else:
            assert value == b[key], key


def _idefics3_pil_marked_torchvision() -> bool:
    """transformers' lazy-import scanner marks ``image_processing_pil_idefics3`` as needing torchvision
    (5.14.1 and 5.15.0: the file's docstrings mention ``TorchvisionBackend``)."""
    import_utils = importlib.import_module("transformers.utils.import_utils")
    package = Path(importlib.import_module("transformers").__file__).parent / "models" / "idefics3" / "__init__.py"  # type: ignore[arg-type]
    structure = import_utils.define_import_structure(str(package))
    return any("torchvision" in backends and "image_processing_pil_idefics3" in mods for backends, mods in structure.items())


# --------------------------------------------------------------------------------------------------
# Folders round-trip through AutoProcessor
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(CASES))
def test_folder_holds_processor_tokenizer_and_config(request: pytest.FixtureRequest, kind: str) -> None:
    folder: Path = _fixture(request, kind, "dir")
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "processor_config.json", "tokenizer.json", "tokenizer_config.json"} <= names
    config = json.loads((folder / "config.json").read_text())
    _, model_type, architecture, dtype = EXPECTED[kind]
    assert (config["model_type"], config["architectures"], config["torch_dtype"]) == (model_type, [architecture], dtype)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_loaded_processor_equals_in_memory_one(request: pytest.FixtureRequest, kind: str, hf_version: Version) -> None:
    build, call = CASES[kind]
    loaded: ProcessorMixin = _fixture(request, kind, "processor")
    fresh = build()
    assert type(loaded) is type(fresh)
    assert type(_sub_processor(loaded)) is type(_sub_processor(fresh))
    assert loaded.tokenizer.get_vocab() == fresh.tokenizer.get_vocab()
    assert sorted(loaded.tokenizer.all_special_tokens) == sorted(fresh.tokenizer.all_special_tokens)
    out = dict(loaded(**call()))
    _assert_same_outputs(out, dict(fresh(**call())))
    assert ("text_replacement_offsets" in out) == (hf_version >= Version(OFFSETS_SINCE[kind]))


@pytest.mark.parametrize("kind", sorted(CASES))
def test_plain_auto_processor_loads_folder(request: pytest.FixtureRequest, kind: str) -> None:
    if kind == "idefics3" and _idefics3_pil_marked_torchvision():
        pytest.skip(
            f"transformers {importlib.metadata.version('transformers')} marks image_processing_pil_idefics3 as "
            "torchvision-only (its docstrings mention TorchvisionBackend), so plain AutoProcessor cannot load "
            "Idefics3 without torchvision; load_processor() sets the real class on transformers.models.idefics3 "
            "first (see docs/testing.md)"
        )
    folder: Path = _fixture(request, kind, "dir")
    assert type(AutoProcessor.from_pretrained(str(folder))).__name__ == EXPECTED[kind][0]


def test_sizes_reach_the_saved_processor(tmp_path: Path) -> None:
    folder = build_model_folder("gemma3", tmp_path, image_size=48, image_seq_length=4)
    processor = load_processor(folder)
    assert processor.image_seq_length == 4  # type: ignore[attr-defined]
    assert processor.image_processor.size["height"] == 48
    config = json.loads((folder / "config.json").read_text())
    assert (config["mm_tokens_per_image"], config["vision_config"]) == (4, {"image_size": 48})


def test_unknown_kind_and_size_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown model kind 'llava'.*'emu3', 'gemma3', 'gemma3-896'"):
        build_model_folder("llava", tmp_path)
    with pytest.raises(ConfigError, match=r"'emu3' takes no size \['image_size'\]"):
        build_model_folder("emu3", tmp_path, image_size=32)
    assert list(tmp_path.iterdir()) == []


def test_the_fixture_catalog_finds_every_fixture_module_by_scanning_the_package() -> None:
    kinds = fixture_kinds()
    assert sorted(kinds) == ["emu3", "gemma3", "gemma3-896", "glmasr", "idefics3", "llava_onevision", "qwen2_5_vl",
                             "qwen2_audio"]
    assert kinds["gemma3-896"] is GEMMA3_FIXTURES["gemma3-896"]
    assert kinds["gemma3-896"].build is make_gemma3_896_processor


def test_register_fixtures_refuses_a_kind_declared_twice_or_not_a_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    fixture_kinds()
    monkeypatch.setattr(fixture_catalog, "_KINDS", dict(fixture_kinds()))
    new = replace(GEMMA3_FIXTURES["gemma3"], sizes=())
    with pytest.raises(ConfigError, match=r"fixture kind 'gemma3' already declared by another module \(declared "
                                          r"kinds: \['emu3', 'gemma3', "):
        register_fixtures({"new": new, "gemma3": new})
    with pytest.raises(InputTypeError, match=r"register_fixtures takes a ModelKind for each kind name, got "
                                             r"'gemma3' for 'new'"):
        register_fixtures({"new": "gemma3"})  # type: ignore[dict-item]
    assert "new" not in fixture_kinds()
    assert register_fixtures({"new": new}) == {"new": new}
    assert fixture_kinds()["new"] is new


# --------------------------------------------------------------------------------------------------
# Tokenizers
# --------------------------------------------------------------------------------------------------


def test_gemma3_newline_runs_are_single_tokens() -> None:
    tok = make_gemma3_tokenizer()
    assert [tok.encode("\n" * n, add_special_tokens=False) for n in (1, 2, 3, 4)] == [[NL], [NL2], [NL3], [NL4]]
    assert tok.encode("\n\n" + "\n", add_special_tokens=False) == [NL3]
    assert tok.encode("\n" * 5, add_special_tokens=False) == [NL2, NL3]
    assert tok.convert_ids_to_tokens([NL, NL2, NL3, NL4]) == ["Ċ", "ĊĊ", "ĊĊĊ", "ĊĊĊĊ"]


def test_gemma3_keeps_newlines_whole_before_text() -> None:
    """No GPT-2 regex split: "\\n\\nDescribe" is "\\n\\n" + "Describe", as in Gemma's tokenizer."""
    tok = make_gemma3_tokenizer()
    assert tok.encode("\n\nDescribe", add_special_tokens=False) == [NL2, 333]
    assert tok.encode("user\n\n\n", add_special_tokens=False) == [261, NL3]
    assert tok.encode("Describe this image.", add_special_tokens=False) == [333, 32, 359, 32, 367, 46]
    assert tok.decode(tok.encode("a\n\n\nb  c\td", add_special_tokens=False)) == "a\n\n\nb  c\td"


@pytest.mark.parametrize(
    ("make", "image_or_audio_token", "token_id"),
    [
        (make_idefics3_tokenizer, "<image>", 528),
        (make_emu3_tokenizer, "<image>", 526),
        (make_qwen2_audio_tokenizer, "<|AUDIO|>", 526),
        (make_glmasr_tokenizer, "<|pad|>", 528),
    ],
)
def test_other_tokenizers_keep_their_ids_and_newlines(make: Callable[[], Any], image_or_audio_token: str, token_id: int) -> None:
    tok = make()
    assert tok.convert_tokens_to_ids(image_or_audio_token) == token_id
    assert tok.encode("\n\n\n", add_special_tokens=False) == [NL2, NL]
    assert tok.encode("\n\n\n\n", add_special_tokens=False) == [NL2, NL2]
    assert tok.encode("\n\nDescribe", add_special_tokens=False) == [NL, NL, 331]


def _merge_newlines(ids: list[int]) -> list[int]:
    """vLLM's Gemma3 passes: [\\n, \\n\\n] -> \\n\\n\\n, [\\n\\n, \\n] -> \\n\\n\\n, [\\n\\n, \\n\\n] -> \\n\\n\\n\\n."""
    for pair, merged in (((NL, NL2), NL3), ((NL2, NL), NL3), ((NL2, NL2), NL4)):
        out: list[int] = []
        i = 0
        while i < len(ids):
            if tuple(ids[i : i + 2]) == pair:
                out.append(merged)
                i += 2
            else:
                out.append(ids[i])
                i += 1
        ids = out
    return ids


@pytest.mark.parametrize("prompt", [GEMMA3_PROMPT, GEMMA3_PROMPT.replace("<start_of_image>", "<start_of_image>" * 2)])
def test_gemma3_spliced_and_merged_ids_equal_hf_ids(gemma3_processor: Any, prompt: str) -> None:
    tok = gemma3_processor.tokenizer
    replacement = tok.encode(gemma3_processor.full_image_sequence, add_special_tokens=False)
    spliced: list[int] = []
    for token_id in tok.encode(prompt):
        spliced += replacement if token_id == G_BOI else [token_id]
    n = prompt.count("<start_of_image>")
    hf = gemma3_processor(text=prompt, images=[make_image(40, 30, seed=i) for i in range(n)], return_tensors="np")
    assert _merge_newlines(spliced) == hf["input_ids"][0].tolist()


# --------------------------------------------------------------------------------------------------
# Expansion facts
# --------------------------------------------------------------------------------------------------


def test_gemma3_one_image_expansion(gemma3_processor: Any) -> None:
    assert gemma3_processor.full_image_sequence == "\n\n<start_of_image>" + "<image_soft_token>" * 16 + "<end_of_image>\n\n"
    replacement = gemma3_processor.tokenizer.encode(gemma3_processor.full_image_sequence, add_special_tokens=False)
    assert replacement == [NL2, G_BOI, *[G_SOFT] * 16, G_EOI, NL2]
    out = gemma3_processor(text=GEMMA3_PROMPT, images=[make_image(40, 30)], return_tensors="pt")
    assert out["input_ids"][0].tolist() == [
        G_BOS, G_SOT, 261, NL3, G_BOI, *[G_SOFT] * 16, G_EOI, NL2, 333, 32, 359, 32, 367, 46, G_EOT, NL, G_SOT, 269, NL
    ]
    assert tuple(out["pixel_values"].shape) == (1, 3, 32, 32)
    assert out["token_type_ids"][0].tolist() == [0] * 5 + [1] * 16 + [0] * 13


@pytest.mark.hf_version(">=5.15", reason="Gemma3Processor.image_token became the boi placeholder in 5.15.0")
def test_gemma3_image_token_is_boi(gemma3_processor: Any) -> None:
    assert (gemma3_processor.image_token, gemma3_processor.image_token_id) == ("<start_of_image>", G_BOI)


@pytest.mark.hf_version("<5.15", reason="before 5.15.0 Gemma3Processor.image_token is the soft token")
def test_gemma3_image_token_is_soft_token_before_5_15(gemma3_processor: Any) -> None:
    assert (gemma3_processor.image_token, gemma3_processor.image_token_id) == ("<image_soft_token>", G_SOFT)


def test_idefics3_64x32_image_is_3_tiles_and_20_tokens(idefics3_processor: Any) -> None:
    out = idefics3_processor(**_image_call(IDEFICS3_PROMPT, make_image(64, 32)))
    assert tuple(out["pixel_values"].shape) == (1, 3, 3, 32, 32)
    (entry,) = out["text_replacement_offsets"][0]
    assert (entry["span"], entry["new_span"]) == ((17, 24), (17, 241))
    ids = idefics3_processor.tokenizer.encode(entry["replacement"], add_special_tokens=False)
    fake, image, global_img, r1c1, r1c2 = 527, 528, 529, 530, 531
    assert ids == [fake, r1c1, *[image] * 4, fake, r1c2, *[image] * 4, NL2, fake, global_img, *[image] * 4, fake]
    assert out["input_ids"][0].tolist()[3:23] == ids


def test_emu3_32x32_image_is_27_tokens(emu3_processor: Any) -> None:
    out = emu3_processor(**_image_call(EMU3_PROMPT, make_image(32, 32)))
    assert out["image_sizes"].tolist() == [[32, 32]]
    boi, image, eoi, wrapper, eof = 527, 526, 528, 529, 530
    expected = [boi, 52, 42, 52, wrapper, *[image] * 20, eof, eoi]  # "4*4" is bytes 52 42 52
    ids = out["input_ids"][0].tolist()
    assert ids[:36] == [525, 85, 83, 69, 82, 58, 32, *expected, 331, 32]
    assert ids.index(eoi) - ids.index(boi) + 1 == 27


@pytest.mark.hf_version(">=5.15", reason="Emu3 reports text_replacement_offsets from 5.15.0 (replace_image_token hook)")
def test_emu3_offsets_are_relative_to_bos_plus_text(emu3_processor: Any) -> None:
    (entry,) = emu3_processor(**_image_call(EMU3_PROMPT, make_image(32, 32)))["text_replacement_offsets"][0]
    assert entry["span"] == (len("<|extra_203|>") + 6, len("<|extra_203|>") + 13)


def test_qwen2_audio_1s_is_25_tokens(qwen2_audio_processor: Any) -> None:
    out = qwen2_audio_processor(**_audio_call(QWEN2_AUDIO_PROMPT, 1.0))
    assert int((out["input_ids"] == 526).sum()) == 25
    assert tuple(out["input_features"].shape) == (1, 16, 200)
    assert int(out["feature_attention_mask"].sum()) == 100


@pytest.mark.hf_version(">=5.16", reason="Qwen2AudioProcessor gained the replace_audio_token hook in 5.16.0")
def test_qwen2_audio_reports_offsets(qwen2_audio_processor: Any) -> None:
    (entry,) = qwen2_audio_processor(**_audio_call(QWEN2_AUDIO_PROMPT, 1.0))["text_replacement_offsets"][0]
    assert (entry["span"], entry["replacement"]) == ((39, 48), "<|AUDIO|>" * 25)


@pytest.mark.hf_version("<5.16", reason="before 5.16.0 Qwen2AudioProcessor has its own __call__ without offsets")
def test_qwen2_audio_reports_no_offsets_before_5_16(qwen2_audio_processor: Any) -> None:
    assert "text_replacement_offsets" not in qwen2_audio_processor(**_audio_call(QWEN2_AUDIO_PROMPT, 1.0))


@pytest.mark.parametrize(("seconds", "tokens", "windows"), [(1.0, 12, 1), (3.0, 37, 2)])
def test_glmasr_token_counts(glmasr_processor: Any, seconds: float, tokens: int, windows: int) -> None:
    """GLM-ASR pools 4 frames per token (25 tokens would be Qwen2-Audio's count for 1.0 s)."""
    out = glmasr_processor(**_audio_call(GLMASR_PROMPT, seconds))
    (entry,) = out["text_replacement_offsets"][0]
    assert entry["replacement"] == "<|pad|>" * tokens
    assert int((out["input_ids"] == 528).sum()) == tokens
    assert tuple(out["input_features"].shape) == (windows, 16, 200)


# --------------------------------------------------------------------------------------------------
# gemma3-896: real sizes and ids
# --------------------------------------------------------------------------------------------------


def test_gemma3_896_special_ids_and_vocab(gemma3_896_processor: Any) -> None:
    tok = gemma3_896_processor.tokenizer
    assert len(tok) == GEMMA3_VOCAB_SIZE == 262145
    assert len(tok.get_vocab()) == 262145
    for text, token_id in GEMMA3_REAL_IDS.items():
        if text.startswith("\n"):
            assert tok.encode(text, add_special_tokens=False) == [token_id], repr(text)
        else:
            assert tok.convert_tokens_to_ids(text) == token_id, text
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    assert (tok.boi_token_id, tok.eoi_token_id, tok.image_token_id) == (255999, 256000, 262144)
    assert tok.convert_ids_to_tokens([5, 255998, 256001, 262143]) == ["Ā", "<unused255466>", "<unused255467>", "<unused261609>"]


def test_gemma3_896_preprocessor_and_config(gemma3_896_processor: Any, gemma3_896_dir: Path) -> None:
    assert gemma3_896_processor.image_seq_length == 256
    image_processor = gemma3_896_processor.image_processor
    assert dict(image_processor.size) == {"height": 896, "width": 896}
    saved = json.loads((gemma3_896_dir / "processor_config.json").read_text())["image_processor"]
    assert {k: saved[k] for k in GEMMA3_PREPROCESSOR} == GEMMA3_PREPROCESSOR
    config = json.loads((gemma3_896_dir / "config.json").read_text())
    assert config == {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "torch_dtype": "bfloat16",
        "boi_token_index": 255999,
        "eoi_token_index": 256000,
        "image_token_index": 262144,
        "mm_tokens_per_image": 256,
        "vision_config": {"image_size": 896},
    }


def test_gemma3_896_one_image(gemma3_896_processor: Any) -> None:
    out = gemma3_896_processor(text=GEMMA3_PROMPT, images=[make_image(1024, 768)], return_tensors="pt")
    assert tuple(out["pixel_values"].shape) == (1, 3, 896, 896)
    ids = out["input_ids"][0].tolist()
    user, describe = gemma3_896_processor.tokenizer.convert_tokens_to_ids(["user", "Describe"])
    assert ids[:4] == [2, 105, user, 109]  # <bos> <start_of_turn> user "\n\n\n"
    assert ids[4:264] == [255999, *[262144] * 256, 256000, 108, describe]
    assert (len(ids), ids.count(262144)) == (274, 256)


GEMMA3_BPE_DIGEST = "d90d588f734afa6b"


def test_gemma3_real_bpe_is_deterministic() -> None:
    """A changed digest means the builder's output changed: bump FIXTURE_VERSION with it."""
    import hashlib

    bpe = gemma3_real_bpe()
    payload = json.dumps([sorted(bpe.vocab.items(), key=lambda kv: kv[1]), bpe.merges], ensure_ascii=True)
    assert hashlib.sha256(payload.encode()).hexdigest()[:16] == GEMMA3_BPE_DIGEST
    assert FIXTURE_VERSION == "2"


# --------------------------------------------------------------------------------------------------
# The default model cache
# --------------------------------------------------------------------------------------------------


def test_mmfront_home_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MMFRONT_HOME", str(tmp_path / "home"))
    assert mmfront_home() == tmp_path / "home"
    monkeypatch.delenv("MMFRONT_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert mmfront_home() == tmp_path / "xdg" / "mmfront"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert mmfront_home() == tmp_path / "user" / ".cache" / "mmfront"


def test_default_model_dir_builds_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, gemma3_896_dir: Path) -> None:
    monkeypatch.setenv("MMFRONT_HOME", str(tmp_path))
    first = default_model_dir()
    version = importlib.metadata.version("transformers")
    assert first == tmp_path / "models" / f"gemma3-896-v{FIXTURE_VERSION}-transformers{version}"
    assert sorted(p.name for p in first.iterdir()) == sorted(p.name for p in gemma3_896_dir.iterdir())
    assert (first / "config.json").read_text() == (gemma3_896_dir / "config.json").read_text()

    def no_rebuild(*args: object, **kwargs: object) -> Path:
        raise AssertionError("default_model_dir rebuilt a ready folder")

    monkeypatch.setattr(models, "build_model_folder", no_rebuild)
    assert default_model_dir() == first
    assert [p.name for p in (tmp_path / "models").iterdir()] == [first.name]


def test_racing_builders_leave_one_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MMFRONT_HOME", str(tmp_path))
    barrier = threading.Barrier(3)
    real_build = models.build_model_folder

    def build_together(kind: str, folder: Path, **options: Any) -> Path:
        barrier.wait(timeout=30)  # every thread is past the "is it there?" check before any rename
        return real_build(kind, folder, **options)

    monkeypatch.setattr(models, "build_model_folder", build_together)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(cached_model_dir("gemma3"))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len(set(results)) == 1
    assert [p.name for p in (tmp_path / "models").iterdir()] == [results[0].name]
    assert type(load_processor(results[0])).__name__ == "Gemma3Processor"


def test_cached_model_dir_rejects_unknown_kind(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MMFRONT_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="unknown model kind 'gemma4'"):
        cached_model_dir("gemma4")
    assert not (tmp_path / "models").exists()


# --------------------------------------------------------------------------------------------------
# Sample media
# --------------------------------------------------------------------------------------------------


def test_make_image_and_audio_are_seeded() -> None:
    img = make_image(5, 3, seed=7)
    assert (img.size, img.mode) == ((5, 3), "RGB")
    assert np.array_equal(np.asarray(img), np.asarray(make_image(5, 3, seed=7)))
    assert not np.array_equal(np.asarray(img), np.asarray(make_image(5, 3, seed=8)))
    audio = make_audio(0.5, sampling_rate=8000, seed=1)
    assert (audio.shape, audio.dtype) == ((4000,), np.float32)
    assert np.array_equal(audio, make_audio(0.5, sampling_rate=8000, seed=1))


@pytest.mark.parametrize("mode", ["1", "L", "P", "RGBA", "CMYK", "YCbCr", "I", "F", "LA", "PA", "RGBX",
                                  "LAB", "HSV", "RGBa", "La", "I;16", "I;16B"])
def test_make_image_in_any_mode_is_seeded_noise(mode: str) -> None:
    image = make_image(7, 5, seed=2, mode=mode)
    assert (image.mode, image.size) == (mode, (7, 5))
    assert image.tobytes() == make_image(7, 5, seed=2, mode=mode).tobytes()
    assert image.tobytes() != make_image(7, 5, seed=3, mode=mode).tobytes()


def test_make_image_converts_the_rgb_noise() -> None:
    rgb = make_image(6, 4, seed=5)
    assert np.array_equal(np.asarray(make_image(6, 4, seed=5, mode="L")), np.asarray(rgb.convert("L")))
    assert make_image(6, 4, seed=5, mode="P").tobytes() == rgb.convert("P").tobytes()


def test_make_raw_image_fills_every_byte_of_the_buffer() -> None:
    rgbx = make_raw_image(40, 30, seed=4, mode="RGBX")
    assert len(set(rgbx.tobytes()[3::4])) > 100  # the X band is noise too, not a constant 255
    assert make_raw_image(40, 30, seed=4, mode="RGB").tobytes() == rgbx.tobytes()[: 40 * 30 * 3]
    assert make_image(9, 2, seed=1, mode="HSV").tobytes() == make_raw_image(9, 2, seed=1, mode="HSV").tobytes()


@pytest.mark.parametrize("make", [make_image, make_raw_image])
def test_sample_images_reject_an_unknown_mode(make: Callable[..., Image.Image]) -> None:
    with pytest.raises(ValidationError, match="'XYZ' image") as info:
        make(2, 2, mode="XYZ")
    assert (info.value.parameter, info.value.value) == ("mode", "XYZ")


def test_image_data_url_round_trips_png() -> None:
    img = make_image(6, 4, seed=3)
    url = image_data_url(img)
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    decoded = Image.open(io.BytesIO(base64.b64decode(url[len(prefix) :])))
    assert decoded.format == "PNG"
    assert np.array_equal(np.asarray(decoded), np.asarray(img))
    assert image_data_url(img, format="jpeg").startswith("data:image/jpeg;base64,/9j/")


def test_image_data_url_rejects_unknown_format() -> None:
    with pytest.raises(ValidationError, match="unknown image format 'HEIC'"):
        image_data_url(make_image(2, 2), format="HEIC")


def _read_wav(data: bytes) -> tuple[int, int, int, np.ndarray]:
    with wave.open(io.BytesIO(data), "rb") as w:
        frames = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return w.getnchannels(), w.getsampwidth(), w.getframerate(), frames


def test_wav_bytes_writes_16_bit_pcm() -> None:
    channels, width, rate, frames = _read_wav(wav_bytes(np.array([0.0, 0.5, -0.5, 1.0, -1.0, 1.5, -2.0]), 16000))
    assert (channels, width, rate) == (1, 2, 16000)
    assert frames.tolist() == [0, 16384, -16384, 32767, -32767, 32767, -32767]
    stereo = np.array([[1, -1], [300, -300]], dtype=np.int16)
    channels, _, rate, frames = _read_wav(wav_bytes(stereo, 8000))
    assert (channels, rate, frames.tolist()) == (2, 8000, [1, -1, 300, -300])


def test_wav_bytes_rejects_bad_input() -> None:
    with pytest.raises(InputTypeError, match="dtype bool"):
        wav_bytes(np.array([True, False]), 16000)
    with pytest.raises(ValidationError, match=r"shape \(2, 2, 1\)"):
        wav_bytes(np.zeros((2, 2, 1), dtype=np.float32), 16000)
    with pytest.raises(ValidationError, match="sampling rate 0"):
        wav_bytes(np.zeros(4, dtype=np.float32), 0)
    with pytest.raises(ValidationError, match="sample_width 5") as info:
        wav_bytes(np.zeros(4, dtype=np.float32), 16000, sample_width=5)
    assert info.value.parameter == "sample_width"
    with pytest.raises(ValidationError, match=r"span -1\.\.3, outside the 0\.\.255 of 8-bit PCM"):
        wav_bytes(np.array([-1, 3]), 16000, sample_width=1)
    with pytest.raises(ValidationError, match=r"outside the -32768\.\.32767 of 16-bit PCM"):
        wav_bytes(np.array([40000]), 16000)


@pytest.mark.parametrize(("width", "codes", "raw"), [
    (1, [0, 128, 255], b"\x00\x80\xff"),
    (2, [-32768, 1, 32767], b"\x00\x80\x01\x00\xff\x7f"),
    (3, [-(1 << 23), -1, 5], b"\x00\x00\x80\xff\xff\xff\x05\x00\x00"),
    (4, [-(1 << 31), 2], b"\x00\x00\x00\x80\x02\x00\x00\x00"),
])
def test_wav_bytes_writes_integer_codes_at_any_width(width: int, codes: list[int], raw: bytes) -> None:
    with wave.open(io.BytesIO(wav_bytes(np.array(codes), 8000, sample_width=width)), "rb") as w:
        assert (w.getsampwidth(), w.getframerate(), w.getnframes()) == (width, 8000, len(codes))
        assert w.readframes(len(codes)) == raw


def test_wav_bytes_scales_floats_to_the_width() -> None:
    with wave.open(io.BytesIO(wav_bytes(np.array([-1.0, 0.0, 1.0]), 8000, sample_width=1)), "rb") as w:
        assert w.readframes(3) == bytes([1, 128, 255])
    with wave.open(io.BytesIO(wav_bytes(np.array([-1.0, 0.5]), 8000, sample_width=3)), "rb") as w:
        assert w.readframes(2) == (-(1 << 23) + 1).to_bytes(3, "little", signed=True) + (1 << 22).to_bytes(3, "little")


def test_wav_bytes_of_no_frames_is_an_empty_wav() -> None:
    channels, width, rate, frames = _read_wav(wav_bytes(np.zeros(0, dtype=np.int16), 16000))
    assert (channels, width, rate, frames.size) == (1, 2, 16000, 0)


@settings(max_examples=50, deadline=None)
@given(hnp.arrays(np.float32, st.integers(1, 64), elements=st.floats(-1, 1, width=32)))
def test_wav_bytes_round_trips_within_one_step(samples: np.ndarray) -> None:
    _, _, _, frames = _read_wav(wav_bytes(samples, 16000))
    assert np.max(np.abs(frames / 32767.0 - samples)) <= 0.5 / 32767 + 1e-7


def test_the_peer_venv_is_found_wherever_the_setup_script_built_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``vllm_peer_setup.sh`` without ``VENV`` builds ``.venv-vllm`` in the folder it runs from (the
    checkout, or ``../shared/peer``): each place is looked at in order; the variable, when set, alone."""
    places = [tmp_path / "tmp" / "bin" / "python", tmp_path / "checkout" / ".venv-vllm" / "bin" / "python",
              tmp_path / "shared" / "peer" / ".venv-vllm" / "bin" / "python"]
    monkeypatch.setattr(peer, "SEARCHED_PYTHONS", tuple(places))
    monkeypatch.delenv(peer.ENV_VAR, raising=False)
    assert peer.vllm_peer_python() is None
    for found in reversed(places):
        found.parent.mkdir(parents=True)
        found.touch()
        assert peer.vllm_peer_python() == found
    monkeypatch.setenv(peer.ENV_VAR, str(tmp_path / "elsewhere" / "python"))
    assert peer.vllm_peer_python() is None
    monkeypatch.setenv(peer.ENV_VAR, str(places[2]))
    assert peer.vllm_peer_python() == places[2]


def test_the_peer_search_starts_at_the_documented_place_then_the_checkout() -> None:
    checkout = Path(__file__).resolve().parents[1]
    assert (
        peer.DEFAULT_PYTHON, checkout / ".venv-vllm" / "bin" / "python",
        checkout.parent / "shared" / "peer" / ".venv-vllm" / "bin" / "python") == peer.SEARCHED_PYTHONS
