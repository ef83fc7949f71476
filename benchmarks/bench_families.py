"""A cache hit against a miss, per model family users run most (issue 23's Build 4), through the
transformers backend: ``apply()`` of one 1024x768 image (or 3 s of audio for the speech
families) with the default LRU sender cache. A miss is a new item each round (load, hash, HF
processing, prompt updates); a hit is the same item again (hash and cache lookup only).

Each family's processor is the offline folder ``mmfront.testing.coverage.build_processor_folder``
builds: the family's own image processor or feature extractor at its default config, except where
``mmfront.fixtures.overrides`` shrinks its tiles for the test suite (InternVL, LLaVA-NeXT and
-OneVision, SmolVLM, Mllama, ...). Those misses cost less than on the real checkpoint, so their
ratios are conservative: Mllama's miss is ~15 ms at the override's 28 px tiles, ~84 ms at its real
560 px ones, for the same ~1 ms hit. A family this transformers cannot
build (or mmfront refuses) is reported as such, never skipped silently.

Qwen2.5-VL is also measured as vLLM's native class reads it (issue 32): its miss with the engine
normalising on the device (``--mm-device-do-normalize``, vLLM's default: raw ``uint8`` patches)
against its miss with the frontend normalising (``--no-mm-device-do-normalize``: rescaled,
normalised patches in the model dtype), in the same run; the raw miss skips HF's rescale and
normalisation, so it must cost no more.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _harness import Report, median_time
from mmfront import MultiModalConfig
from mmfront.cache import processor_cache_from_config
from mmfront.errors import MMFrontError
from mmfront.models.registry import create_processor
from mmfront.testing.coverage import build_processor_folder, prompt_for
from mmfront.testing.media import make_audio, make_image

GROUP = "families: hit / miss"

FAMILIES: tuple[tuple[str, str], ...] = (
    ("Qwen2-VL", "Qwen2VLProcessor"),
    ("Qwen2.5-VL", "Qwen2_5_VLProcessor"),
    ("Qwen3-VL", "Qwen3VLProcessor"),
    ("LLaVA 1.5", "LlavaProcessor"),
    ("LLaVA-NeXT", "LlavaNextProcessor"),
    ("LLaVA-OneVision", "LlavaOnevisionProcessor"),
    ("InternVL", "InternVLProcessor"),
    ("Pixtral / Mistral 3", "PixtralProcessor"),
    ("Llama 4", "Llama4Processor"),
    ("Mllama", "MllamaProcessor"),
    ("Gemma 3n", "Gemma3nProcessor"),
    ("PaliGemma", "PaliGemmaProcessor"),
    ("SmolVLM", "SmolVLMProcessor"),
    ("Phi-4-multimodal", "Phi4MultimodalProcessor"),
    ("Qwen2.5-Omni", "Qwen2_5OmniProcessor"),
    ("Granite Speech", "GraniteSpeechProcessor"),
)

WIDTH, HEIGHT = 1024, 768
AUDIO_SECONDS = 3.0


def _items(modality: str, rate: float | None, count: int) -> list[Any]:
    if modality == "image":
        return [make_image(WIDTH, HEIGHT, seed=1000 + i) for i in range(count)]
    return [make_audio(AUDIO_SECONDS, int(rate or 16000), seed=1000 + i) for i in range(count)]


def _measure_modality(report: Report, family: str, proc: Any, modality: str, quick: bool) -> None:
    rate = proc.info.get_target_sample_rate() if modality == "audio" else None
    prompt = prompt_for(proc.get_placeholder_str(modality, 0), 1)
    cache = processor_cache_from_config(MultiModalConfig())
    rounds = 3 if quick else 7
    fresh = iter(_items(modality, rate, rounds + 1))
    same = _items(modality, rate, 1)

    def miss() -> None:
        proc.apply(prompt, {modality: [next(fresh)]}, cache=cache)

    def hit() -> None:
        proc.apply(prompt, {modality: same}, cache=cache)

    miss_s = median_time(miss, repeat=rounds, number=1)
    hit_s = median_time(hit, repeat=rounds * 3, number=1)
    name = f"{family} ({modality})"
    report.add(GROUP, f"{name}: miss", miss_s * 1e3, "ms")
    report.add(GROUP, f"{name}: hit", hit_s * 1e3, "ms")
    report.ratio(GROUP, f"{name}: hit / miss", hit_s / miss_s, at_most=0.1)


def _measure(report: Report, family: str, processor_class: str, folder: Path, quick: bool) -> None:
    proc = create_processor(build_processor_folder(processor_class, folder), MultiModalConfig(),
                            model_id=processor_class)
    limits = proc.info.get_supported_mm_limits()
    for modality in ("image", "audio"):
        if modality in limits:
            _measure_modality(report, family, proc, modality, quick)


NATIVE_GROUP = "families: uint8 miss"


def _measure_device_normalize(report: Report, folder: Path, quick: bool) -> None:
    """Qwen2.5-VL's miss through vLLM's native layout, raw against normalised pixels, alternating
    rounds so that both see the same machine load."""
    build_processor_folder("Qwen2_5_VLProcessor", folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "architectures": ["Qwen2_5_VLForConditionalGeneration"]}))
    procs = {on: create_processor(folder, MultiModalConfig(mm_device_do_normalize=on), model_id="Qwen2_5_VLProcessor")
             for on in (True, False)}
    prompt = prompt_for(procs[True].get_placeholder_str("image", 0), 1)
    rounds = 3 if quick else 7
    fresh = iter(_items("image", None, 2 * rounds + 2))
    caches = {on: processor_cache_from_config(MultiModalConfig()) for on in procs}
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(rounds + 1):  # the first round warms up
        for on, proc in procs.items():
            image = next(fresh)
            start = time.perf_counter()
            proc.apply(prompt, {"image": [image]}, cache=caches[on])
            times[on].append(time.perf_counter() - start)
    raw, normalised = (statistics.median(times[on][1:]) for on in (True, False))
    report.add(NATIVE_GROUP, "Qwen2.5-VL miss, uint8 (device normalise)", raw * 1e3, "ms")
    report.add(NATIVE_GROUP, "Qwen2.5-VL miss, normalised (frontend)", normalised * 1e3, "ms")
    report.ratio(NATIVE_GROUP, "Qwen2.5-VL uint8 miss / normalised miss", raw / normalised, at_most=1.0)


def run(report: Report, quick: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="mmfront-bench-families-") as tmp:
        try:
            _measure_device_normalize(report, Path(tmp) / "qwen2_5_vl-native", quick)
        except (MMFrontError, ImportError, ValueError, TypeError, OSError) as exc:
            reason = " ".join(str(exc).split())[:90] or "no message"
            report.add(NATIVE_GROUP, f"Qwen2.5-VL: not measured ({type(exc).__name__}: {reason})", 0, "")
        for family, processor_class in FAMILIES:
            try:
                _measure(report, family, processor_class, Path(tmp) / processor_class, quick)
            except (MMFrontError, ImportError, ValueError, TypeError, OSError) as exc:
                reason = " ".join(str(exc).split())[:90] or "no message"
                report.add(GROUP, f"{family}: not measured ({type(exc).__name__}: {reason})", 0, "")
