"""What the engine receives, mmfront against vLLM 0.33's own frontend, family by family.

For a processor family this builds its offline folder (:func:`mmfront.testing.coverage.build_processor_folder`),
completes its ``config.json`` into the model config vLLM loads (the model type's default config, its
architecture, the special-token ids of the folder's tokenizer), runs the same cases through
mmfront's ``create_processor(folder).apply`` and, in the peer venv, through vLLM's
``MULTIMODAL_REGISTRY.create_processor(ModelConfig(folder)).apply`` (``data/vllm_apply_peer.py``).
mmfront's items go to the peer as the frames mmfront's encoder puts on the wire and are decoded
there by vLLM's ``MsgpackDecoder``; vLLM's own items make the same encode/decode round trip. Both
are described the same way (field class and its slices, dtype, shape, a hash of the bytes), and
:func:`compare` says exactly which of ids / ranges / is_embed / hashes / keys / field / dtype /
uint8 / shape / bytes differ.

``python tests/models/vllm_parity.py [Processor ...] --out FILE`` runs the families (default: every
served family whose architecture vLLM 0.33 serves natively) and writes the table as markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from mmfront.testing.coverage import generation_architecture as architecture_of
from mmfront.testing.peer import vllm_peer_python

PEER_SCRIPT = Path(__file__).parent / "data" / "vllm_apply_peer.py"
VERSION = "9"
"""Bump when the folder or its completed config.json changes (folders are cached by it)."""

GPU_DTYPE = {"float32": "bfloat16", "bfloat16": "bfloat16", "float16": "float16"}
"""vLLM's ``--dtype auto`` on a GPU engine (compute capability >= 8.0): a float32 checkpoint is
served in the platform's first supported dtype, bfloat16 (``config/model.py``
``_resolve_auto_dtype``); half-precision checkpoints keep theirs."""

IMAGE_SIZES = ((48, 40), (64, 32), (40, 56))
AUDIO_SECONDS = (1.0, 1.6)
_WORDS = ("Describe", "and", "then", "please")


@dataclass
class Case:
    name: str
    modality: str
    media: list[Any]
    """PIL images, ``(samples, rate)`` audio, or ``(frames, metadata)`` video."""
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    placeholder: str = ""
    """The text standing for each item in the prompt (empty: the processor's placeholder)."""


def default_cases(modalities: Sequence[str]) -> list[Case]:
    """Several image sizes and aspect ratios, two images in a prompt, the same image twice; audio of
    two lengths."""
    from mmfront.testing.media import make_audio, make_image

    cases: list[Case] = []
    if "image" in modalities:
        images = [make_image(w, h, seed=i) for i, (w, h) in enumerate(IMAGE_SIZES)]
        cases += [Case("image_one", "image", images[:1]), Case("image_tall", "image", images[2:3]),
                  Case("image_two", "image", images[:2]), Case("image_same_twice", "image", [images[1], images[1]])]
    if "video" in modalities:
        cases += [Case("video_all_frames", "video", [video_clip(8, 2.0, range(8))]),
                  Case("video_sampled", "video", [video_clip(8, 2.0, range(0, 16, 2), total=16)]),
                  Case("video_two", "video", [video_clip(8, 2.0, range(8)), video_clip(4, 2.0, range(4), seed=1)])]
    if "audio" in modalities:
        clips = [(make_audio(s, 16000, seed=i), 16000) for i, s in enumerate(AUDIO_SECONDS)]
        cases += [Case("audio_one", "audio", clips[:1]), Case("audio_two", "audio", clips)]
    return cases


def video_clip(frames: int, fps: float, indices: Sequence[int] | range, *, total: int | None = None,
               seed: int = 0, size: tuple[int, int] = (56, 56)) -> tuple[Any, dict[str, Any]]:
    """Decoded frames with the metadata vLLM's OpenCV loader gives them: ``indices`` of ``total``
    source frames kept (all of them: ``do_sample_frames`` true, the short-clip case)."""
    import numpy as np

    total = total or frames
    kept = list(indices)
    rng = np.random.default_rng(seed)
    array = rng.integers(0, 256, (len(kept), size[1], size[0], 3), dtype=np.uint8)
    metadata = {"total_num_frames": total, "fps": fps, "duration": total / fps, "video_backend": "opencv",
                "frames_indices": kept, "do_sample_frames": len(kept) == total}
    return array, metadata


def prompt_for(placeholder: str, count: int) -> str:
    parts = [_WORDS[0]]
    for i in range(count):
        parts += [f" {placeholder}", f" {_WORDS[min(i + 1, len(_WORDS) - 1)]}"]
    return "".join(parts) + "."


def wire_frames(out: Any) -> dict[str, list[list[bytes]]]:
    """Each item of an ``apply`` output as the frames mmfront's encoder puts on the wire."""
    from mmfront.wire.codec import MsgpackEncoder

    encoder = MsgpackEncoder()
    return {m: [[bytes(memoryview(f).cast("B")) for f in encoder.encode(i)] for i in items]
            for m, items in out["mm_kwargs"].items()}


def assert_a_hit_sends_the_miss(proc: Any, modality: str, media: Sequence[Any]) -> tuple[Any, Any]:
    """Two items applied twice through a processor-only cache: the second call is served by the
    cache (two hits) and sends exactly what the first sent. Returns ``(miss, hit)``."""
    from mmfront.cache.factory import processor_only_cache_from_config

    cache = processor_only_cache_from_config(proc.info.config)
    assert cache is not None
    ids = proc.info.get_tokenizer().encode(prompt_for(proc.get_placeholder_str(modality, 0), 2), add_special_tokens=False)
    miss = proc.apply(ids, {modality: list(media)}, cache=cache)
    hit = proc.apply(ids, {modality: list(media)}, cache=cache)
    assert cache.make_stats().hits == 2
    assert (hit["prompt_token_ids"], hit["mm_hashes"], hit["mm_placeholders"]) == (
        miss["prompt_token_ids"], miss["mm_hashes"], miss["mm_placeholders"])
    assert wire_frames(hit) == wire_frames(miss)
    return miss, hit


# --- the folder ---------------------------------------------------------------------------------


def native_architectures(python: Path) -> dict[str, str]:
    """vLLM 0.33's native multimodal architectures (``ModelRegistry``): name -> module."""
    code = ("import json; from vllm.model_executor.models.registry import _MULTIMODAL_MODELS as M; "
            "print(json.dumps({k: v[0] for k, v in M.items()}))")
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, env=_peer_env(), check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


VLLM_NAMES: dict[str, tuple[str, str]] = {
    "Kimi_K25Processor": ("kimi_k25", "KimiK25ForConditionalGeneration"),
    "PixtralProcessor": ("mistral3", "Mistral3ForConditionalGeneration"),
}
"""Processor class -> (model type, architecture) of the checkpoints vLLM serves it for, where
transformers names the family otherwise: its Kimi-K2.5 class is ``Kimi_K25ForConditionalGeneration``
(vLLM's ``KimiK25ForConditionalGeneration``), and ``PixtralProcessor`` ships with Mistral 3
(``mistral3``) checkpoints, its own ``pixtral`` model type being the vision tower alone."""


def family_names(processor_class: str) -> tuple[str, str | None]:
    """The folder's model type and the architecture its config.json names for vLLM."""
    from mmfront.fixtures.generic import processor_recipe

    if processor_class in VLLM_NAMES:
        return VLLM_NAMES[processor_class]
    model_type = processor_recipe(processor_class).model_type
    return model_type, architecture_of(model_type)


def _token_id(tokenizer: Any, processor: Any, prefix: str) -> int | None:
    spellings = [getattr(processor, f"{prefix}_token", None), getattr(tokenizer, f"{prefix}_token", None),
                 f"<|{prefix}|>", f"<{prefix}>"]
    vocab = tokenizer.get_vocab()
    for spelling in spellings:
        if isinstance(spelling, str) and spelling in vocab:
            return int(vocab[spelling])
    value = getattr(processor, f"{prefix}_token_id", None)
    return value if isinstance(value, int) else None


def _align_token_ids(section: dict[str, Any], tokenizer: Any, processor: Any) -> None:
    """Every ``<prefix>_token_id``/``_token_index`` of the config names the folder tokenizer's id."""
    import re

    for key in list(section):
        match = re.fullmatch(r"(\w+?)_token_(?:id|index)", key)
        if match is None or key in ("bos_token_id", "eos_token_id", "pad_token_id"):
            continue
        token = _token_id(tokenizer, processor, match.group(1))
        if token is not None:
            section[key] = token


def _align_image_size(vision: Any, image_processor: Any) -> None:
    """The vision tower's ``image_size`` is the folder's image size (a small test size): vLLM counts
    an image's tokens from the config, HF from the image processor; real checkpoints agree."""
    if not isinstance(vision, dict) or not isinstance(vision.get("image_size"), int) or image_processor is None:
        return
    crop = getattr(image_processor, "crop_size", None) if getattr(image_processor, "do_center_crop", False) else None
    size = getattr(image_processor, "size", None)
    for box in (crop, size):
        side = _get(box, "height")
        if isinstance(side, int) and side == _get(box, "width"):
            vision["image_size"] = side
            return


def _align_grid_pinpoints(config: dict[str, Any], image_processor: Any) -> None:
    """The config's anyres ``image_grid_pinpoints`` are the folder image processor's (scaled down to
    its test tile size): vLLM counts an image's tiles from the config, HF from the image processor;
    real checkpoints agree."""
    pinpoints = getattr(image_processor, "image_grid_pinpoints", None)
    if "image_grid_pinpoints" in config and pinpoints:
        config["image_grid_pinpoints"] = [list(p) for p in pinpoints]


def _align_downsample_rate(config: dict[str, Any], processor: Any) -> None:
    """The config's ``downsample_rate`` is the folder processor's (Granite 4 Vision): vLLM counts an
    image's tokens from the config, HF from the processor; real checkpoints agree."""
    rate = getattr(processor, "downsample_rate", None)
    if "downsample_rate" in config and rate is not None:
        config["downsample_rate"] = rate


def _align_merged_patch(config: dict[str, Any], processor: Any) -> None:
    """The config's merged patch (the vision tower's ``patch_size`` times ``spatial_merge_size``) is
    the folder processor's (Mistral 3: vLLM counts an image's rows and columns of tokens in the
    config's merged patches, HF's ``PixtralProcessor`` in its own; real checkpoints agree)."""
    vision = config.get("vision_config")
    patch, merge = getattr(processor, "patch_size", None), getattr(processor, "spatial_merge_size", None)
    if (isinstance(vision, dict) and "patch_size" in vision and "spatial_merge_size" in config
            and isinstance(patch, int) and isinstance(merge, int)):
        vision["patch_size"], config["spatial_merge_size"] = patch, merge


def _get(box: Any, key: str) -> Any:
    return box.get(key) if isinstance(box, dict) else getattr(box, key, None)


def model_config(processor: Any, model_type: str, architecture: str) -> dict[str, Any]:
    """The config vLLM loads: the model type's default, the folder's architecture and token ids."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type).to_dict()
    config.update(architectures=[architecture], torch_dtype="float32")
    tokenizer = processor.tokenizer
    _align_token_ids(config, tokenizer, processor)
    for sub in ("text_config", "llm_config"):
        if isinstance(config.get(sub), dict):
            _align_token_ids(config[sub], tokenizer, processor)
            config[sub]["vocab_size"] = max(int(config[sub].get("vocab_size") or 0), len(tokenizer))
    _align_image_size(config.get("vision_config"), getattr(processor, "image_processor", None))
    _align_grid_pinpoints(config, getattr(processor, "image_processor", None))
    _align_downsample_rate(config, processor)
    _align_merged_patch(config, processor)
    if "vocab_size" in config:
        config["vocab_size"] = max(int(config.get("vocab_size") or 0), len(tokenizer))
    return config


def family_folder(processor_class: str, root: Path) -> tuple[Path, str | None]:
    """The family's offline folder with vLLM's config.json (built once under ``root``), and its architecture."""
    from mmfront.testing.coverage import build_processor_folder
    from mmfront.testing.models import FIXTURE_VERSION, load_processor

    model_type, architecture = family_names(processor_class)
    folder = root / f"{processor_class}-p{VERSION}-f{FIXTURE_VERSION}"
    if not (folder / ".done").exists():
        build_processor_folder(processor_class, folder)
        if architecture is not None:
            config = model_config(load_processor(folder), model_type, architecture)
            (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (folder / ".done").write_text("")
    return folder, architecture


# --- both sides ---------------------------------------------------------------------------------


def _peer_env() -> dict[str, str]:
    return {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def _describe_placeholders(ranges: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    return {m: [[r.offset, r.length, None if r.is_embed is None else [bool(x) for x in r.is_embed.tolist()]]
                for r in rs] for m, rs in ranges.items()}


def _save_media(case: Case, where: Path) -> list[Any]:
    import numpy as np

    entries: list[Any] = []
    for i, item in enumerate(case.media):
        if case.modality == "image":
            path = where / f"{case.name}-{i}.png"
            item.save(path)
            entries.append(str(path))
        elif case.modality == "audio":
            path = where / f"{case.name}-{i}.npy"
            np.save(path, item[0])
            entries.append({"path": str(path), "sr": item[1]})
        else:
            path = where / f"{case.name}-{i}.npy"
            np.save(path, item[0])
            entries.append({"path": str(path), "metadata": item[1]})
    return entries


def _reload_media(case: Case, entries: list[Any]) -> list[Any]:
    """mmfront gets the media exactly as the peer reads it back (PNG pixels, saved arrays)."""
    import numpy as np
    from PIL import Image

    if case.modality == "image":
        out = []
        for path in entries:
            with Image.open(path) as image:
                out.append(image.convert("RGB"))
        return out
    if case.modality == "audio":
        return [(np.load(e["path"]), e["sr"]) for e in entries]
    return [(np.load(e["path"]), e["metadata"]) for e in entries]


def run_family(processor_class: str, root: Path, *, dtype: str | None = None, model_impl: str = "auto",
               cases: Sequence[Case] | None = None, config_kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Both sides of every case for one family: ``{"vllm": ..., "mmfront": ..., "diff": ...}``."""
    from mmfront import MultiModalConfig
    from mmfront.errors import UnsupportedModelError
    from mmfront.models.registry import create_processor
    from mmfront.wire.codec import MsgpackEncoder

    python = vllm_peer_python()
    if python is None:
        raise RuntimeError("no vLLM peer venv")
    folder, architecture = family_folder(processor_class, root)
    config_dtype = json.loads((folder / "config.json").read_text()).get("torch_dtype", "float32")
    dtype = dtype or GPU_DTYPE.get(config_dtype, config_dtype)
    result: dict[str, Any] = {"processor": processor_class, "architecture": architecture, "dtype": dtype}
    mmfront_side: dict[str, Any] = {}
    proc = None
    try:
        proc = create_processor(folder, MultiModalConfig(**(config_kwargs or {})))
        result["mmfront_impl"] = "native" if proc.info.native is not None else "transformers"
    except UnsupportedModelError as exc:  # refused for --model-impl auto: compare what the backend would send
        result["refused"] = str(exc)[:300]
        try:
            proc = create_processor(folder, MultiModalConfig(**{**(config_kwargs or {}), "model_impl": "transformers"}))
            result["mmfront_impl"] = "transformers (auto refused)"
        except Exception as inner:
            result["mmfront_error"] = f"{type(inner).__name__}: {inner}"[:500]
    except Exception as exc:
        result["mmfront_error"] = f"{type(exc).__name__}: {exc}"[:500]
    modalities = [m for m in ("image", "audio", "video") if proc is not None and _takes(proc, m)]
    cases = list(cases) if cases is not None else default_cases(modalities)
    tokenizer = proc.info.get_tokenizer() if proc is not None else None
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        spec_cases, frames_files = [], {}
        for case in cases:
            if proc is None or tokenizer is None:
                break
            text = prompt_for(case.placeholder or proc.get_placeholder_str(case.modality, 0), len(case.media))
            ids = tokenizer.encode(text, add_special_tokens=False)
            entries = _save_media(case, where)
            spec_cases.append({"name": case.name, "prompt_token_ids": ids, "media": {case.modality: entries},
                               "mm_processor_kwargs": case.mm_processor_kwargs})
            try:
                out = proc.apply(ids, {case.modality: _reload_media(case, entries)},
                                 hf_processor_mm_kwargs=case.mm_processor_kwargs)
            except Exception as exc:
                mmfront_side[case.name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
                continue
            encoder = MsgpackEncoder()
            encoded = {m: [None if i is None else [bytes(memoryview(f).cast("B")) for f in encoder.encode(i)]
                           for i in items] for m, items in out["mm_kwargs"].items()}
            path = where / f"{case.name}.mmfront.msgpack"
            path.write_bytes(msgspec.msgpack.encode(encoded))
            frames_files[case.name] = str(path)
            mmfront_side[case.name] = {"prompt_token_ids": list(out["prompt_token_ids"]),
                                       "mm_placeholders": _describe_placeholders(out["mm_placeholders"]),
                                       "mm_hashes": {m: list(h) for m, h in out["mm_hashes"].items()}}
        spec = {"folder": str(folder), "dtype": dtype, "model_impl": model_impl, "cases": spec_cases,
                "mmfront": frames_files}
        spec_path = where / "spec.json"
        spec_path.write_text(json.dumps(spec))
        run = subprocess.run([str(python), str(PEER_SCRIPT), str(spec_path)], check=False, capture_output=True, text=True,
                             env=_peer_env(), timeout=900)
    if run.returncode != 0 or not run.stdout.strip():
        result["vllm_error"] = f"peer exited {run.returncode}: {run.stderr[-1500:]}"
        return result
    peer = json.loads(run.stdout.strip().splitlines()[-1])
    for name, decoded in peer.get("decoded", {}).items():
        if name in mmfront_side:
            mmfront_side[name]["mm_kwargs"] = decoded
    result.update(vllm=peer, mmfront=mmfront_side)
    if "error" in peer:
        result["vllm_error"] = peer["error"]
    result["diff"] = {name: compare(peer["cases"].get(name, {"error": "not run"}), mmfront_side.get(name, {}))
                      for name in [c["name"] for c in spec_cases]}
    return result


def _takes(proc: Any, modality: str) -> bool:
    try:
        return bool(proc.get_placeholder_str(modality, 0))
    except Exception:
        return False


# --- comparing ----------------------------------------------------------------------------------


def _tensors(value: Any) -> list[list[Any]]:
    if isinstance(value, list) and value and value[0] == "tensor":
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in _tensors(v)]
    return []


def _engine_field(field: list[Any]) -> list[Any]:
    """What the engine reads of a field: its class, ``dim`` and ``keep_on_cpu``. vLLM's flat fields
    carry the slices of the whole request in every item (its ``build_elems`` shares one field), so
    they change with the request's composition; the engine never reads them (``reduce_data``
    concatenates along ``dim``). A shared field's ``batch_size`` is likewise the count of items the
    HF call held (vLLM: the request's), and ``reduce_data`` takes the first item's data."""
    name, values = field
    return [name, {k: v for k, v in values.items() if k not in ("slices", "batch_size")}]


def compare(vllm: Mapping[str, Any], mmfront: Mapping[str, Any]) -> dict[str, Any]:
    """What differs between the two descriptions of one case: a sorted list of categories and details."""
    if "error" in vllm or "error" in mmfront or "mm_kwargs" not in mmfront:
        return {"differs": ["error"], "vllm_error": vllm.get("error"), "mmfront_error": mmfront.get("error")}
    differs: set[str] = set()
    details: list[str] = []
    if vllm["prompt_token_ids"] != mmfront["prompt_token_ids"]:
        differs.add("ids")
    for m, ranges in vllm["mm_placeholders"].items():
        mine = mmfront["mm_placeholders"].get(m, [])
        if [r[:2] for r in ranges] != [r[:2] for r in mine]:
            differs.add("ranges")
            details.append(f"{m} ranges vLLM {[r[:2] for r in ranges]} mmfront {[r[:2] for r in mine]}")
        else:
            for a, b in zip(ranges, mine):
                if a[2] != b[2]:
                    # None (every token embedded) against an all-True mask: the same embeddings, other wire bytes
                    none = (a[2] is None and all(b[2] or [])) or (b[2] is None and all(a[2] or []))
                    differs.add("is_embed(None)" if none else "is_embed")
    if vllm["mm_hashes"] != mmfront["mm_hashes"]:
        differs.add("hashes")
    for m, items in vllm["mm_kwargs"].items():
        mine = mmfront["mm_kwargs"].get(m, [])
        for index, (a, b) in enumerate(zip(items, mine)):
            a, b = a or {}, b or {}
            if set(a) != set(b):
                differs.add("keys")
                details.append(f"{m}[{index}] keys: vLLM only {sorted(set(a) - set(b))}, mmfront only {sorted(set(b) - set(a))}")
            for key in sorted(set(a) & set(b)):
                fa, fb = _engine_field(a[key]["field"]), _engine_field(b[key]["field"])
                if fa != fb:
                    differs.add("field")
                    details.append(f"{m}[{index}].{key} field vLLM {fa} mmfront {fb}")
                ta, tb = _tensors(a[key]["data"]), _tensors(b[key]["data"])
                if len(ta) != len(tb):
                    differs.add("shape")
                    continue
                for x, y in zip(ta, tb):
                    if x[1] != y[1]:
                        differs.add("uint8" if "uint8" in (x[1], y[1]) else "dtype")
                        details.append(f"{m}[{index}].{key} dtype vLLM {x[1]} mmfront {y[1]}")
                    if x[2] != y[2]:
                        differs.add("shape")
                        details.append(f"{m}[{index}].{key} shape vLLM {x[2]} mmfront {y[2]}")
                    if x[1] == y[1] and x[2] == y[2] and x[3] != y[3]:
                        differs.add("bytes")
                if not ta and a[key]["data"] != b[key]["data"]:
                    differs.add("bytes")
        if len(items) != len(mine):
            differs.add("items")
    return {"differs": sorted(differs), "details": sorted(set(details))[:12]}


def summary(result: Mapping[str, Any]) -> str:
    """One table row's 'what differs' cell."""
    if "vllm_error" in result:
        return "vLLM error: " + result["vllm_error"].splitlines()[0][:160]
    if "mmfront_error" in result:
        return "mmfront error: " + result["mmfront_error"][:160]
    cats: set[str] = set()
    for d in result.get("diff", {}).values():
        cats.update(d["differs"])
    return ", ".join(sorted(cats)) or "equal"


def render(results: Sequence[Mapping[str, Any]]) -> str:
    rows = ["| processor | architecture | vLLM processor | dtype | device normalise | mmfront sends | differs |",
            "|---|---|---|---|---|---|---|"]
    for r in results:
        resolved = (r.get("vllm") or {}).get("resolved") or {}
        rows.append(f"| `{r['processor']}` | `{r.get('architecture')}` | {resolved.get('processor', '')} | {r.get('dtype')} "
                    f"| {resolved.get('mm_device_do_normalize', '')} | {r.get('mmfront_impl', '')} | {summary(r)} |")
    return "\n".join(rows) + "\n"


SERVED_FAMILIES: tuple[str, ...] = (
    "Apertus1p5Processor", "AriaProcessor", "AudioFlamingo3Processor", "AyaVisionProcessor", "Cohere2VisionProcessor",
    "CohereCompassProcessor", "ColModernVBertProcessor", "Cosmos3EdgeProcessor", "DeepseekOcr2Processor",
    "DeepseekVLHybridProcessor", "DeepseekVLProcessor", "Dots3NoteProcessor", "Exaone4_5_Processor",
    "FunAsrNanoProcessor", "Gemma3Processor", "Gemma3nProcessor", "Glm46VProcessor", "Glm4vProcessor",
    "Glm5NextProcessor", "GlmAsrProcessor", "GlmImageProcessor", "GotOcr2Processor", "Granite4VisionProcessor",
    "GraniteDoclingProcessor", "GraniteSpeechProcessor", "HyperCLOVAXVisionV2Processor", "HYV4VLProcessor",
    "Idefics3Processor", "Inkling2Processor", "InternVLProcessor", "JanusProcessor", "Kimi_K25Processor",
    "Lfm2VlProcessor", "Lfm3VlProcessor", "LightOnOcrProcessor", "Llama4Processor", "LlavaNextProcessor",
    "LlavaNextVideoProcessor", "LlavaOnevisionProcessor", "LlavaProcessor", "MllamaProcessor", "Molmo2Processor",
    "MossTranscribeDiarizeProcessor", "MusicFlamingoProcessor", "Nemotron3_5TranscribeProcessor", "OmniASRProcessor",
    "Ovis2Processor", "PaddleOCRVLProcessor", "PaliGemmaProcessor", "Phi4MultimodalProcessor", "PixtralProcessor",
    "Qwen2_5_VLProcessor", "Qwen2_5OmniProcessor", "Qwen2AudioProcessor", "Qwen2VLProcessor", "Qwen3ASRProcessor",
    "Qwen3OmniMoeProcessor", "Qwen3VLProcessor", "SmolVLMProcessor", "UnlimitedOcrProcessor", "VibeVoiceAsrProcessor",
    "VibeVoiceProcessor", "VideoLlama3Processor", "VideoLlavaProcessor",
)
"""The families docs/models.md serves (proven against HF), Gemma 3 included."""


def native_families(python: Path) -> list[tuple[str, str]]:
    """``(processor class, architecture)`` of the served families vLLM 0.33 serves natively."""
    native = native_architectures(python)
    out = []
    for name in SERVED_FAMILIES:
        try:
            arch = family_names(name)[1]
        except Exception:
            continue
        if arch in native:
            out.append((name, arch))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("families", nargs="*")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "mmfront-parity")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    python = vllm_peer_python()
    if python is None:
        print("no vLLM peer venv", file=sys.stderr)
        return 2
    args.root.mkdir(parents=True, exist_ok=True)
    families = args.families or [name for name, _ in native_families(python)]
    results = []
    for name in families:
        try:
            result = run_family(name, args.root)
        except Exception as exc:
            result = {"processor": name, "mmfront_error": f"{type(exc).__name__}: {exc}"[:300]}
        print(f"{name}: {summary(result)}", flush=True)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if args.out:
        args.out.write_text(render(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
