"""The messages between the frontend (P0) and the engine (P1), as msgspec structs.

Field order and encoding follow vLLM 0.33 (``EngineCoreRequest`` is an array-like struct encoded
positionally; msgspec writes every field, and decoders ignore trailing fields they do not know), so
a stock vLLM engine core decodes what mmfront sends.
"""

from __future__ import annotations

from typing import Any

import msgspec
import torch

from mmfront.inputs import MultiModalFeatureSpec


class SamplingParams(msgspec.Struct, omit_defaults=True, dict=True):
    """The common generation parameters, under vLLM's names (encoded as a map, defaults omitted)."""

    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None


class LoRARequest(msgspec.Struct, omit_defaults=True, array_like=True):
    lora_name: str
    lora_int_id: int
    lora_path: str = ""


class EngineCoreRequest(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One request to the engine. ``mm_features`` are sorted by placeholder offset; a feature's
    ``data`` is ``None`` when the engine-side cache already holds the item."""

    request_id: str
    prompt_token_ids: list[int] | None
    mm_features: list[MultiModalFeatureSpec] | None
    sampling_params: SamplingParams | None
    pooling_params: dict[str, Any] | None
    arrival_time: float
    lora_request: LoRARequest | None
    cache_salt: str | None
    data_parallel_rank: int | None
    prompt_embeds: torch.Tensor | None = None
    prompt_is_token_ids: list[bool] | None = None
    client_index: int = 0
    current_wave: int = 0
    priority: int = 0
    trace_headers: dict[str, str] | None = None
    resumable: bool = False
    external_req_id: str | None = None
