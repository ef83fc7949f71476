"""Random-weight models of the real HF architectures, next to the offline processors.

:func:`write_weights` turns a processor folder of :mod:`mmfront.testing.models` into a model
folder that ``from_pretrained(folder)`` loads offline: the full ``config.json`` of the HF config
class (token ids read from the folder's own tokenizer, ``vocab_size == len(tokenizer)``), a
``generation_config.json`` and ``model.safetensors``. Every tower is real (SigLIP for Gemma 3
and Idefics3, the Whisper-style encoder of Qwen2-Audio) but one or two layers of width 32, so a
forward pass costs milliseconds on a CPU and the weights of a given seed are the same on every
machine and transformers version that builds them.

Why these choices:

* ``float32`` by default (Gemma 3 ships ``bfloat16``): the processor then emits float32 pixels
  too, and a reference engine can be compared with ``model.generate`` within float tolerance.
* The text towers are initialised with a wide spread (``initializer_range`` 0.5) and untied
  embeddings, and weights HF initialises to zero (Gemma 3's multimodal projection) are drawn
  at random: with HF's defaults a random model repeats one token and ignores its images, and an
  equality test against it would prove nothing. ``gemma3-896`` ties its embeddings instead: a
  262145-token vocabulary is what makes that model large.
* Gemma 3 mixes a sliding-window layer (window 16, shorter than a prompt) with a global one, and
  its SigLIP patches are pooled 2x2 by the projector into ``image_seq_length`` tokens, as the
  real model pools 64x64 patches into 256.

Emu3 is not built: its image "encoder" is a VQ-VAE tokenizer whose codes become ordinary
prompt tokens, not embeddings scattered into placeholder positions.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from mmfront.errors import ConfigError
from mmfront.testing.models import KINDS

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, ProcessorMixin

__all__ = ["DTYPES", "SEED", "WEIGHT_KINDS", "write_weights"]

#: The seed every folder's weights are drawn from.
SEED = 0

#: dtypes a folder may declare (``config.json``'s ``dtype``).
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_TEXT = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
    "max_position_embeddings": 4096,
    "initializer_range": 0.5,
}
_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}


def _token_ids(tokenizer: Any) -> dict[str, Any]:
    return {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id}


def _gemma3(processor: Any, *, tie: bool) -> PretrainedConfig:
    from transformers import Gemma3Config

    tok = processor.tokenizer
    image_size = processor.image_processor.size["height"]
    side = math.isqrt(processor.image_seq_length)
    if side * side != processor.image_seq_length or image_size % (2 * side):
        raise ConfigError(
            f"Gemma 3 weights need image_seq_length a square number (got {processor.image_seq_length}) and "
            f"image_size divisible by twice its root (got {image_size}): the projector pools 2x2 patches.")
    return Gemma3Config(
        text_config={**_TEXT, **_token_ids(tok), "vocab_size": len(tok), "sliding_window": 16,
                     "layer_types": ["sliding_attention", "full_attention"], "tie_word_embeddings": tie},
        vision_config={**_VISION, "image_size": image_size, "patch_size": image_size // (2 * side)},
        mm_tokens_per_image=processor.image_seq_length,
        boi_token_index=tok.boi_token_id,
        eoi_token_index=tok.eoi_token_id,
        image_token_index=tok.image_token_id,
        tie_word_embeddings=tie,
    )


def _idefics3(processor: Any) -> PretrainedConfig:
    from transformers import Idefics3Config

    tok = processor.tokenizer
    tile = processor.image_processor.max_image_size["longest_edge"]
    scale = 2
    side = math.isqrt(processor.image_seq_len)
    if side * side != processor.image_seq_len or tile % (scale * side):
        raise ConfigError(
            f"Idefics3 weights need image_seq_len a square number (got {processor.image_seq_len}) and a tile size "
            f"divisible by {scale} times its root (got {tile}).")
    return Idefics3Config(
        vision_config={**_VISION, "image_size": tile, "patch_size": tile // (scale * side)},
        text_config={**_TEXT, **_token_ids(tok), "model_type": "llama", "vocab_size": len(tok),
                     "tie_word_embeddings": False},
        scale_factor=scale,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        # a keyword the config takes through **kwargs: its default 128002 lies outside the vocabulary
        **{"pad_token_id": tok.pad_token_id},
        tie_word_embeddings=False,
    )


def _qwen2_audio(processor: Any) -> PretrainedConfig:
    from transformers import Qwen2AudioConfig

    tok = processor.tokenizer
    extractor = processor.feature_extractor
    return Qwen2AudioConfig(
        audio_config={"d_model": 32, "encoder_layers": 1, "encoder_attention_heads": 2, "encoder_ffn_dim": 64,
                      "num_mel_bins": extractor.feature_size, "max_source_positions": extractor.nb_max_frames // 2},
        text_config={**_TEXT, **_token_ids(tok), "model_type": "qwen2", "vocab_size": len(tok),
                     "tie_word_embeddings": False},
        audio_token_index=tok.convert_tokens_to_ids("<|AUDIO|>"),
    )


#: kind -> (its config from the processor, the stop tokens its chat template ends a turn with)
_CONFIGS: dict[str, tuple[Callable[[Any], PretrainedConfig], tuple[str, ...]]] = {
    "gemma3": (lambda p: _gemma3(p, tie=False), ("<end_of_turn>",)),
    "gemma3-896": (lambda p: _gemma3(p, tie=True), ("<end_of_turn>",)),
    "idefics3": (_idefics3, ()),
    "qwen2_audio": (_qwen2_audio, ("<|im_end|>",)),
}

#: Every kind :func:`write_weights` builds.
WEIGHT_KINDS = tuple(_CONFIGS)


def _draw_zero_weights(model: PreTrainedModel, generator: torch.Generator) -> None:
    """Weights HF initialises to zero (a multimodal projection) would cut the tower off."""
    with torch.no_grad():
        for param in model.parameters():
            if param.ndim >= 2 and not param.any():
                param.normal_(0.0, 0.5, generator=generator)


def write_weights(kind: str, processor: ProcessorMixin, folder: Path, *, dtype: str = "float32",
                  seed: int = SEED) -> Path:
    """Save a random-weight model of ``kind``'s architecture, consistent with ``processor``,
    into ``folder`` (which already holds the processor); returns ``folder``."""
    import transformers

    entry = _CONFIGS.get(kind)
    if entry is None:
        raise ConfigError(f"no weights for model kind {kind!r}: pass one of {list(WEIGHT_KINDS)}")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    make_config, stop_tokens = entry
    config = make_config(processor)
    tok = processor.tokenizer
    eos = [tok.eos_token_id, *(tok.convert_tokens_to_ids(t) for t in stop_tokens)]
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model_class: type[PreTrainedModel] = getattr(transformers, KINDS[kind].architecture)
    model = model_class(config)
    _draw_zero_weights(model, generator)
    model.generation_config = transformers.GenerationConfig(
        eos_token_id=eos, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    torch.nn.Module.to(model, DTYPES[dtype])
    model.config.dtype = dtype
    model.save_pretrained(str(folder))
    return Path(folder)

