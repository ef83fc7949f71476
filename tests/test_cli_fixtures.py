"""``mmfront fixtures``: ``list`` names every family (the fixture kinds, then the survey's HF processor
classes), ``build FAMILY DIR`` writes the folder the tests' own builders write, which mmfront loads
as a user's model folder, and prints the command that serves it; a name, ``--weights`` or folder it
cannot take ends with exit 2 and a message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmfront.cli import main
from mmfront.config import MultiModalConfig
from mmfront.models.registry import create_processor
from mmfront.testing.coverage import HOOKED_PROCESSORS
from mmfront.testing.models import build_model_folder, fixture_model_impl

KINDS = ["emu3\tfixture kind (emu3)", "gemma3\tfixture kind (gemma3), --weights",
         "gemma3-896\tfixture kind (gemma3), --weights", "glmasr\tfixture kind (glmasr)",
         "idefics3\tfixture kind (idefics3), --weights", "llava_onevision\tfixture kind (llava_onevision), --weights",
         "qwen2_5_vl\tfixture kind (qwen2_5_vl), --weights", "qwen2_audio\tfixture kind (qwen2_audio), --weights"]


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_list_names_the_fixture_kinds_then_every_surveyed_processor(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fixtures", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [*KINDS, *(f"{name}\tHF processor" for name in HOOKED_PROCESSORS)]


def test_build_writes_the_tests_folder_of_a_kind_and_says_how_to_serve_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "idefics3"
    assert main(["fixtures", "build", "idefics3", str(folder)]) == 0
    assert capsys.readouterr().out == (
        f"mmfront fixtures: wrote idefics3 to {folder}; serve it with:\n"
        f"  mmfront serve {folder} --data-parallel-size-local 0  # no weights: in front of headless engines\n")
    assert files(folder) == files(build_model_folder("idefics3", tmp_path / "direct"))
    config = MultiModalConfig(model_impl=fixture_model_impl("idefics3"))
    assert type(create_processor(folder, config).info.hf_processor).__name__ == "Idefics3Processor"


def test_build_writes_a_surveyed_processor_class_mmfront_loads(tmp_path: Path) -> None:
    folder = tmp_path / "llava"
    assert main(["fixtures", "build", "LlavaProcessor", str(folder)]) == 0
    assert json.loads((folder / "config.json").read_text()) == {"model_type": "llava", "torch_dtype": "float32"}
    assert type(create_processor(folder, MultiModalConfig()).info.hf_processor).__name__ == "LlavaProcessor"


@pytest.mark.slow
def test_build_with_weights_adds_the_random_weight_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "gemma3"
    assert main(["fixtures", "build", "gemma3", str(folder), "--weights"]) == 0
    assert capsys.readouterr().out.endswith(f"serve it with:\n  mmfront serve {folder}\n")
    assert "model.safetensors" in files(folder)
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["Gemma3ForConditionalGeneration"]


@pytest.mark.parametrize(("argv", "message"), [
    (["nope"], "no fixture family 'nope'; 'mmfront fixtures list' names them all (e.g. emu3, gemma3, gemma3-896, "
               "glmasr)."),
    (["emu3", "--weights"], "'emu3' has no random-weight model; --weights takes one of gemma3, gemma3-896, "
                            "idefics3, llava_onevision, qwen2_5_vl, qwen2_audio."),
])
def test_a_family_or_weights_it_cannot_build_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                    argv: list[str], message: str) -> None:
    assert main(["fixtures", "build", argv[0], str(tmp_path / "out"), *argv[1:]]) == 2
    assert capsys.readouterr().err == f"mmfront fixtures: {message}\n"
    assert not (tmp_path / "out").exists()


def test_a_folder_holding_files_is_not_written_over(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert main(["fixtures", "build", "idefics3", str(tmp_path)]) == 2
    assert capsys.readouterr().err == f"mmfront fixtures: {tmp_path} exists and is not an empty folder; pass a new one.\n"
    assert files(tmp_path) == {"keep.txt": b"mine"}
