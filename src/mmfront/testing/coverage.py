"""Which HF processors mmfront serves, proven offline against HF's own output.

For each processor class transformers gives a ``replace_<modality>_token`` hook
(:data:`HOOKED_PROCESSORS`), :func:`survey_processor` builds a small folder
(:func:`build_processor_folder`), loads it the way users do (``create_processor(folder)``) and
compares mmfront's result with the HF processor's own call on the same prompt and items: the
expanded ids, each item's placeholder range and ``is_embed`` mask, each item's tensors (equal to
HF's slice of the batch and to HF on the item alone), and a repeated request (a cache hit equal to
the miss). The outcome is a :class:`Coverage`: served and proven, or refused with the reason and
the typed error a user gets. ``mmfront models`` writes the outcomes into ``docs/models.md``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mmfront.errors import ConfigError, MMFrontError

__all__ = [
    "HOOKED_PROCESSORS",
    "Coverage",
    "build_processor_folder",
    "has_processor_class",
    "hooked_processor_classes",
    "prove_processor",
    "survey_processor",
]

HOOKED_PROCESSORS: tuple[str, ...] = (
    "Apertus1p5Processor", "AriaProcessor", "AudioFlamingo3Processor", "AyaVisionProcessor", "ChameleonProcessor",
    "Cohere2VisionProcessor", "CohereCompassProcessor", "ColModernVBertProcessor", "ColPaliProcessor",
    "ColQwen2Processor", "Cosmos3EdgeProcessor", "DeepseekOcr2Processor", "DeepseekVLHybridProcessor",
    "DeepseekVLProcessor", "Dots3NoteProcessor", "EmbeddingGemma2Processor", "Emu3Processor",
    "Ernie4_5_VLMoeProcessor", "Exaone4_5_Processor", "Florence2Processor", "FunAsrNanoProcessor", "FuyuProcessor",
    "Gemma3Processor", "Gemma3nProcessor", "Gemma4Processor", "Gemma4UnifiedProcessor", "Glm46VProcessor",
    "Glm4vProcessor", "Glm5NextProcessor", "GlmAsrProcessor", "GlmImageProcessor", "GotOcr2Processor",
    "Granite4VisionProcessor", "GraniteDoclingProcessor", "GraniteSpeechProcessor", "HYV4VLProcessor",
    "HunYuanVLProcessor", "HyperCLOVAXVisionV2Processor", "Idefics3Processor", "Inkling2Processor",
    "InklingProcessor", "InternVLProcessor", "JanusProcessor", "Kimi_K25Processor", "Lfm2VlProcessor",
    "Lfm3VlProcessor", "LightOnOcrProcessor", "Llama4Processor", "LlavaNextProcessor", "LlavaNextVideoProcessor",
    "LlavaOnevisionProcessor", "LlavaProcessor", "MiniCPMOcrProcessor", "MiniCPMV4_6Processor",
    "MiniCPMV4_7Processor", "MiniMaxM3VLProcessor", "MllamaProcessor", "Molmo2Processor",
    "MossTranscribeDiarizeProcessor", "MuseGlimmerProcessor", "MuseSparkProcessor", "MusicFlamingoProcessor",
    "Nemotron3_5TranscribeProcessor", "NemotronH_Omni_Reasoning_V3Processor", "NeoMMEProcessor", "OmniASRProcessor",
    "Ovis2Processor", "PaddleOCRVLProcessor", "PaliGemmaProcessor", "PerceptionLMProcessor",
    "Phi4MultimodalProcessor", "PixtralProcessor", "PocketTTSProcessor", "QianfanOCRProcessor", "Qwen2AudioProcessor",
    "Qwen2VLProcessor", "Qwen2_5OmniProcessor", "Qwen2_5_VLProcessor", "Qwen3ASRProcessor", "Qwen3OmniMoeProcessor",
    "Qwen3VLProcessor", "ShieldGemma2Processor", "SmolVLMProcessor", "Step3p7Processor", "UnlimitedOcrProcessor",
    "VibeVoiceAsrProcessor", "VibeVoiceProcessor", "VideoLlama3Processor", "VideoLlavaProcessor",
)
"""The processor classes of transformers 5.24 with a ``replace_<modality>_token`` hook (what
:func:`hooked_processor_classes` finds there): the coverage suite's parameters on every version."""

SERVED = "served"
REFUSED = "refused"
NOT_BUILT = "cannot build offline"
MISMATCH = "differs from HF"
UNPROVEN = "not proven"
"""HF's own processor refuses the survey's prompt (it needs its chat template's markup): nothing
to compare with."""

IMAGE_SIZES = ((48, 40), (64, 32), (40, 56))
"""``(width, height)`` of the 1st, 2nd and 3rd image: three sizes and aspect ratios."""

AUDIO_SECONDS = (1.0, 1.6, 0.7)

_WORDS = ("Describe", "and", "then", "please")
_MMFRONT_KEYS = frozenset({"num_image_patches", "num_audio_tokens"})
_HF_ARG = {"image": "images", "audio": "audio"}


class _Mismatch(AssertionError):
    """mmfront's result differs from HF's for a processor it serves: a bug, never a refusal."""


class _HFRefused(Exception):
    """HF's own processor call refused the request (it takes one audio per prompt)."""


@dataclass
class Coverage:
    """One processor's outcome."""

    processor_class: str
    status: str
    reason: str = ""
    error: str = ""
    """The typed error a user gets (its class name), for a refusal."""
    modalities: tuple[str, ...] = ()
    notes: list[str] = field(default_factory=list)
    hashes: dict[str, list[str]] = field(default_factory=dict)
    """The content hashes of the proof's largest request, per modality (compared across processes)."""


def hooked_processor_classes() -> list[str]:
    """Every processor class of the installed transformers that defines a
    ``replace_<modality>_token`` hook (its own or a base's below ``ProcessorMixin``), by scanning
    the source of ``transformers/models/*/processing_*.py``."""
    import transformers

    root = Path(transformers.__file__).parent / "models"
    hook = re.compile(r"def replace_(image|audio|video)_token\(")
    klass = re.compile(r"^class (\w+)\(", re.M)
    names: list[str] = []
    for path in sorted(root.glob("*/processing_*.py")):
        source = path.read_text(encoding="utf-8")
        if not hook.search(source):
            continue
        names += [m.group(1) for m in klass.finditer(source) if m.group(1).endswith("Processor")]
    return sorted(dict.fromkeys(names))


def build_processor_folder(processor_class: str, folder: Path) -> Path:
    """A small offline folder for ``processor_class`` (any HF processor class), built by
    :mod:`mmfront.fixtures.generic`: its own sub-processors at their default config, a small
    tokenizer with its special tokens, the family's overrides. Returns ``folder``."""
    from transformers.utils import logging as hf_logging

    from mmfront.fixtures.generic import build_processor, processor_recipe, save_processor

    hf_logging.set_verbosity_error()
    processor = build_processor(processor_class)
    return save_processor(processor, processor_recipe(processor_class).model_type, Path(folder))


def _missing_library(exc: BaseException) -> str | None:
    """The library ``exc`` (or its cause) says the build needs (``torchvision``, ``num2words``)."""
    text = f"{type(exc).__name__}: {exc} {exc.__cause__ or ''}"
    for library in ("torchvision", "torchaudio"):
        if library in text.lower():
            return library
    package = re.search(r"Package `(\w+)` is required|requires the (\w+) library", text)
    if package is not None:
        return package.group(1) or package.group(2)
    return "torchvision" if "_extra_content" in text else None


# --- media and prompts ------------------------------------------------------------------------


def _media(modality: str, count: int, rate: float | None) -> list[Any]:
    from mmfront.testing.media import make_audio, make_image

    if modality == "image":
        return [make_image(w, h, seed=i) for i, (w, h) in enumerate(IMAGE_SIZES[:count])]
    sr = int(rate or 16000)
    return [make_audio(s, sr, seed=i) for i, s in enumerate(AUDIO_SECONDS[:count])]


def prompt_for(placeholder: str, count: int) -> str:
    """Text before, between and after ``count`` placeholders."""
    parts = [_WORDS[0]]
    for i in range(count):
        parts.append(f" {placeholder}")
        parts.append(f" {_WORDS[min(i + 1, len(_WORDS) - 1)]}")
    return "".join(parts) + "."


# --- comparing ---------------------------------------------------------------------------------


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise _Mismatch(what)


def _tensors_equal(a: Any, b: Any) -> bool:
    """Equal bit for bit; a float tensor HF returns in a narrower dtype (Llama 4's bfloat16) is
    compared after the lossless widening to mmfront's model dtype."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype and a.is_floating_point() and b.is_floating_point():
            narrow, wide = (a, b) if a.element_size() < b.element_size() else (b, a)
            return narrow.shape == wide.shape and bool(torch.equal(narrow.to(wide.dtype), wide))
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_tensors_equal(x, y) for x, y in zip(a, b))
    return bool(a == b)


def _as_item(hf_value: Any, item: Any) -> bool:
    """Whether mmfront's item data is HF's output for that item alone: the same, or without
    HF's batch dimension of one."""
    import torch

    if _tensors_equal(item, hf_value):
        return True
    if isinstance(hf_value, torch.Tensor) and hf_value.ndim > 0 and hf_value.shape[0] == 1:
        return _tensors_equal(item, hf_value[0])
    if isinstance(hf_value, (list, tuple)) and len(hf_value) == 1:
        return _tensors_equal(item, hf_value[0])
    return False


def _in_batch(hf_value: Any, items: Sequence[Any]) -> bool:
    """Whether mmfront's items are HF's batched output sliced per item: concatenated along rows
    (dim 0, or dim 1 under a batch of one), one per batch entry, or each a crop of its entry where
    HF padded the batch."""
    import torch

    if isinstance(hf_value, (list, tuple)):
        return len(hf_value) == len(items) and all(_tensors_equal(v, i) for v, i in zip(hf_value, items))
    if not isinstance(hf_value, torch.Tensor) or not all(isinstance(i, torch.Tensor) for i in items):
        return False
    for dim in (0, 1):
        if all(i.ndim == hf_value.ndim for i in items) and hf_value.ndim > dim:
            try:
                if _tensors_equal(torch.cat(list(items), dim=dim), hf_value):
                    return True
            except RuntimeError:
                pass
    if hf_value.ndim > 0 and hf_value.shape[0] == len(items):
        crops = []
        for entry, item in zip(hf_value, items):
            if item.ndim != entry.ndim or any(s > e for s, e in zip(item.shape, entry.shape)):
                return False
            crops.append(entry[tuple(slice(0, s) for s in item.shape)])
        return all(_tensors_equal(c, i) for c, i in zip(crops, items))
    return False


def _padded(hf_value: Any, items: Sequence[Any]) -> bool:
    """Whether HF padded a batch of items of different lengths to its longest (audio features),
    so its batch holds no unpadded slice to compare with; each item is then compared with HF on
    that item alone."""
    import torch

    if not isinstance(hf_value, torch.Tensor) or not all(isinstance(i, torch.Tensor) for i in items):
        return False
    shapes = {tuple(i.shape) for i in items}
    return len(shapes) > 1 and hf_value.ndim > 0 and hf_value.shape[0] == len(items)


@dataclass
class _Case:
    proc: Any
    hf: Any
    modality: str
    rate: float | None
    call_kwargs: dict[str, Any]
    _alone: dict[int, Mapping[str, Any]] = field(default_factory=dict)

    def alone(self, index: int, media: Any) -> Mapping[str, Any]:
        """HF's output for the ``index``-th sample item alone (the same item in every request)."""
        if index not in self._alone:
            self._alone[index] = _hf_call(self, self.proc.get_placeholder_str(self.modality, 0), [media], offsets=False)
        return self._alone[index]


def _hf_call(case: _Case, text: str, items: list[Any], *, offsets: bool) -> Mapping[str, Any]:
    from mmfront.models.transformers import offsets_request_kwargs

    kwargs: dict[str, Any] = dict(case.call_kwargs)
    if offsets:
        kwargs.update(offsets_request_kwargs())
    return case.hf(text=text, **{_HF_ARG[case.modality]: items}, return_tensors="pt", **kwargs)


def _declared_embed_id(hf: Any, modality: str) -> int | None:
    """The token HF declares for the modality: ``{modality}_token_ids`` where it is one token
    (Gemma 3's soft token), else ``{modality}_token_id``."""
    ids = getattr(hf, f"{modality}_token_ids", None)
    declared = {int(i) for i in ids if i is not None} if isinstance(ids, (list, tuple)) else set()
    if len(declared) == 1:  # several: the tokens mm_token_type_ids marks, structure tokens included
        return declared.pop()
    token_id = getattr(hf, f"{modality}_token_id", None)
    return token_id if isinstance(token_id, int) else None


def _embedding_token(span: Sequence[int], declared: int | None, where: str, notes: list[str]) -> int:
    """The token of HF's expansion that receives embeddings: the one it repeats most, which must be
    unambiguous; where HF declares another token that the expansion holds, that is noted."""
    counts: dict[int, int] = {}
    for token in span:
        counts[token] = counts.get(token, 0) + 1
    top = max(counts.values())
    leaders = [t for t, n in counts.items() if n == top]
    _check(len(leaders) == 1 or declared in leaders,
           f"HF's expansion repeats no token most (ambiguous embedding token) for {where}")
    token = declared if declared in leaders else leaders[0]
    if declared is not None and declared != token and declared in counts:
        notes.append("HF's declared token is the placeholder; embeddings go to the token its expansion repeats")
    return token


def _check_request(case: _Case, count: int, offsets: bool, notes: list[str]) -> list[str]:
    """One request of ``count`` items against HF's own call; returns the hashes."""
    import torch

    modality, hf = case.modality, case.hf
    placeholder = case.proc.get_placeholder_str(modality, 0)
    text = prompt_for(placeholder, count)
    items = _media(modality, count, case.rate)
    data = [(a, int(case.rate)) for a in items] if modality == "audio" and case.rate else items
    try:
        ref = _hf_call(case, text, items, offsets=offsets)
    except Exception as exc:  # whatever HF's own call raises, there is nothing to compare with
        raise _HFRefused(f"{type(exc).__name__}: {exc}") from exc
    out = case.proc.apply(text, {modality: data})
    ids = out["prompt_token_ids"]
    hf_ids = [int(t) for t in ref["input_ids"][0].tolist()]
    where = f"{count} {modality} item(s), prompt {text!r}"
    _check(ids == hf_ids, f"prompt ids differ from HF's for {where}:\n  mmfront {ids}\n  HF      {hf_ids}")
    ranges = out["mm_placeholders"][modality]
    _check(len(ranges) == count, f"{len(ranges)} placeholder ranges for {where}")
    covered = [False] * len(ids)
    replacements = [e["replacement"] for e in (ref.get("text_replacement_offsets") or [[]])[0]
                    if e.get("type") == modality]
    declared = _declared_embed_id(hf, modality)
    embed: set[int] = set()
    end = 0
    for i, r in enumerate(ranges):
        _check(r.offset >= end, f"placeholder range {i} overlaps the one before for {where}")
        end = r.offset + r.length
        span = ids[r.offset:end]
        if replacements:
            expected = list(hf.tokenizer.encode(replacements[i], add_special_tokens=False))
            _check(span == expected, f"item {i}'s range is not HF's replacement for {where}")
        token = _embedding_token(span, declared, where, notes)
        embed.add(token)
        mask = torch.tensor([t == token for t in span])
        got = r.is_embed if r.is_embed is not None else torch.ones(r.length, dtype=torch.bool)
        _check(bool(torch.equal(got, mask)), f"is_embed of item {i} is not HF's embedding tokens for {where}")
        for k in range(r.offset, end):
            covered[k] = True
    stray = [k for k, t in enumerate(ids) if t in embed and not covered[k]]
    _check(not stray, f"HF embedding tokens outside every placeholder range at {stray[:5]} for {where}")
    _check_tensors(case, out, ref, items, where)
    _check_prompt_outputs(case, out, ref, where, notes)
    return list(out["mm_hashes"][modality])


def _check_prompt_outputs(case: _Case, out: Mapping[str, Any], ref: Mapping[str, Any], where: str,
                          notes: list[str]) -> None:
    """Each HF output laid out along the prompt that the model's engine rebuilds
    (``ModelSpec.prompt_outputs``) equals HF's when rebuilt from mmfront's ids, ranges and items."""
    from mmfront.models.catalog import prompt_outputs

    items = {m: [{k: field.data for k, field in item.items()} for item in found]
             for m, found in out["mm_kwargs"].items()}
    for key, rebuild in prompt_outputs(type(case.hf)).items():
        _check(key in ref, f"HF returns no {key!r} the engine would rebuild for {where}")
        rebuilt = rebuild(out["prompt_token_ids"], out["mm_placeholders"], items)
        _check(_tensors_equal(rebuilt, ref[key][0]), f"{key!r} rebuilt from mmfront's prompt is not HF's for {where}")
        notes.append(f"{key} is not sent: the engine rebuilds it from the ranges and items "
                     f"({rebuild.__module__}.{rebuild.__name__}), proven equal to HF's")


def _check_tensors(case: _Case, out: Mapping[str, Any], ref: Mapping[str, Any], items: list[Any], where: str) -> None:
    """Each item's data is HF's batch output sliced per item and HF's output for the item alone.
    A key HF returns only for a batch (a padding mask) and not for an item alone is absent from the
    items, which are processed alone where HF would pad them. Outputs the engine rebuilds from the
    prompt are no item's (:func:`_check_prompt_outputs`)."""
    from mmfront.models.catalog import prompt_outputs
    from mmfront.models.transformers.layout import TEXT_KEYS

    modality = case.modality
    mm_items = out["mm_kwargs"][modality]
    alone = [case.alone(i, media) for i, media in enumerate(items)]
    for key in [k for k in ref if k not in TEXT_KEYS and k not in prompt_outputs(type(case.hf))]:
        if not any(key in item for item in mm_items):
            _check(not any(key in a for a in alone), f"HF output {key!r} is missing from mmfront's items for {where}")
            continue
        _check(all(key in item for item in mm_items), f"HF output {key!r} is missing from some items for {where}")
        values = [item[key].data for item in mm_items]
        _check(_in_batch(ref[key], values) or _padded(ref[key], values),
               f"{key!r} of the items is not HF's batch output sliced per item for {where}")
        for i, (value, a) in enumerate(zip(values, alone)):
            _check(_as_item(a[key], value) if key in a else _empty(value),
                   f"{key!r} of item {i} differs from HF on that item alone (batch-dependent) for {where}")


def _empty(value: Any) -> bool:
    return bool(getattr(value, "numel", lambda: 1)() == 0) or (isinstance(value, (list, tuple)) and not value)


def _check_cache(case: _Case) -> None:
    from mmfront import MultiModalConfig
    from mmfront.cache.factory import processor_only_cache_from_config

    cache = processor_only_cache_from_config(MultiModalConfig())
    text = prompt_for(case.proc.get_placeholder_str(case.modality, 0), 2)
    items = _media(case.modality, 2, case.rate)
    data = [(a, int(case.rate)) for a in items] if case.modality == "audio" and case.rate else items
    miss = case.proc.apply(text, {case.modality: data}, cache=cache)
    hit = case.proc.apply(text, {case.modality: data}, cache=cache)
    assert cache is not None
    _check(cache.make_stats().hits >= 2, "a repeated request was not a cache hit")
    _check(hit["prompt_token_ids"] == miss["prompt_token_ids"], "a cache hit's ids differ from the miss")
    _check(hit["mm_placeholders"] == miss["mm_placeholders"], "a cache hit's ranges differ from the miss")
    _check(hit["mm_hashes"] == miss["mm_hashes"], "a cache hit's hashes differ from the miss")
    for a, b in zip(hit["mm_kwargs"][case.modality], miss["mm_kwargs"][case.modality]):
        _check(set(a) == set(b) and all(_tensors_equal(a[k].data, b[k].data) for k in a),
               "a cache hit's item data differ from the miss")


def prove_processor(folder: Path, processor_class: str) -> tuple[tuple[str, ...], dict[str, list[str]], list[str]]:
    """Every check of the survey on ``folder``: ``(modalities, hashes, notes)``. Raises
    an AssertionError on a difference and mmfront's typed error where it refuses. The proof is
    against HF, so the processor sends vLLM's transformers-backend layout (``model_impl
    "transformers"``); what a native class receives is the parity suites' (docs/vllm-parity.md)."""
    from mmfront import MultiModalConfig
    from mmfront.models.registry import create_processor
    from mmfront.models.transformers import OFFSETS_MIN_VERSION, TRANSFORMERS_VERSION

    proc = create_processor(folder, MultiModalConfig(dtype="float32", model_impl="transformers"), model_id=processor_class)
    hf = proc.info.hf_processor
    offsets = TRANSFORMERS_VERSION >= OFFSETS_MIN_VERSION
    modalities = tuple(m for m in ("image", "audio") if m in proc.info.get_supported_mm_limits())
    hashes: dict[str, list[str]] = {}
    notes: list[str] = []
    for modality in modalities:
        rate = proc.info.get_target_sample_rate() if modality == "audio" else None
        call_kwargs = {"audio_kwargs": {"sampling_rate": int(rate)}} if modality == "audio" and rate else {}
        case = _Case(proc, hf, modality, rate, call_kwargs)
        for count in (1, 2, 3):
            try:
                hashes[modality] = _check_request(case, count, offsets, notes)
            except _HFRefused:
                if count == 1:
                    raise
                notes.append(f"HF takes one {modality} per prompt: proven on 1 item")
                break
        _check_cache(case)
    return modalities, hashes, list(dict.fromkeys(notes))


def survey_processor(processor_class: str, folder: Path) -> Coverage:
    """Build ``processor_class``'s folder under ``folder`` and prove it; never raises."""
    import transformers

    try:
        if not hasattr(transformers, processor_class):
            return Coverage(processor_class, NOT_BUILT,
                            f"transformers {transformers.__version__} has no {processor_class}")
    except ImportError as exc:  # a lazy attribute whose optional backend is missing
        return Coverage(processor_class, f"needs {_missing_library(exc) or 'an optional library'}", _short(exc))
    try:
        build_processor_folder(processor_class, folder)
    except Exception as exc:  # every way a build fails is an outcome
        library = _missing_library(exc)
        if library is not None:
            return Coverage(processor_class, f"needs {library}", _short(exc))
        return Coverage(processor_class, NOT_BUILT, _short(exc))
    try:
        modalities, hashes, notes = prove_processor(folder, processor_class)
    except _HFRefused as exc:
        return Coverage(processor_class, UNPROVEN, f"HF's own call refuses the prompt: {_short(exc)}")
    except _Mismatch as exc:
        from mmfront.fixtures.overrides import OVERRIDES

        known = OVERRIDES.get(processor_class)
        detail = str(exc).splitlines()[0]
        return Coverage(processor_class, MISMATCH, f"{known.known_mismatch}: {detail}" if known and known.known_mismatch
                        else detail)
    except MMFrontError as exc:
        return Coverage(processor_class, REFUSED, _short(exc), error=type(exc).__name__)
    except Exception as exc:
        library = _missing_library(exc)
        if library is not None:
            return Coverage(processor_class, f"needs {library}", _short(exc))
        return Coverage(processor_class, MISMATCH, f"untyped {type(exc).__name__}: {_short(exc)}")
    return Coverage(processor_class, SERVED, modalities=modalities, hashes=hashes, notes=notes)


def _short(exc: BaseException, limit: int = 300) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


# --- hashes across processes, the table -------------------------------------------------------


def has_processor_class(name: str) -> bool:
    """Whether the installed transformers defines ``name`` (one whose optional library is missing
    counts: the survey reports what it needs)."""
    import transformers

    try:
        return hasattr(transformers, name)
    except ImportError:
        return True


def request_hashes(folder: Path, processor_class: str, counts: Mapping[str, int]) -> dict[str, list[str]]:
    """The content hashes of the proof's largest request (``counts`` items per modality), computed
    as ``prepare`` does, without processing: what another process compares."""
    from mmfront import MultiModalConfig
    from mmfront.hashing import get_mm_hashes, normalize_mm_uuids
    from mmfront.models.registry import create_processor

    proc = create_processor(folder, MultiModalConfig(dtype="float32", model_impl="transformers"), model_id=processor_class)
    out: dict[str, list[str]] = {}
    for modality, count in counts.items():
        rate = proc.info.get_target_sample_rate() if modality == "audio" else None
        items = _media(modality, count, rate)
        data = [(a, int(rate)) for a in items] if modality == "audio" and rate else items
        parsed = proc.info.parse_mm_data({modality: data})
        hashes = get_mm_hashes({modality: parsed[modality].get_all_items_for_hash()}, processor_class,
                               proc.info.config.mm_hasher_algorithm,
                               mm_uuids=normalize_mm_uuids(None, {modality: count}), hf_processor_mm_kwargs={},
                               media_io_kwargs=None)
        out[modality] = list(hashes[modality])
    return out


TABLE_BEGIN = "<!-- coverage table: generated by `mmfront models --write docs/models.md`; do not edit -->"
TABLE_END = "<!-- end of coverage table -->"


def _status_cell(c: Coverage) -> str:
    if c.status == SERVED:
        return "**served, proven**"
    return c.status


VLLM_NATIVE = "equal to vLLM native"
VLLM_HF_ONLY = "HF only"
VLLM_REFUSED = "refused"


def generation_architecture(model_type: str) -> str | None:
    """The generation architecture transformers maps ``model_type`` to (what a checkpoint's
    ``config.json`` names, and so the class vLLM resolves)."""
    from transformers.models.auto import modeling_auto as m

    for table in ("MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES", "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
                  "MODEL_FOR_VISION_2_SEQ_MAPPING_NAMES", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
                  "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"):
        names = getattr(m, table, {})
        if model_type in names:
            value = names[model_type]
            return value[0] if isinstance(value, (list, tuple)) else value
    return None


def vllm_equality(outcome: Coverage) -> str:
    """What vLLM 0.33's engine gets for a processor under ``--model-impl auto``: where vLLM has a
    native class, the inputs the parity suite proved equal to its frontend's (``ModelSpec.native``),
    else a refusal; where it runs its transformers backend, what is proven against HF ("HF only")
    (docs/vllm-parity.md)."""
    from mmfront.fixtures.generic import processor_recipe
    from mmfront.models.catalog import model_specs
    from mmfront.models.native import NATIVE_REFUSALS, VLLM_NATIVE_ARCHITECTURES

    if outcome.status not in (SERVED, MISMATCH):
        return VLLM_REFUSED if outcome.status == REFUSED else "—"
    model_type = processor_recipe(outcome.processor_class).model_type
    architecture = generation_architecture(model_type)
    shipped = [s for s in model_specs().values() if s.hf_processor_class == outcome.processor_class and s.native]
    if architecture is None and shipped:  # checkpoints of another model type ship the processor (Pixtral: mistral3)
        return f"**{VLLM_NATIVE}**"
    if architecture in VLLM_NATIVE_ARCHITECTURES:
        spec = model_specs().get(model_type)
        if spec is not None and spec.native is not None and architecture in spec.native.architectures:
            return f"**{VLLM_NATIVE}**"
        if architecture in NATIVE_REFUSALS:
            return f"{VLLM_REFUSED} (vLLM's native class fails on transformers' processor)"
        return f"{VLLM_REFUSED} (native class not yet proven)"
    return VLLM_HF_ONLY if outcome.status == SERVED else "—"


def render_table(outcomes: Sequence[Coverage]) -> str:
    """The markdown table of ``outcomes`` (one row per processor, sorted), with a count line."""
    import transformers

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ")

    counts: dict[str, int] = {}
    for c in outcomes:
        counts[c.status] = counts.get(c.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    lines = [
        f"{len(outcomes)} processors under transformers {transformers.__version__}: {summary}.",
        "",
        "| processor | status | vLLM (`--model-impl auto`) | modalities | reason / notes | error a user gets |",
        "|---|---|---|---|---|---|",
    ]
    for c in sorted(outcomes, key=lambda c: c.processor_class.lower()):
        reason = "; ".join(c.notes) if c.status == SERVED else c.reason
        lines.append(f"| `{c.processor_class}` | {_status_cell(c)} | {vllm_equality(c)} | {', '.join(c.modalities)} | "
                     f"{cell(reason)} | {f'`{c.error}`' if c.error else ''} |")
    return "\n".join(lines) + "\n"


def replace_table(document: str, table: str) -> str:
    """``document`` with the text between the table markers replaced by ``table``."""
    begin, end = document.find(TABLE_BEGIN), document.find(TABLE_END)
    if begin < 0 or end < begin:
        raise ConfigError(f"the document has no coverage table markers ({TABLE_BEGIN!r} ... {TABLE_END!r})")
    return document[:begin + len(TABLE_BEGIN)] + "\n\n" + table + "\n" + document[end:]


def survey_all(folder: Path, names: Sequence[str] = (), progress: Callable[[Coverage], None] | None = None
               ) -> list[Coverage]:
    """:func:`survey_processor` on every name (default :data:`HOOKED_PROCESSORS`), each in a
    subfolder of ``folder``."""
    out = []
    for name in names or HOOKED_PROCESSORS:
        outcome = survey_processor(name, Path(folder) / name)
        if progress is not None:
            progress(outcome)
        out.append(outcome)
    return out
