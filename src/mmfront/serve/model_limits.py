"""``--max-model-len`` checked against the model's own limit before anything starts, as vLLM 0.33
checks it when it builds its model config (``vllm/config/model.py``, ``_get_and_verify_max_len``):
a value above the limit the folder's config derives is refused with vLLM's message, unless
``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` is set (then it is a warning, as in vLLM). Without the check the
server would quietly serve the engines' smaller limit.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mmfront.errors import ConfigError

logger = logging.getLogger(__name__)

LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
"""The text config's keys vLLM derives the limit from: the smallest one present wins."""
SCALING_RULES_KEPT = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
"""RoPE types whose ``factor`` vLLM does not multiply in (their positions are already scaled)."""
ALLOW_LONG = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
_WARNING = ("VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative position "
            "encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model uses absolute "
            "position encoding, positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error.")


def derived_max_model_len(text_config: Any) -> tuple[float, str | None]:
    """The model's limit and the key it came from, as vLLM derives it for a generative model from
    the text config (its class defaults included) and the RoPE scaling factor (Gemma 3's is
    already in); ``inf`` when no key says. A float, as vLLM's (its architecture config holds it
    as one), so the refusal prints it as vLLM's does."""
    limit, key = float("inf"), None
    for name in LENGTH_KEYS:
        value = getattr(text_config, name, None)
        if value is not None:
            if value < limit:
                key = name
            limit = min(limit, value)
    if model_max_length := getattr(text_config, "model_max_length", None):
        limit, key = model_max_length, "model_max_length"
    limit = float(limit)
    if limit == float("inf"):
        return limit, key
    rope = _rope_parameters(text_config)
    if rope and "gemma3" not in str(getattr(text_config, "model_type", "")):
        factor: float | None = 1.0
        for parameters in rope:
            if parameters.get("rope_type", parameters.get("type")) not in SCALING_RULES_KEPT:
                factor = parameters.get("factor", factor)
        limit *= 1.0 if factor is None else factor
    return limit, key


def _rope_parameters(text_config: Any) -> list[Mapping[str, Any]]:
    """The RoPE parameter sets (one, or one per layer type), as transformers 5 or 4 spells them."""
    rope = getattr(text_config, "rope_parameters", None) or getattr(text_config, "rope_scaling", None)
    if not isinstance(rope, Mapping):
        return []
    if "rope_type" in rope or "type" in rope:
        return [rope]
    return [value for value in rope.values() if isinstance(value, Mapping)]


def check_max_model_len(max_model_len: int | None, model: Path, *, trust_remote_code: bool = False,
                        env: Mapping[str, str] = os.environ) -> None:
    """Refuse ``max_model_len`` above the limit the model folder derives (vLLM's
    ``ValueError``, word for word), or warn when ``VLLM_ALLOW_LONG_MAX_MODEL_LEN`` allows it."""
    if max_model_len is None or max_model_len == -1:
        return
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(model), local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        raise ConfigError(f"Could not read the model config from {str(model)!r} to check --max-model-len: {e}") from e
    text_config = config.get_text_config()
    limit, key = derived_max_model_len(text_config)
    if max_model_len <= limit:
        return
    model_max_length = getattr(text_config, "model_max_length", None)
    if model_max_length is not None and max_model_len <= model_max_length:
        return
    message = (f"User-specified max_model_len ({max_model_len}) is greater than the derived max_model_len "
               f"({key}={limit} or model_max_length={model_max_length} in model's config.json).")
    if bool(int(env.get(ALLOW_LONG, "0"))):
        logger.warning("%s %s", message, _WARNING)
        return
    raise ConfigError(f"{message} To allow overriding this maximum, set the env var {ALLOW_LONG}=1. {_WARNING}")


__all__ = ["ALLOW_LONG", "LENGTH_KEYS", "check_max_model_len", "derived_max_model_len"]
