"""ModelRunner's engine behaviour on the tiny Gemma 3: admission checks, stop rules, aborts, the
encoder cache, the scatter into placeholder positions and per-request errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
from runner_cases import Family, audio_item, image_item, run

from mmfront.engine.runner import ModelRunner, scatter_mm_embeddings
from mmfront.errors import ConfigError, PromptUpdateError, UnsupportedModelError, ValidationError
from mmfront.inputs import MultiModalFeatureSpec, MultiModalFieldElem, PlaceholderRange
from mmfront.wire import EngineCoreRequest, SamplingParams
from mmfront.wire.structs import FinishReason

# at the processor's size, so mmfront's pixels equal the HF reference's (see test_runner_equality)
IMAGE = image_item(32, 32, 0)
OTHER = image_item(32, 32, 1)


@pytest.fixture(scope="module")
def gemma3(gemma3_weights_dir: Path) -> Family:
    return Family("gemma3", gemma3_weights_dir, "images")


@pytest.fixture(scope="module")
def greedy(gemma3: Family) -> list[int]:
    """The greedy tokens of the one-image conversation: twelve, none of them the model's EOS
    (the stop-rule tests rely on that), and not all the same."""
    tokens = gemma3.reference([[IMAGE]], max_tokens=12)[1]
    assert len(tokens) == 12 and len(set(tokens)) > 3
    return tokens


@pytest.fixture
def runner(gemma3: Family) -> ModelRunner:
    return ModelRunner(gemma3.folder)


def _feature(offset: int, length: int, is_embed: list[bool] | None = None) -> MultiModalFeatureSpec:
    mask = None if is_embed is None else torch.tensor(is_embed)
    return MultiModalFeatureSpec(None, "image", "img", PlaceholderRange(offset, length, mask))


# --- scatter ------------------------------------------------------------------------------------


def test_scatter_writes_rows_at_the_embedding_positions_only() -> None:
    embeds = torch.zeros(8, 2)
    rows = torch.tensor([[1.0, 1.0], [2.0, 2.0]])
    is_mm = scatter_mm_embeddings(embeds, [_feature(2, 4, [False, True, False, True])], [rows])
    assert is_mm.tolist() == [False, False, False, True, False, True, False, False]
    assert embeds[:, 0].tolist() == [0, 0, 0, 1, 0, 2, 0, 0]


def test_scatter_without_a_mask_fills_the_whole_range() -> None:
    embeds = torch.zeros(5, 1)
    scatter_mm_embeddings(embeds, [_feature(1, 3)], [torch.tensor([[7.0], [8.0], [9.0]])])
    assert embeds[:, 0].tolist() == [0, 7, 8, 9, 0]


def test_scatter_refuses_a_count_mismatch() -> None:
    with pytest.raises(PromptUpdateError, match="has 2 embedding positions but its encoder output has 3 rows") as err:
        scatter_mm_embeddings(torch.zeros(8, 1), [_feature(0, 3, [True, False, True])], [torch.zeros(3, 1)])
    assert (err.value.parameter, err.value.expected, err.value.found) == ("image", 3, 2)


def test_scatter_refuses_a_range_outside_the_prompt() -> None:
    with pytest.raises(PromptUpdateError, match=r"spans \[6, 10\), outside the prompt of 8 tokens"):
        scatter_mm_embeddings(torch.zeros(8, 1), [_feature(6, 4)], [torch.zeros(4, 1)])


# --- admission ----------------------------------------------------------------------------------


def _plain(rid: str, prompt: list[int] | None, **params: Any) -> EngineCoreRequest:
    sampling = SamplingParams(**params) if params else SamplingParams(max_tokens=2)
    return EngineCoreRequest(rid, prompt, None, sampling, None, 0.0, None, None, None)


@pytest.mark.parametrize(("prompt", "parameter", "message"), [
    ([], "prompt_token_ids", "no prompt_token_ids"),
    (None, "prompt_token_ids", "no prompt_token_ids"),
    ([1, 534], "prompt_token_ids", "outside the model's vocabulary of 534"),
    ([-1], "prompt_token_ids", "outside the model's vocabulary"),
    ([1] * 4096, "prompt_token_ids", "leaves no room in the model's 4096 positions"),
])
def test_add_refuses_bad_prompts(runner: ModelRunner, prompt: list[int] | None, parameter: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as err:
        runner.add(_plain("r", prompt))
    assert err.value.parameter == parameter
    assert not runner.has_unfinished_requests


def test_add_refuses_a_running_request_id_and_a_request_without_sampling_params(runner: ModelRunner) -> None:
    runner.add(_plain("r", [2, 3]))
    with pytest.raises(ValidationError, match="already running") as err:
        runner.add(_plain("r", [2, 3]))
    assert err.value.parameter == "request_id"
    with pytest.raises(ValidationError) as err:
        runner.add(EngineCoreRequest("s", [2, 3], None, None, None, 0.0, None, None, None))
    assert err.value.parameter == "sampling_params"


def test_a_text_only_request_generates_max_tokens(runner: ModelRunner) -> None:
    tokens, last = run(runner, [_plain("t", [2, 3, 4, 5], max_tokens=3, ignore_eos=True)])["t"]
    assert len(tokens) == 3
    assert (last.finish_reason, last.stop_reason) == (FinishReason.LENGTH, None)


# --- stop rules -----------------------------------------------------------------------------------


def test_each_step_streams_one_token_and_the_last_says_length(runner: ModelRunner, gemma3: Family,
                                                              greedy: list[int]) -> None:
    runner.add(gemma3.request("r", [[IMAGE]], max_tokens=3, ignore_eos=True))
    outputs = [runner.step() for _ in range(3)]
    assert [[(o.request_id, o.new_token_ids, o.finish_reason) for o in step] for step in outputs] == [
        [("r", [greedy[0]], None)], [("r", [greedy[1]], None)], [("r", [greedy[2]], FinishReason.LENGTH)]]
    assert runner.step() == []


def test_stop_token_ids_stop_with_the_token_as_stop_reason(runner: ModelRunner, gemma3: Family,
                                                           greedy: list[int]) -> None:
    stop = greedy[2]
    cut = greedy.index(stop) + 1
    tokens, last = run(runner, [gemma3.request("r", [[IMAGE]], max_tokens=12, stop_token_ids=[stop])])["r"]
    assert tokens == greedy[:cut]
    assert (last.finish_reason, last.stop_reason) == (FinishReason.STOP, stop)


def test_eos_stops_unless_ignored_and_not_before_min_tokens(runner: ModelRunner, gemma3: Family,
                                                            greedy: list[int]) -> None:
    eos = greedy[1]
    runner.eos_token_ids = frozenset({eos})
    first = greedy.index(eos) + 1
    tokens, last = run(runner, [gemma3.request("eos", [[IMAGE]], max_tokens=12)])["eos"]
    assert (tokens, last.finish_reason, last.stop_reason) == (greedy[:first], FinishReason.STOP, None)

    tokens, last = run(runner, [gemma3.request("ignored", [[IMAGE]], max_tokens=12, ignore_eos=True)])["ignored"]
    assert (tokens, last.finish_reason) == (greedy, FinishReason.LENGTH)

    # before min_tokens the EOS is masked (vLLM's MinTokensLogitsProcessor): the runner-up is taken there
    tokens, last = run(runner, [gemma3.request("min", [[IMAGE]], max_tokens=12, min_tokens=first + 2)])["min"]
    assert tokens[:first - 1] == greedy[:first - 1] and eos not in tokens[:first + 2]
    assert last.finish_reason == (FinishReason.STOP if tokens[-1] == eos else FinishReason.LENGTH)
    assert len(tokens) == 12 or tokens[-1] == eos


def test_abort_drops_a_request_between_steps(runner: ModelRunner, gemma3: Family, greedy: list[int]) -> None:
    runner.add(gemma3.request("gone", [[IMAGE]], max_tokens=6))
    runner.add(gemma3.request("kept", [[IMAGE]], max_tokens=2, ignore_eos=True))
    assert [o.request_id for o in runner.step()] == ["gone", "kept"]
    assert runner.abort("gone") is True
    assert runner.abort("gone") is False
    assert runner.abort("never-sent") is False
    assert [(o.request_id, o.new_token_ids) for o in runner.step()] == [("kept", [greedy[1]])]
    assert not runner.has_unfinished_requests


# --- the encoder cache ----------------------------------------------------------------------------


def test_an_item_is_encoded_once_and_then_served_from_the_encoder_cache(runner: ModelRunner, gemma3: Family,
                                                                         greedy: list[int]) -> None:
    both = gemma3.request("both", [[IMAGE, OTHER]])
    assert runner.encoder_cache_stats().total == 0
    run(runner, [both])
    assert (runner.encoder_cache_stats().hits, runner.encoder_cache_stats().total) == (0, 2)

    again = gemma3.request("again", [[IMAGE]], max_tokens=12)
    for feature in again.mm_features or []:
        feature.data = None  # the encoder cache holds it: the data is not needed
    tokens, _ = run(runner, [again])["again"]
    assert tokens == greedy
    assert (runner.encoder_cache_stats().hits, runner.encoder_cache_stats().total) == (1, 3)


def test_an_encoder_cache_too_small_for_an_item_still_serves_it(gemma3: Family, greedy: list[int]) -> None:
    runner = ModelRunner(gemma3.folder, encoder_cache_bytes=16)
    tokens, _ = run(runner, [gemma3.request("r", [[IMAGE]], max_tokens=12)])["r"]
    assert tokens == greedy
    run(runner, [gemma3.request("s", [[IMAGE]])])
    assert runner.encoder_cache_stats().hits == 0


def test_the_same_item_twice_in_one_batch_is_encoded_once(runner: ModelRunner, gemma3: Family) -> None:
    features = [*(gemma3.request("a", [[IMAGE]]).mm_features or []), *(gemma3.request("b", [[IMAGE]]).mm_features or [])]
    assert len(features) == 2 and features[0].identifier == features[1].identifier
    encoded = runner.encode(features)
    assert list(encoded) == [features[0].identifier]
    assert encoded[features[0].identifier].shape == (16, 32)
    assert runner.encoder_cache_stats().total == 1


# --- per-request errors -------------------------------------------------------------------------


def test_a_request_whose_items_do_not_fit_fails_alone(runner: ModelRunner, gemma3: Family, greedy: list[int]) -> None:
    bad = gemma3.request("bad", [[IMAGE]])
    feature = (bad.mm_features or [])[0]
    assert feature.mm_position.is_embed is not None
    feature.mm_position = replace(feature.mm_position, is_embed=torch.zeros_like(feature.mm_position.is_embed))
    good = gemma3.request("good", [[IMAGE]], max_tokens=12)
    got = run(runner, [bad, good])
    tokens, last = got["bad"]
    assert (tokens, last.finish_reason) == ([], FinishReason.ERROR)
    assert last.error is not None and last.error.code == "PromptUpdateError"
    assert "has 0 embedding positions but its encoder output has 16 rows" in last.error.message
    assert got["good"][0] == greedy


def test_items_the_encoder_cannot_take_fail_their_request_alone(runner: ModelRunner, gemma3: Family,
                                                               greedy: list[int]) -> None:
    """A 16 px image where the tower takes 32 px: the batch fails, each request is encoded alone,
    and the good one (the same item, with its right data) is served as if nothing happened."""
    bad = gemma3.request("bad", [[IMAGE]])
    item = (bad.mm_features or [])[0].data
    assert item is not None
    item["pixel_values"] = MultiModalFieldElem(torch.zeros(1, 3, 16, 16), item["pixel_values"].field)
    got = run(runner, [bad, gemma3.request("good", [[IMAGE]], max_tokens=12)])
    last = got["bad"][1]
    assert (got["bad"][0], last.finish_reason) == ([], FinishReason.ERROR)
    assert last.error is not None and last.error.code == "FieldConfigError"
    assert last.error.message.startswith("The model's image encoder cannot run on items [")
    assert got["good"][0] == greedy


def test_a_feature_without_data_the_encoder_never_saw_fails_its_request(runner: ModelRunner, gemma3: Family) -> None:
    missing = gemma3.request("missing", [[IMAGE]])
    (missing.mm_features or [])[0].data = None
    text = _plain("text", [2, 3], max_tokens=1)
    got = run(runner, [missing, text])
    last = got["missing"][1]
    assert last.finish_reason == FinishReason.ERROR
    assert last.error is not None and last.error.code == "FieldConfigError"
    assert got["text"][1].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)


# --- loading --------------------------------------------------------------------------------------


def test_a_folder_without_weights_is_refused_with_the_fix(gemma3_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"needs the model's weights \(model\.safetensors\) beside its config\.json"):
        ModelRunner(gemma3_dir)


def test_a_folder_without_a_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a model folder"):
        ModelRunner(tmp_path)


def test_an_architecture_without_an_encoder_is_refused(emu3_dir: Path) -> None:
    with pytest.raises(UnsupportedModelError, match=r"model type 'emu3'.*\['gemma3', 'idefics3', 'llava_onevision', 'qwen2_5_vl', 'qwen2_audio'\]"):
        ModelRunner(emu3_dir)


def test_dtype_defaults_to_the_folder_and_can_be_overridden(gemma3: Family) -> None:
    assert ModelRunner(gemma3.folder).dtype == torch.float32
    runner = ModelRunner(gemma3.folder, dtype="bfloat16")
    assert runner.dtype == torch.bfloat16
    tokens, last = run(runner, [gemma3.request("r", [[IMAGE]], max_tokens=2, ignore_eos=True)])["r"]
    assert len(tokens) == 2 and last.finish_reason == FinishReason.LENGTH
    with pytest.raises(ConfigError, match="dtype 'float8'"):
        ModelRunner(gemma3.folder, dtype="float8")


def test_the_device_defaults_to_cuda_when_available(gemma3: Family) -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    runner = ModelRunner(gemma3.folder)
    assert runner.device.type == expected
    assert next(runner.model.parameters()).device.type == expected


def test_audio_items_of_different_lengths_get_their_own_rows(qwen2_audio_weights_dir: Path) -> None:
    family = Family("qwen2_audio", qwen2_audio_weights_dir, "audio")
    request = family.request("a", [[audio_item(1.0, 0), audio_item(0.6, 1)]])
    rows = ModelRunner(family.folder).encode(request.mm_features or [])
    counts = [f.mm_position.get_num_embeds() for f in request.mm_features or []]
    assert [rows[f.identifier].shape[0] for f in request.mm_features or []] == counts
    assert counts[0] > counts[1]


def test_max_tokens_default_fills_the_model_length(runner: ModelRunner) -> None:
    runner.add(_plain("r", [2] * 4090, max_tokens=None, ignore_eos=True))
    steps = 0
    while runner.has_unfinished_requests:
        outputs = runner.step()
        steps += 1
    assert steps == 6 and outputs[0].finish_reason == FinishReason.LENGTH
