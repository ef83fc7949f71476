"""Which implementation vLLM's engine runs for a folder, and what its native class must receive.

vLLM 0.33 runs its **native** model class for an architecture it has one for (``--model-impl
auto``), else its transformers backend. The two read different inputs: the native class reads the
keys, field classes and layout its processor's ``_get_mm_fields_config`` declares, raw ``uint8``
pixels where the engine normalises on the GPU (``mm_device_do_normalize``), whole-range
placeholders without an ``is_embed`` mask. So what mmfront sends is decided per family: a model
module declares a :class:`NativeInputs` on its :class:`~mmfront.models.spec.ModelSpec` once the
parity suite (``tests/models/test_vllm_parity.py``) proves mmfront's items equal to vLLM's, and
:func:`resolve_model_impl` refuses a native architecture without one rather than send it in a form
the engine would misread.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mmfront.errors import UnsupportedModelError
from mmfront.processing.native import NativeInputs

__all__ = ["NATIVE_REFUSALS", "VLLM_NATIVE_ARCHITECTURES", "ResolvedImpl", "folder_architectures", "resolve_model_impl"]

VLLM_NATIVE_ARCHITECTURES: frozenset[str] = frozenset((
    "Alpamayo2Super", "AriaForConditionalGeneration", "AudioFlamingo3ForConditionalGeneration",
    "BagelForConditionalGeneration", "BailingMoeV3VLForConditionalGeneration", "BeeForConditionalGeneration",
    "Blip2ForConditionalGeneration", "Cohere2VisionForConditionalGeneration", "CohereAsrForConditionalGeneration",
    "CohereCompassForConditionalGeneration", "Cosmos3EdgeForConditionalGeneration", "Cosmos3ForConditionalGeneration",
    "DeepseekOCR2ForCausalLM", "DeepseekOCRForCausalLM", "DeepseekV41ForCausalLM", "DeepseekV4ForConditionalGeneration",
    "DeepseekVLV2ForCausalLM", "DiffusionGemmaForBlockDiffusion", "Dots3NoteForCausalLM", "DotsOCRForCausalLM",
    "Eagle2_5_VLForConditionalGeneration", "Ernie4_5_VLMoeForConditionalGeneration", "Exaone4_5_ForConditionalGeneration",
    "FireRedASR2ForConditionalGeneration", "FunASRForConditionalGeneration", "FunAudioChatForConditionalGeneration",
    "GLM4VForCausalLM", "Gemma3ForConditionalGeneration", "Gemma3nForConditionalGeneration",
    "Gemma4ForConditionalGeneration", "Gemma4UnifiedForConditionalGeneration", "Glm4vForConditionalGeneration",
    "Glm4vMoeForConditionalGeneration", "Glm5NextForConditionalGeneration", "GlmAsrForConditionalGeneration",
    "GlmOcrForConditionalGeneration", "Granite4VisionForConditionalGeneration", "GraniteSpeechForConditionalGeneration",
    "GraniteSpeechPlusForConditionalGeneration", "H2OVLChatModel", "HfMoondream", "Idefics3ForConditionalGeneration",
    "InternS1ForConditionalGeneration", "InternS1ProForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
    "InternS2PreviewForConditionalGeneration", "InternVLChatModel", "InternVLForConditionalGeneration",
    "IsaacForConditionalGeneration", "KananaVForConditionalGeneration", "KeyeForConditionalGeneration",
    "KeyeVL1_5ForConditionalGeneration", "KimiK25ForConditionalGeneration", "KimiK3ForConditionalGeneration",
    "KimiVLForConditionalGeneration", "Lfm2VlForConditionalGeneration", "LightOnOCRForConditionalGeneration",
    "Llama4ForConditionalGeneration", "Llama_Nemotron_Nano_VL", "LlavaForConditionalGeneration",
    "LlavaNextForConditionalGeneration", "LlavaNextVideoForConditionalGeneration",
    "LlavaOnevision2ForConditionalGeneration", "LlavaOnevisionForConditionalGeneration", "MiDashengLMModel",
    "MiMoV2OmniForCausalLM", "MiniCPMO", "MiniCPMOcrForConditionalGeneration", "MiniCPMV",
    "MiniCPMV4_6ForConditionalGeneration", "MiniCPMV4_7ForConditionalGeneration",
    "MiniMaxM3SparseForConditionalGeneration", "Mistral3ForConditionalGeneration", "Molmo2ForConditionalGeneration",
    "MolmoForCausalLM", "Moondream3ForCausalLM", "MoonshotKimiaForCausalLM", "MossAudioModel",
    "MossTranscribeDiarizeForConditionalGeneration", "MuseGlimmerForConditionalGeneration",
    "MuseSparkForConditionalGeneration", "NVLM_D", "NemotronH_Nano_Omni_Reasoning_V3", "NemotronH_Nano_VL_V2",
    "NemotronH_Omni_Reasoning_V3", "NemotronH_Super_Omni_Reasoning_V3", "NemotronParseForConditionalGeneration",
    "OpenCUAForConditionalGeneration", "OpenPanguVLForConditionalGeneration", "OpenVLAForActionPrediction", "Ovis",
    "Ovis2_5", "Ovis2_6ForCausalLM", "Ovis2_6_MoeForCausalLM", "PaddleOCRVLForConditionalGeneration",
    "PaliGemmaForConditionalGeneration", "Phi3VForCausalLM", "Phi4ForCausalLMV", "Phi4MMForCausalLM",
    "PixtralForConditionalGeneration", "QianfanOCRForConditionalGeneration", "Qwen2AudioForConditionalGeneration",
    "Qwen2VLForConditionalGeneration", "Qwen2_5OmniForConditionalGeneration", "Qwen2_5OmniModel",
    "Qwen2_5_VLForConditionalGeneration", "Qwen3ASRForConditionalGeneration", "Qwen3ASRRealtimeGeneration",
    "Qwen3OmniMoeForConditionalGeneration", "Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration",
    "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
    "RForConditionalGeneration", "RadioMBartPrefixForCausalLM", "SkyworkR1VChatModel", "SmolVLMForConditionalGeneration",
    "Step3VLForConditionalGeneration", "Step3p7ForConditionalGeneration", "Step5ForConditionalGeneration",
    "StepVLForConditionalGeneration", "UltravoxModel", "UnlimitedOCRForCausalLM", "VoxtralForConditionalGeneration",
    "VoxtralRealtimeGeneration", "WhisperForConditionalGeneration",
))
"""vLLM 0.33's native multimodal architectures (``vllm.model_executor.models.registry._MULTIMODAL_MODELS``;
the parity suite checks this copy against the peer's registry)."""

NATIVE_REFUSALS: Mapping[str, str] = {
    "MossTranscribeDiarizeForConditionalGeneration": (
        "vLLM 0.33's native MOSS-Transcribe-Diarize processor reads `audio_feature_lengths` (and "
        "`audio_chunk_mapping`), which the checkpoint's remote-code processor returns (vLLM serves it with "
        "--trust-remote-code), and transformers' MossTranscribeDiarizeProcessor does not (it returns "
        "`input_features_mask`): vLLM itself fails on that processor (KeyError: 'audio_feature_lengths'), so there is "
        "no vLLM layout to send"),
}
"""Native architectures whose inputs mmfront cannot prove equal, and why (vLLM's own frontend fails on
the processor transformers builds for them): the refusal says so rather than "not yet proven"."""


@dataclass(frozen=True)
class ResolvedImpl:
    """The implementation the engine runs, and with it what mmfront sends."""

    impl: Literal["vllm", "transformers"]
    native: NativeInputs | None = None
    device_normalize: bool = False


def folder_architectures(model_dir: str | Path | None) -> tuple[str, ...]:
    """``config.json``'s ``architectures`` (none for a folder without one: no engine can load it)."""
    if model_dir is None:
        return ()
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):
        return ()
    names = config.get("architectures") or ()
    return tuple(n for n in names if isinstance(n, str))


def resolve_model_impl(setting: str, architectures: tuple[str, ...], native: NativeInputs | None,
                       device_normalize: bool | None, *, processor: str, legacy_backend: bool = False) -> ResolvedImpl:
    """vLLM's resolution of ``--model-impl`` for ``architectures``, refusing a native class whose
    inputs mmfront has not proven equal to vLLM's.

    A folder naming no architecture is one no vLLM engine loads; it gets the transformers layout.
    ``legacy_backend``: the Legacy transformers backend serves the folder, which a family may not be
    proven on. ``device_normalize`` ``None`` takes the class's default; ``True`` where the class cannot is
    turned off, as vLLM does (with a warning there).
    """
    arch = next((a for a in architectures if a in VLLM_NATIVE_ARCHITECTURES), None)
    if setting == "transformers" or (setting == "auto" and arch is None):
        return ResolvedImpl("transformers")
    if arch is None:
        raise UnsupportedModelError(
            f"--model-impl vllm: vLLM 0.33 has no native class for {list(architectures) or 'this folder'} "
            f"({processor}); serve it with --model-impl auto or transformers (vLLM's transformers backend).")
    if (native is None or arch not in native.architectures) and arch in NATIVE_REFUSALS:
        raise UnsupportedModelError(
            f"{arch} runs vLLM 0.33's native class with --model-impl {setting}, and mmfront cannot send {processor}'s "
            f"items as that class reads them: {NATIVE_REFUSALS[arch]}. Serve it with --model-impl transformers (vLLM's "
            "transformers backend, which mmfront serves); see docs/vllm-parity.md.")
    if native is None or arch not in native.architectures:
        raise UnsupportedModelError(
            f"{arch} runs vLLM 0.33's native class with --model-impl {setting}, and what mmfront sends for {processor} "
            "is not yet proven equal to what that class reads (keys, field layout, dtype, normalisation): it is refused "
            "rather than sent in a form the engine would misread. Serve it with --model-impl transformers (vLLM's "
            "transformers backend, which mmfront serves); see docs/models.md.")
    if legacy_backend and native.legacy_mismatch:
        raise UnsupportedModelError(
            f"{arch} runs vLLM 0.33's native class with --model-impl {setting}, and the Legacy transformers backend "
            f"(transformers < 5.15) does not send {processor}'s items as that class reads them: {native.legacy_mismatch}. "
            "Install transformers >= 5.15, or serve it with --model-impl transformers.")
    normalize = native.device_normalize if device_normalize is None else device_normalize and native.device_normalize
    return ResolvedImpl("vllm", native, normalize)
