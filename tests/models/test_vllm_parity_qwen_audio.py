"""Qwen3-ASR and Qwen2.5-Omni send what vLLM 0.33's native frontend sends (issue 32; the harness is
``vllm_parity``, see ``test_vllm_parity.py``).

Both post-process a clip as vLLM's Omni processors do (``mmfront.models.qwen2_5_omni.omni_audio_outputs``):
its mel frames trimmed to its own length, flat along time (``input_audio_features``, dim 1) by
``audio_feature_lengths``, with its ``feature_attention_mask``, both batched on the CPU; ranges
without a mask. Qwen2.5-Omni's images and videos are Qwen2.5-VL's fields without device
normalisation, a video's ``second_per_grid_ts`` and the shared ``use_audio_in_video`` flag. Cases:
clips of two lengths, two clips, the same clip twice, a clip past Whisper's 30 s (vLLM calls HF
with ``truncation=False``: every frame kept); images of three sizes and aspect ratios, two
images, the same image twice; a short clip with every frame kept, a sampled clip, two clips. A cache
hit sends the bytes of a miss, and an item sends the same bytes whatever else is in its request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_parity import (
    AUDIO_SECONDS,
    Case,
    assert_a_hit_sends_the_miss,
    default_cases,
    family_folder,
    prompt_for,
    run_family,
    video_clip,
    wire_frames,
)

from mmfront import MultiModalConfig
from mmfront.errors import ConfigError, ProcessorError, UnsupportedModelError, ValidationError
from mmfront.models.registry import create_processor
from mmfront.models.transformers import OFFSETS_MIN_VERSION, TRANSFORMERS_VERSION
from mmfront.testing.media import make_audio, make_image
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()
needs_peer = pytest.mark.skipif(PEER is None, reason=SKIP_REASON)

LEGACY = TRANSFORMERS_VERSION < OFFSETS_MIN_VERSION
OMNI_LEGACY = ("under transformers < 5.15 (Legacy) Qwen2.5-Omni is refused for the native class: the Legacy backend "
               "cannot split its two-image probe (test_qwen2_5_omni_is_refused_on_the_legacy_backend)")

PROVEN = ("Qwen3ASRProcessor", "Qwen2_5OmniProcessor")
VLLM_PROCESSOR = {"Qwen3ASRProcessor": "Qwen3ASRMultiModalProcessor",
                  "Qwen2_5OmniProcessor": "Qwen2_5OmniThinkerMultiModalProcessor"}
AUDIO_KEYS = ["audio_feature_lengths", "feature_attention_mask", "input_audio_features"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parity-qwen-audio")


def _clip(seconds: float, seed: int) -> tuple[Any, int]:
    return make_audio(seconds, 16000, seed=seed), 16000


SHORT = _clip(0.5, 4)
PAST_30S = _clip(31.0, 3)
"""Past Whisper's 30 s window: vLLM calls HF with ``truncation=False`` (``NativeInputs.hf_defaults``), so
every frame is kept."""


def _item(description: dict[str, Any]) -> dict[str, Any]:
    """An item's description as the engine reads it (a flat field's slices span its HF call)."""
    return {k: [v["field"][0], {n: x for n, x in v["field"][1].items() if n != "slices"}, v["data"]]
            for k, v in description.items()}


def cases(processor_class: str) -> list[Case]:
    """The default cases of the family's modalities, the same clip twice, a clip past 30 s alone and beside
    a short one; Qwen2.5-Omni's video with ``use_audio_in_video=False`` given."""
    clip = _clip(AUDIO_SECONDS[1], 1)
    audio = [Case("audio_same_twice", "audio", [clip, clip]), Case("audio_short", "audio", [SHORT]),
             Case("audio_past_30s", "audio", [PAST_30S]), Case("audio_short_and_past_30s", "audio", [SHORT, PAST_30S])]
    if processor_class == "Qwen3ASRProcessor":
        return [*default_cases(["audio"]), *audio]
    off = Case("video_audio_in_video_off", "video", [video_clip(4, 2.0, range(4), seed=1)], {"use_audio_in_video": False})
    return [*default_cases(["image", "video", "audio"]), *audio, off]


@needs_peer
@pytest.mark.slow
@pytest.mark.parametrize("processor_class", PROVEN)
def test_engine_inputs_equal_vllm_native(processor_class: str, root: Path) -> None:
    if LEGACY and processor_class == "Qwen2_5OmniProcessor":
        pytest.skip(OMNI_LEGACY)
    result = run_family(processor_class, root, cases=cases(processor_class))
    assert "vllm_error" not in result and "mmfront_error" not in result, result
    assert result["mmfront_impl"] == "native"
    resolved = result["vllm"]["resolved"]
    assert resolved["processor"] == VLLM_PROCESSOR[processor_class]
    assert resolved["dtype"] == "bfloat16" and resolved["mm_device_do_normalize"] is False
    assert set(result["diff"]) == {c.name for c in cases(processor_class)}
    vllm = result["vllm"]["cases"]
    if processor_class == "Qwen2_5OmniProcessor":
        # HF pads Qwen2.5-Omni's clips of one call to 30 s, and with truncation off cannot stack a longer
        # one beside them: vLLM fails on the request (it serves it where one clip is a cache hit). mmfront
        # processes the clips apart and sends each as vLLM sends it alone (an intended difference).
        pair = result["diff"].pop("audio_short_and_past_30s")
        assert pair["differs"] == ["error"] and "Failed to apply Qwen2_5OmniProcessor" in pair["vllm_error"]
        alone = [vllm[n]["mm_kwargs"]["audio"][0] for n in ("audio_short", "audio_past_30s")]
        sent = result["mmfront"]["audio_short_and_past_30s"]["mm_kwargs"]["audio"]
        assert [_item(i) for i in sent] == [_item(i) for i in alone]
    for name, diff in result["diff"].items():
        assert diff == {"differs": [], "details": []}, f"{processor_class} {name}: {diff}"

    first, second = vllm["audio_two"]["mm_kwargs"]["audio"]
    assert sorted(first) == AUDIO_KEYS
    assert first["input_audio_features"]["field"][0] == "flat"
    assert first["input_audio_features"]["field"][1]["dim"] == 1
    assert first["feature_attention_mask"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert first["audio_feature_lengths"]["field"] == ["batched", {"keep_on_cpu": True}]
    # each clip's frames trimmed to its own length: 1.0 s and 1.6 s at a 10 ms hop
    mel = 128 if processor_class == "Qwen3ASRProcessor" else 80
    assert (first["input_audio_features"]["data"][1:3], second["input_audio_features"]["data"][1:3]) == (
        ["bfloat16", [mel, 100]], ["bfloat16", [mel, 160]])
    assert first["audio_feature_lengths"]["data"][1:3] == ["int64", []]
    # the masks as HF padded them: Qwen3-ASR's clip alone (to a multiple of 100 frames), Qwen2.5-Omni's to 30 s
    padded = [[100], [200]] if processor_class == "Qwen3ASRProcessor" else [[3000], [3000]]
    assert [c["feature_attention_mask"]["data"][1:3] for c in (first, second)] == [["int32", p] for p in padded]
    ranges = vllm["audio_two"]["mm_placeholders"]["audio"]
    tokens = [13, 21] if processor_class == "Qwen3ASRProcessor" else [25, 40]
    assert [r[1] for r in ranges] == tokens and all(r[2] is None for r in ranges)
    one, two = vllm["audio_same_twice"]["mm_hashes"]["audio"]
    assert one == two
    (past,) = vllm["audio_past_30s"]["mm_kwargs"]["audio"]
    assert past["input_audio_features"]["data"][2] == [mel, 3100]  # every frame of 31 s, none truncated
    assert vllm["audio_past_30s"]["mm_placeholders"]["audio"][0][1] == (403 if processor_class == "Qwen3ASRProcessor"
                                                                          else 775)
    if processor_class == "Qwen3ASRProcessor":
        return

    (image,) = vllm["image_one"]["mm_kwargs"]["image"]
    assert sorted(image) == ["image_grid_thw", "pixel_values"]
    assert image["image_grid_thw"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert image["pixel_values"]["field"][0] == "flat" and image["pixel_values"]["data"][1] == "bfloat16"
    first_video, second_video = vllm["video_two"]["mm_kwargs"]["video"]
    assert sorted(first_video) == ["pixel_values_videos", "second_per_grid_ts", "use_audio_in_video", "video_grid_thw"]
    assert first_video["second_per_grid_ts"]["field"] == ["batched", {"keep_on_cpu": True}]
    assert first_video["use_audio_in_video"]["field"][0] == "shared"
    assert first_video["use_audio_in_video"]["data"][1:3] == ["bool", []]
    assert [v["pixel_values_videos"]["data"][2] for v in (first_video, second_video)] == [[2304, 1176], [1152, 1176]]
    assert [r[1:] for r in vllm["video_two"]["mm_placeholders"]["video"]] == [[576, None], [288, None]]
    (off,) = vllm["video_audio_in_video_off"]["mm_kwargs"]["video"]
    assert off["use_audio_in_video"]["data"] == first_video["use_audio_in_video"]["data"]  # False, as without the kwarg


@pytest.mark.parametrize("processor_class", PROVEN)
def test_cache_hit_sends_what_a_miss_sends(processor_class: str, root: Path) -> None:
    if LEGACY and processor_class == "Qwen2_5OmniProcessor":
        pytest.skip(OMNI_LEGACY)
    folder, _ = family_folder(processor_class, root)
    proc = create_processor(folder, MultiModalConfig())
    assert proc.info.native is not None
    miss, _ = assert_a_hit_sends_the_miss(proc, "audio", [_clip(1.0, 0), _clip(1.6, 1)])
    assert [sorted(item) for item in miss["mm_kwargs"]["audio"]] == [AUDIO_KEYS, AUDIO_KEYS]
    if processor_class == "Qwen2_5OmniProcessor":
        miss, _ = assert_a_hit_sends_the_miss(proc, "image", [make_image(48, 40, seed=0), make_image(40, 56, seed=1)])
        assert [sorted(item) for item in miss["mm_kwargs"]["image"]] == [["image_grid_thw", "pixel_values"]] * 2
        clips = [video_clip(8, 2.0, range(8)), video_clip(4, 2.0, range(4), seed=1)]
        miss, _ = assert_a_hit_sends_the_miss(proc, "video", clips)
        assert [sorted(item) for item in miss["mm_kwargs"]["video"]] == [
            ["pixel_values_videos", "second_per_grid_ts", "use_audio_in_video", "video_grid_thw"]] * 2


def test_qwen2_5_omni_items_do_not_change_with_the_request(root: Path) -> None:
    """An image, a clip and a video alone send what they send in one request holding all three, and a
    clip what it sends beside a longer one (vLLM makes one HF call of the whole request)."""
    if LEGACY:
        pytest.skip(OMNI_LEGACY)
    folder, _ = family_folder("Qwen2_5OmniProcessor", root)
    proc = create_processor(folder, MultiModalConfig())
    tokenizer = proc.info.get_tokenizer()
    media: dict[str, list[Any]] = {"image": [make_image(64, 32, seed=2)], "audio": [_clip(1.0, 0)],
                                   "video": [video_clip(4, 2.0, range(4), seed=1)]}

    def apply(data: dict[str, list[Any]]) -> Any:
        text = "".join(prompt_for(proc.get_placeholder_str(m, 0), len(items)) for m, items in data.items())
        return proc.apply(tokenizer.encode(text, add_special_tokens=False), data)

    together = wire_frames(apply(media))
    for modality, items in media.items():
        assert wire_frames(apply({modality: items}))[modality] == together[modality], modality
    pair = wire_frames(apply({"audio": [_clip(1.0, 0), _clip(1.6, 1)]}))["audio"]
    assert pair[0] == together["audio"][0]


def _peer_describe(folder: Path, name: str, ids: list[int], media: dict[str, list[Any]], sent: Any,
                   where: Path) -> dict[str, Any]:
    """vLLM's own description of one request of several modalities, and of mmfront's items
    (``sent``: an ``apply`` output) decoded by vLLM: ``(vLLM's case, mmfront's decoded items)``."""
    import json
    import os
    import subprocess

    import msgspec
    import numpy as np
    from vllm_parity import PEER_SCRIPT

    entries: dict[str, list[Any]] = {}
    for modality, items in media.items():
        for i, item in enumerate(items):
            path = where / f"{modality}-{i}"
            if modality == "image":
                item.save(path.with_suffix(".png"))
                entries.setdefault(modality, []).append(str(path.with_suffix(".png")))
                continue
            np.save(path.with_suffix(".npy"), item[0])
            extra = {"sr": item[1]} if modality == "audio" else {"metadata": item[1]}
            entries.setdefault(modality, []).append({"path": str(path.with_suffix(".npy")), **extra})
    frames = where / "mmfront.msgpack"
    frames.write_bytes(msgspec.msgpack.encode(wire_frames(sent)))
    spec = {"folder": str(folder), "dtype": "bfloat16", "model_impl": "auto", "mmfront": {name: str(frames)},
            "cases": [{"name": name, "prompt_token_ids": ids, "media": entries, "mm_processor_kwargs": {}}]}
    (where / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    run = subprocess.run([str(PEER), str(PEER_SCRIPT), str(where / "spec.json")], capture_output=True, text=True,
                         env=env, timeout=900, check=True)
    peer = json.loads(run.stdout.strip().splitlines()[-1])
    return {"vllm": peer["cases"][name], "decoded": peer["decoded"][name]}


@needs_peer
@pytest.mark.slow
def test_qwen2_5_omni_request_of_every_modality_equals_vllm(root: Path, tmp_path: Path) -> None:
    """An image, a clip and a video in one prompt: vLLM makes one HF call of them all, mmfront's items
    are the ones each sends alone; ids, ranges, hashes and every item equal."""
    if LEGACY:
        pytest.skip(OMNI_LEGACY)
    from vllm_parity import compare

    folder, _ = family_folder("Qwen2_5OmniProcessor", root)
    proc = create_processor(folder, MultiModalConfig())
    media: dict[str, list[Any]] = {"image": [make_image(64, 32, seed=2)], "audio": [_clip(1.0, 0)],
                                   "video": [video_clip(4, 2.0, range(4), seed=1)]}
    text = "".join(prompt_for(proc.get_placeholder_str(m, 0), len(items)) for m, items in media.items())
    ids = proc.info.get_tokenizer().encode(text, add_special_tokens=False)
    out = proc.apply(ids, media)
    peer = _peer_describe(folder, "every_modality", ids, media, out, tmp_path)
    mine = {"prompt_token_ids": list(out["prompt_token_ids"]), "mm_kwargs": peer["decoded"],
            "mm_placeholders": {m: [[r.offset, r.length, None if r.is_embed is None else r.is_embed.tolist()] for r in rs]
                                for m, rs in out["mm_placeholders"].items()},
            "mm_hashes": {m: list(h) for m, h in out["mm_hashes"].items()}}
    assert compare(peer["vllm"], mine) == {"differs": [], "details": []}
    assert sorted(peer["vllm"]["mm_kwargs"]) == ["audio", "image", "video"]
    assert [r[1:] for r in peer["vllm"]["mm_placeholders"]["audio"]] == [[25, None]]


def test_qwen2_5_omni_refuses_audio_in_video(root: Path) -> None:
    """vLLM interleaves a video's audio into its placeholder with ``use_audio_in_video``; mmfront does
    not build that yet, so the native class refuses it (a request's kwarg and a deployment's)."""
    if LEGACY:
        pytest.skip(OMNI_LEGACY)
    folder, _ = family_folder("Qwen2_5OmniProcessor", root)
    proc = create_processor(folder, MultiModalConfig())
    ids = proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str("video", 0), 1), add_special_tokens=False)
    media = {"video": [video_clip(4, 2.0, range(4))], "audio": [_clip(1.0, 0)]}
    with pytest.raises(ValidationError, match=r"mm_processor_kwargs\.use_audio_in_video=True: vLLM's native processor "
                                              r"then interleaves each video's audio track"):
        proc.apply(ids, media, hf_processor_mm_kwargs={"use_audio_in_video": True})
    with pytest.raises(ConfigError, match=r"MultiModalConfig\.mm_processor_kwargs\.use_audio_in_video=True"):
        create_processor(folder, MultiModalConfig(mm_processor_kwargs={"use_audio_in_video": True}))
    backend = MultiModalConfig(mm_processor_kwargs={"use_audio_in_video": True}, model_impl="transformers")
    assert create_processor(folder, backend).info.native is None


def test_qwen2_5_omni_is_refused_on_the_legacy_backend(root: Path) -> None:
    """The Legacy backend is not proven for the native class: under transformers < 5.15 it cannot split
    the two adjacent images of its probe (no per-item counts), so it builds no Qwen2.5-Omni processor.
    The native class is refused first, with the reason."""
    folder, _ = family_folder("Qwen2_5OmniProcessor", root)
    with pytest.raises(UnsupportedModelError, match=r"Legacy transformers backend.*cannot locate two adjacent images"):
        create_processor(folder, MultiModalConfig(transformers_backend="legacy"))
    backend = MultiModalConfig(transformers_backend="legacy", model_impl="transformers")
    if not LEGACY:
        assert create_processor(folder, backend).info.native is None
        return
    with pytest.raises(ProcessorError, match=r"Could not locate 2 image item\(s\) in Qwen2_5OmniProcessor"):
        create_processor(folder, backend)


def _renamed(folder: Path, architecture: str, where: Path) -> Path:
    """A copy of ``folder`` whose config.json names ``architecture``."""
    import json
    import shutil

    shutil.copytree(folder, where)
    config = json.loads((where / "config.json").read_text())
    (where / "config.json").write_text(json.dumps({**config, "architectures": [architecture]}))
    return where


def test_qwen2_5_omni_model_runs_the_same_class(root: Path, tmp_path: Path) -> None:
    """vLLM registers ``Qwen2_5OmniModel`` to the thinker class and processor proven here."""
    if LEGACY:
        pytest.skip(OMNI_LEGACY)
    from mmfront.models.qwen2_5_omni import QWEN2_5_OMNI_NATIVE

    folder = _renamed(family_folder("Qwen2_5OmniProcessor", root)[0], "Qwen2_5OmniModel", tmp_path / "model")
    assert create_processor(folder).info.native is QWEN2_5_OMNI_NATIVE


def test_qwen3_asr_realtime_stays_refused(root: Path, tmp_path: Path) -> None:
    """vLLM runs another processor for the realtime class (``Qwen3ASRRealtimeMultiModalProcessor``),
    not compared: a folder naming it is refused for the native class."""
    realtime = _renamed(family_folder("Qwen3ASRProcessor", root)[0], "Qwen3ASRRealtimeGeneration", tmp_path / "rt")
    with pytest.raises(UnsupportedModelError, match=r"Qwen3ASRRealtimeGeneration runs vLLM 0\.33's native class"):
        create_processor(realtime)
    assert create_processor(realtime, MultiModalConfig(model_impl="transformers")).info.native is None
