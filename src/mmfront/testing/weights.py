"""Random-weight models of the real HF architectures, next to the offline processors.

:func:`write_weights` turns a processor folder of :mod:`mmfront.testing.models` into a model
folder that ``from_pretrained(folder)`` loads offline: the full ``config.json`` of the HF config
class its kind declares (``ModelKind.weights_config``: token ids read from the folder's own
tokenizer, ``vocab_size == len(tokenizer)``), a ``generation_config.json`` and
``model.safetensors``. Every tower is real (SigLIP for Gemma 3 and Idefics3, the Whisper-style
encoder of Qwen2-Audio) but one or two layers of width 32
(:data:`~mmfront.fixtures.kinds.TEXT_TOWER`), so a forward pass costs milliseconds on a CPU and
the weights of a given seed are the same on every machine and transformers version that builds
them.

Why these choices:

* ``float32`` by default (Gemma 3 ships ``bfloat16``): the processor then emits float32 pixels
  too, and a reference engine can be compared with ``model.generate`` within float tolerance.
* The text towers are initialised with a wide spread (``initializer_range`` 0.5) and untied
  embeddings, and weights HF initialises to zero (Gemma 3's multimodal projection) are drawn
  at random: with HF's defaults a random model repeats one token and ignores its images, and an
  equality test against it would prove nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from mmfront.errors import ConfigError
from mmfront.fixtures.catalog import fixture_kinds

if TYPE_CHECKING:
    from transformers import PreTrainedModel, ProcessorMixin

__all__ = ["DTYPES", "SEED", "weight_kinds", "write_weights"]

#: The seed every folder's weights are drawn from.
SEED = 0

#: dtypes a folder may declare (``config.json``'s ``dtype``).
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def weight_kinds() -> tuple[str, ...]:
    """Every kind :func:`write_weights` builds: those that declare a ``weights_config``."""
    return tuple(name for name, kind in fixture_kinds().items() if kind.weights_config is not None)


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

    spec = fixture_kinds().get(kind)
    if spec is None or spec.weights_config is None:
        raise ConfigError(f"no weights for model kind {kind!r}: pass one of {list(weight_kinds())}")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    config = spec.weights_config(processor)
    tok = processor.tokenizer
    eos = [tok.eos_token_id, *(tok.convert_tokens_to_ids(t) for t in spec.stop_tokens)]
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model_class: type[PreTrainedModel] = getattr(transformers, spec.architecture)
    model = model_class(config)
    _draw_zero_weights(model, generator)
    model.generation_config = transformers.GenerationConfig(
        eos_token_id=eos, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id)
    torch.nn.Module.to(model, DTYPES[dtype])
    model.config.dtype = dtype
    model.save_pretrained(str(folder))
    return Path(folder)

