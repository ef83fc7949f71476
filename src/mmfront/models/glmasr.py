"""GLM-ASR: served by the transformers backend (its ``replace_audio_token`` hook, in every
version checked). This module declares its offline ``glmasr`` fixture."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mmfront.fixtures.bpe import make_tokenizer
from mmfront.fixtures.kinds import ModelKind
from mmfront.fixtures.processors import whisper_feature_extractor
from mmfront.models.catalog import register_model
from mmfront.models.spec import ModelSpec

if TYPE_CHECKING:
    from transformers import GlmAsrProcessor, PreTrainedTokenizerFast

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
    from transformers import GlmAsrProcessor

    return GlmAsrProcessor(
        feature_extractor=whisper_feature_extractor(feature_size, chunk_length, sampling_rate),
        tokenizer=make_glmasr_tokenizer(),
        audio_token="<|pad|>",
        chat_template=GLMASR_CHAT_TEMPLATE,
    )


GLMASR = register_model(ModelSpec(
    model_type="glmasr",
    hf_processor_class="GlmAsrProcessor",
    fixtures={"glmasr": ModelKind("glmasr", "GlmAsrForConditionalGeneration", "float32", make_glmasr_processor,
                                  ("feature_size", "chunk_length", "sampling_rate"))},
))
