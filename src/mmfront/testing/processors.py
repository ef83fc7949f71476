"""Tiny, fully offline instances of real HuggingFace multimodal processors.

Real processor classes of the models the transformers backend serves (``Idefics3Processor``,
``Emu3Processor``, ``Qwen2AudioProcessor``, ``GlmAsrProcessor``) with small image/audio sizes and a
locally built, deterministic byte-level BPE tokenizer, so tests exercise the exact code paths users
hit without any model hub. A model with a native processor declares its builders in its own module
(``mmfront.models.gemma3.make_gemma3_processor``). Ported from ``shared/reference/tiny_processors.py``.

Offsets (``text_replacement_offsets``): Gemma3/Emu3 report them from transformers 5.15.0,
Qwen2-Audio from 5.16.0, Idefics3 and GlmAsr already in 5.14.1 (there only via ``text_kwargs``,
see :func:`offsets_kwargs`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import transformers
from packaging.version import Version
from transformers import (
    Emu3ImageProcessor,
    Emu3Processor,
    GlmAsrProcessor,
    Idefics3Processor,
    PreTrainedTokenizerFast,
    Qwen2AudioProcessor,
    WhisperFeatureExtractor,
)
from transformers.utils import logging as hf_logging

from mmfront.fixtures.bpe import make_tokenizer
from mmfront.fixtures.processors import ImageBackend, image_processor_class
from mmfront.testing.media import make_audio, make_image

__all__ = [
    "EMU3_CHAT_TEMPLATE",
    "GLMASR_CHAT_TEMPLATE",
    "HAS_OFFSETS_API",
    "IDEFICS3_CHAT_TEMPLATE",
    "IDEFICS3_ROW_COL_TOKENS",
    "TF_VERSION",
    "expand_text",
    "make_audio",
    "make_emu3_processor",
    "make_emu3_tokenizer",
    "make_glmasr_processor",
    "make_glmasr_tokenizer",
    "make_idefics3_processor",
    "make_idefics3_tokenizer",
    "make_image",
    "make_qwen2_audio_processor",
    "make_qwen2_audio_tokenizer",
    "make_tokenizer",
    "offsets_kwargs",
    "spans_in_tokens",
    "token_runs",
]

# The builders exercise deprecated paths on purpose (5.14.1 Gemma3 image_token, Whisper sampling
# rate); their warnings would bury real test output.
hf_logging.set_verbosity_error()

TF_VERSION = Version(transformers.__version__)
#: transformers >= 5.15: Gemma3/Emu3 (and Qwen2-Audio from 5.16) go through the replacement hooks,
#: and ``return_text_replacement_offsets`` is a declared kwarg (flat kwarg works)
HAS_OFFSETS_API = Version("5.15.0") <= TF_VERSION

# --------------------------------------------------------------------------------------
# Idefics3 (SmolVLM-style tokens and template)
# --------------------------------------------------------------------------------------

IDEFICS3_CHAT_TEMPLATE = (
    "<|im_start|>"
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for line in message['content'] %}"
    "{% if line['type'] == 'text' %}{{ line['text'] }}"
    "{% elif line['type'] == 'image' %}{{ '<image>' }}{% endif %}"
    "{% endfor %}"
    "<end_of_utterance>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)

IDEFICS3_ROW_COL_TOKENS = [f"<row_{i + 1}_col_{j + 1}>" for i in range(6) for j in range(6)]


def make_idefics3_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<|im_start|>", "<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>", *IDEFICS3_ROW_COL_TOKENS],
        bos_token="<|im_start|>",
        eos_token="<end_of_utterance>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
        add_bos=False,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )


def make_idefics3_processor(
    patch_size: int = 32, max_splits_per_side: int = 2, image_seq_len: int = 4, backend: ImageBackend = "pil"
) -> Idefics3Processor:
    """Idefics3Processor: real Idefics3 uses 364px patches, size longest_edge 4*364 and
    image_seq_len=169 (SmolVLM: 512 / 2048 / 64).

    Images are split into up to ``max_splits_per_side`` x ``max_splits_per_side`` tiles of
    ``patch_size`` plus one global tile. ``pixel_values`` is 5-D
    ``[num_prompts, max_tiles_in_any_prompt, 3, patch_size, patch_size]`` (zero-padded across
    prompts), ``pixel_attention_mask`` is ``[num_prompts, max_tiles, patch_size, patch_size]``.
    """
    cls = image_processor_class("idefics3", "Idefics3ImageProcessor", backend)
    image_processor = cls(
        size={"longest_edge": patch_size * max_splits_per_side},
        max_image_size={"longest_edge": patch_size},
        do_image_splitting=True,
    )
    return Idefics3Processor(
        image_processor=image_processor,
        tokenizer=make_idefics3_tokenizer(),
        image_seq_len=image_seq_len,
        chat_template=IDEFICS3_CHAT_TEMPLATE,
    )


# --------------------------------------------------------------------------------------
# Emu3
# --------------------------------------------------------------------------------------

EMU3_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] + ' ' }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' ' }}{% endfor %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)


def make_emu3_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<image>", "<|image start|>", "<|image end|>", "<|image token|>", "<|extra_201|>"],
        bos_token="<|extra_203|>",
        eos_token="<|extra_204|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "image_token": "<image>",
            "boi_token": "<|image start|>",
            "eoi_token": "<|image end|>",
            "image_wrapper_token": "<|image token|>",
            "eof_token": "<|extra_201|>",
        },
        add_bos=False,  # Emu3's GPT-style tokenizer adds no BOS; the processor does (5.23: once per sample)
        chat_template=EMU3_CHAT_TEMPLATE,
    )


def make_emu3_processor(min_pixels: int = 16 * 16, max_pixels: int = 64 * 64, spatial_factor: int = 8) -> Emu3Processor:
    """Emu3Processor: real values are min_pixels=512*512, max_pixels=1024*1024.

    The processor hard-codes ``downsample_ratio = 8``; an image resized (smart_resize, multiple
    of ``spatial_factor``) to HxW becomes ``<|image start|>{h}*{w}<|image token|>`` +
    ``<image> * h*(w+1)`` + ``<|extra_201|><|image end|>`` with h=H//8, w=W//8.
    ``pixel_values`` of several images are zero-padded (bottom/right) to the largest H and W;
    ``image_sizes`` holds each image's own resized (H, W).
    """
    image_processor = Emu3ImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels, spatial_factor=spatial_factor)
    return Emu3Processor(image_processor=image_processor, tokenizer=make_emu3_tokenizer(), chat_template=EMU3_CHAT_TEMPLATE)


# --------------------------------------------------------------------------------------
# Audio: Qwen2-Audio (replace_audio_token hook from 5.16) and GLM-ASR (hook since 5.14.1)
# --------------------------------------------------------------------------------------


def _whisper_feature_extractor(feature_size: int, chunk_length: int, sampling_rate: int) -> WhisperFeatureExtractor:
    return WhisperFeatureExtractor(
        feature_size=feature_size, sampling_rate=sampling_rate, hop_length=160, chunk_length=chunk_length, n_fft=400
    )


def make_qwen2_audio_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>"],
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "audio_token": "<|AUDIO|>",
            "audio_bos_token": "<|audio_bos|>",
            "audio_eos_token": "<|audio_eos|>",
        },
        add_bos=False,
    )


def make_qwen2_audio_processor(feature_size: int = 16, chunk_length: int = 2, sampling_rate: int = 16000) -> Qwen2AudioProcessor:
    """Qwen2AudioProcessor: real WhisperFeatureExtractor has feature_size=128, chunk_length=30.

    The processor forces ``padding="max_length"``, so ``input_features`` is always
    ``[num_audios, feature_size, chunk_length * sampling_rate // hop_length]`` whatever the
    audio length; ``feature_attention_mask`` ``[num_audios, frames]`` marks the real frames.
    An audio of L frames expands to ``(((L - 1) // 2 + 1) - 2) // 2 + 1`` ``<|AUDIO|>`` tokens.
    The processor's built-in default chat template is kept.
    """
    return Qwen2AudioProcessor(
        feature_extractor=_whisper_feature_extractor(feature_size, chunk_length, sampling_rate),
        tokenizer=make_qwen2_audio_tokenizer(),
    )


#: The chat template GLM-ASR-Nano-2512 ships (transformers' conversion script writes it into the
#: processor): parts are walked by the ``to_text`` macro, and an audio part opens a new user turn.
GLMASR_CHAT_TEMPLATE = (
    "{%- macro to_text(content) -%}\n"
    "{%- if content is string -%}\n"
    "{{- content -}}\n"
    "{%- elif content is iterable and content is not mapping -%}\n"
    "{%- for item in content -%}\n"
    "{%- if item is mapping and item.type == 'text' and item.text is defined -%}\n"
    "{{- item.text -}}\n"
    "{%- elif item is mapping and (item.type == 'audio' or 'audio' in item) -%}\n"
    "<|begin_of_audio|><|pad|><|end_of_audio|><|user|>\n"
    "{% elif item is string -%}\n"
    "{{- item -}}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- else -%}\n"
    "{{- content -}}\n"
    "{%- endif -%}\n"
    "{%- endmacro -%}\n"
    "{%- for m in messages -%}\n"
    "{%- if m.role == 'system' -%}\n"
    "<|system|>\n"
    "{{ to_text(m.content) | trim }}\n"
    "{%- elif m.role == 'user' -%}\n"
    "<|user|>\n"
    "{{ to_text(m.content) | trim }}\n"
    "{%- elif m.role == 'assistant' -%}\n"
    "<|assistant|>\n"
    "{{ to_text(m.content) | trim }}\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "<|assistant|>\n"
    "{% endif -%}"
)


def make_glmasr_tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer(
        ["<|user|>", "<|assistant|>", "<|begin_of_audio|>", "<|end_of_audio|>", "<|pad|>", "<|system|>"],
        bos_token=None,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        add_bos=False,
    )


def make_glmasr_processor(feature_size: int = 16, chunk_length: int = 2, sampling_rate: int = 16000) -> GlmAsrProcessor:
    """GlmAsrProcessor: the WhisperFeatureExtractor-based audio processor that has a
    ``replace_audio_token`` hook in *every* version checked (5.14.1, 5.15.0, 5.23.0), so it reports
    offsets even on 5.14.1 (via ``text_kwargs``). Limits: one audio per text sample (``len(text) ==
    len(audio)``), ``return_tensors`` must be "pt" (the default), text is left-padded.
    Each audio is cut into ``chunk_length``-second windows, each padded to ``chunk_length`` seconds;
    1.0 s expands to 12 ``<|pad|>`` tokens, 3.0 s to 37.
    Real values: feature_size=128, chunk_length=30, audio_token="<|pad|>". The chat template is the
    real one (:data:`GLMASR_CHAT_TEMPLATE`).
    """
    return GlmAsrProcessor(
        feature_extractor=_whisper_feature_extractor(feature_size, chunk_length, sampling_rate),
        tokenizer=make_glmasr_tokenizer(),
        audio_token="<|pad|>",
        chat_template=GLMASR_CHAT_TEMPLATE,
    )


# --------------------------------------------------------------------------------------
# Reading processor outputs
# --------------------------------------------------------------------------------------


def offsets_kwargs() -> dict[str, Any]:
    """How to ask for ``text_replacement_offsets`` on this transformers version.

    5.15+ (5.23 checked): a top-level processor kwarg (``ProcessingKwargs.return_text_replacement_offsets``;
    the old ``text_kwargs`` spelling still works until 5.29). 5.14.1: it is *not* a declared
    TextKwargs key, so the flat kwarg is dropped with a warning; only
    ``text_kwargs={"return_text_replacement_offsets": True}`` reaches ``__call__`` -- and only
    processors that use ProcessorMixin.__call__ (or Idefics3) honour it.
    """
    if HAS_OFFSETS_API:
        return {"return_text_replacement_offsets": True}
    return {"text_kwargs": {"return_text_replacement_offsets": True}}


def expand_text(text: str, offsets_for_sample: list[dict[str, Any]]) -> str:
    """Rebuild the expanded prompt from the unexpanded one and its reported offsets
    (``span`` indexes ``text``; replacements are applied left to right)."""
    parts: list[str] = []
    last = 0
    for entry in offsets_for_sample:
        start, end = entry["span"]
        parts += [text[last:start], entry["replacement"]]
        last = end
    parts.append(text[last:])
    return "".join(parts)


def token_runs(mask: Any) -> list[tuple[int, int]]:
    """``[start, end)`` runs of non-zero entries (for mm_token_type_ids / token_type_ids /
    ``input_ids == token_id``) -- the transformers<5.15 way of locating placeholders."""
    m = np.asarray(mask).astype(bool).astype(np.int8)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], m, [0]])))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def spans_in_tokens(
    tokenizer: PreTrainedTokenizerFast, expanded_text: str, offsets_for_sample: list[dict[str, Any]], **tok_kwargs: Any
) -> list[tuple[str, int, int]]:
    """Map each reported ``new_span`` (char offsets in the expanded text) to a token range
    ``[start, end)`` with the fast tokenizer's ``char_to_token`` (what Idefics3 does internally).
    The returned BatchFeature has no ``char_to_token``, so the expanded text is re-tokenized."""
    enc = tokenizer(expanded_text, **tok_kwargs)
    out: list[tuple[str, int, int]] = []
    for entry in offsets_for_sample:
        start, end = entry["new_span"]
        out.append((entry["type"], enc.char_to_token(start), enc.char_to_token(end - 1) + 1))
    return out
