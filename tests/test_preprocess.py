"""InputPreprocessor and InputProcessor on the offline tiny Gemma3 folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront.errors import InputTypeError, ValidationError
from mmfront.media import image as media_image
from mmfront.preprocess import InputPreprocessor, InputProcessor
from mmfront.testing.media import image_data_url, make_image
from mmfront.wire import SamplingParams
from mmfront.wire.codec import MsgpackDecoder, MsgpackEncoder
from mmfront.wire.structs import EngineCoreRequest, LoRARequest

PROMPT = "<start_of_turn>user\nA <start_of_image> B <start_of_image><end_of_turn>\n"


def chat(*urls: str) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": "Compare."}]}]


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts real image decodes (the loader defers them until the pixels are needed)."""
    counter: list[int] = []
    real = media_image._decode

    def counting(*args: Any, **kwargs: Any) -> Any:
        counter.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(media_image, "_decode", counting)
    return counter


def test_chat_request_repeating_an_image_decodes_it_once(gemma3_dir: Path, decodes: list[int]) -> None:
    pre = InputPreprocessor(gemma3_dir)
    url = image_data_url(make_image(40, 30, seed=0))
    first = pre.preprocess(chat(url, url))
    assert len(decodes) == 1
    assert first["mm_hashes"]["image"][0] == first["mm_hashes"]["image"][1]
    processor = InputProcessor(pre)
    processor.commit(processor.prepare("r1", first))  # sent: the item is in the mirror now
    assert processor.take_stamp("r1") is not None
    second = pre.preprocess(chat(url, url, url))
    assert len(decodes) == 1  # every item of the second request hits the cache
    assert second["mm_kwargs"]["image"] == [None, None, None]
    assert pre.stats.queries == 2 and pre.stats.hits == 1 and pre.stats.requests == 1
    assert len(second["mm_placeholders"]["image"]) == 3


def test_a_prompt_sent_as_several_engine_requests_counts_its_lookups_once(gemma3_dir: Path) -> None:
    """vLLM counts a prompt's processor-cache lookups when it processes the prompt, once: its
    ``n`` choices and its beam-search steps carry what that made. mmfront commits each engine
    request to the mirrored cache, and only the first commit of a prepared prompt counts."""
    pre = InputPreprocessor(gemma3_dir)
    processor = InputProcessor(pre)
    prompt = pre.preprocess(chat(image_data_url(make_image(40, 30, seed=3))))
    step = {**prompt, "prompt_token_ids": [*prompt["prompt_token_ids"], 17]}  # a beam step's copy
    for request_id, inputs in [("0_r", prompt), ("1_r", prompt), ("2_r", prompt), ("r-beam-0", step)]:
        sent = processor.commit(processor.prepare(request_id, inputs))
        assert processor.take_stamp(request_id) is not None
        assert (sent.mm_features or [])[0].data is None or request_id == "0_r"  # the data goes once
    assert (pre.stats.requests, pre.stats.queries, pre.stats.hits) == (1, 1, 0)
    again = pre.preprocess(chat(image_data_url(make_image(40, 30, seed=3))))  # the prompt processed again
    processor.commit(processor.prepare("r2", again))
    assert (pre.stats.requests, pre.stats.queries, pre.stats.hits) == (2, 2, 1)


def test_prompt_forms_agree(gemma3_dir: Path) -> None:
    pre = InputPreprocessor(gemma3_dir)
    images = [make_image(40, 30, seed=0), make_image(48, 64, seed=1)]
    from_text = pre.preprocess(PROMPT, {"image": images})
    ids = pre.tokenizer.encode(PROMPT)
    from_ids = pre.preprocess(ids, {"image": images})
    assert from_text["prompt_token_ids"] == from_ids["prompt_token_ids"]
    assert from_text["mm_placeholders"] == from_ids["mm_placeholders"]
    with pytest.raises(InputTypeError):
        pre.preprocess(3.5)  # type: ignore[arg-type]
    with pytest.raises(InputTypeError, match="content parts"):
        pre.preprocess(chat(), {"image": images})


def test_without_caches_items_get_per_request_uuids(gemma3_dir: Path) -> None:
    config = MultiModalConfig(mm_processor_cache_gb=0, enable_prefix_caching=False)
    pre = InputPreprocessor(gemma3_dir, config)
    out = pre.preprocess(PROMPT, {"image": [make_image(40, 30, 0), make_image(48, 64, 1)]}, request_id="req-7",
                         mm_uuids={"image": [None, "mine"]})
    assert out["mm_hashes"] == {"image": ["req-7-image-0", "mine"]}
    assert pre.cache is None and pre.tokenize_only_cache is None
    hashed = InputPreprocessor(gemma3_dir, MultiModalConfig(mm_processor_cache_gb=0))
    assert len(hashed.preprocess(PROMPT, {"image": [make_image(40, 30, 0)] * 2})["mm_hashes"]["image"][0]) == 64


def test_skip_mm_cache_leaves_the_mirror_alone(gemma3_dir: Path) -> None:
    pre = InputPreprocessor(gemma3_dir)
    image = make_image(40, 30, seed=5)
    pre.preprocess(PROMPT, {"image": [image, image]}, skip_mm_cache=True)
    assert pre.cache is not None and pre.cache.make_stats().total == 0
    out = pre.preprocess(PROMPT, {"image": [image, image]})
    assert out["mm_kwargs"]["image"][0] is not None  # the mirror never saw it: data is sent


def test_engine_core_request(gemma3_dir: Path) -> None:
    config = MultiModalConfig(enable_tower_connector_lora=True)
    processor = InputProcessor(InputPreprocessor(gemma3_dir, config))
    images = [make_image(40, 30, seed=0), make_image(48, 64, seed=1)]
    request = processor.process_inputs("r1", PROMPT, mm_data={"image": images}, arrival_time=1.5,
                                       lora_request=LoRARequest("ad", 1, "/lora"))
    assert request.request_id == "r1" and request.arrival_time == 1.5
    features = request.mm_features
    assert features is not None and [f.mm_position.offset for f in features] == sorted(
        f.mm_position.offset for f in features)
    assert all(f.identifier == f"ad:{f.mm_hash}" for f in features)
    plain = InputProcessor(InputPreprocessor(gemma3_dir)).process_inputs("r2", PROMPT, mm_data={"image": images},
                                                                         lora_request=LoRARequest("ad", 1))
    assert plain.mm_features is not None and all(f.identifier == f.mm_hash for f in plain.mm_features)

    frames = MsgpackEncoder().encode(request)
    decoded = MsgpackDecoder(EngineCoreRequest).decode(frames)
    assert decoded.prompt_token_ids == request.prompt_token_ids
    assert decoded.mm_features is not None and features is not None
    assert [f.mm_position for f in decoded.mm_features] == [f.mm_position for f in features]
    assert decoded.mm_features[0].data == features[0].data


def test_request_checks(gemma3_dir: Path) -> None:
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(max_model_len=30, encoder_cache_size=8))
    processor = InputProcessor(pre)
    with pytest.raises(ValidationError, match="The decoder prompt cannot be empty"):
        processor.process_inputs("a", [])
    with pytest.raises(ValidationError, match=r"^This model's maximum context length is 30 tokens. However, your "
                                              r"prompt contains 31 input tokens") as over:
        processor.process_inputs("b", [1] * 31)
    assert (over.value.parameter, over.value.value) == ("input_tokens", 31)
    with pytest.raises(ValidationError, match=r"^max_tokens must be at least 1, got 0.$") as full:
        processor.process_inputs("c", [1] * 30)
    assert (full.value.parameter, full.value.value) == ("max_tokens", 0)
    with pytest.raises(ValidationError, match=r"^max_tokens=31 cannot be greater than max_model_len=30") as asked:
        processor.process_inputs("c", [1] * 3, SamplingParams(max_tokens=31))
    assert asked.value.parameter == "max_tokens"
    assert processor.process_inputs("c", [1] * 3, SamplingParams(max_tokens=30)).sampling_params.max_tokens == 30
    with pytest.raises(ValidationError, match="Token id 999999 is out of vocabulary"):
        processor.process_inputs("d", [1, 999999])
    with pytest.raises(ValidationError, match="Token id -1 is out of vocabulary"):
        processor.process_inputs("e", [-1, 1])
    # The encoder budget is max(encoder_cache_size, most tokens one item can have) = 16 here.
    assert processor.process_inputs("f", "<start_of_image>", mm_data={"image": [make_image(40, 30, 0)]})
    wide = InputProcessor(InputPreprocessor(gemma3_dir, MultiModalConfig(encoder_cache_size=8)))
    with pytest.raises(ValidationError, match="image item with 80 embedding tokens, which exceeds the pre-allocated "
                                              "encoder cache size 16"):
        wide.process_inputs("g", "<start_of_image>", mm_data={"image": [make_image(128, 32, 0)]},
                            hf_processor_mm_kwargs={"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 16})


def test_one_pipeline_behind_both_of_vllms_names(gemma3_dir: Path) -> None:
    pre = InputPreprocessor(gemma3_dir)
    processor = InputProcessor(pre)
    pipeline = pre.pipeline
    assert processor.pipeline is pipeline
    assert (pre.processor, pre.cache, pre.stats, pre.item_executor) == (
        pipeline.processor, pipeline.cache, pipeline.stats, pipeline.item_executor)
    assert processor.cache is pipeline.cache


@pytest.mark.parametrize("entry", ["preprocess", "InputProcessor.prepare"])
def test_a_cache_p1_does_not_mirror_is_committed_while_preparing(gemma3_dir: Path, entry: str) -> None:
    """Both entry points take the one commit step of the pipeline: multimodal requests are
    committed and counted once, text-only requests leave the statistics alone."""
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig(api_process_count=2))  # processor_only
    assert pre.cache is not None and not pre.cache.commit_at_send
    processor = InputProcessor(pre)

    def run(n: int, prompt: Any, mm_data: dict[str, Any] | None = None) -> dict[str, Any]:
        if entry == "preprocess":
            return dict(pre.preprocess(prompt, mm_data))
        return dict(processor.prepare(f"r{n}", prompt, mm_data=mm_data).inputs)

    image = make_image(40, 30, seed=0)
    first = run(0, PROMPT, {"image": [image, image]})
    assert "mm_pending" not in first and all(k is not None for k in first["mm_kwargs"]["image"])
    assert (pre.stats.requests, pre.stats.queries, pre.stats.hits) == (1, 2, 1)
    assert "mm_pending" not in run(1, "just text")
    assert pre.stats.requests == 1
    again = run(2, PROMPT, {"image": [image, image]})
    assert all(k is not None for k in again["mm_kwargs"]["image"])  # this cache serves hits with data
    assert (pre.stats.requests, pre.stats.queries, pre.stats.hits) == (2, 4, 3)


def test_the_models_end_of_sequence_reaches_the_engine_as_vllm_sends_it(gemma3_dir: Path, tmp_path: Path) -> None:
    """vLLM's engine stops a request on ``_eos_token_id`` and ``stop_token_ids`` alone, so the
    frontend adds the tokenizer's EOS and the generation config's other EOS ids (vLLM's
    ``update_from_generation_config``), on a copy of the caller's parameters."""
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(gemma3_dir, folder)
    preprocessor = InputPreprocessor(folder)
    eos = preprocessor.tokenizer.eos_token_id
    assert isinstance(eos, int)
    (folder / "generation_config.json").write_text(f'{{"eos_token_id": [{eos}, 106, 107]}}')
    processor = InputProcessor(InputPreprocessor(folder))
    given = SamplingParams(max_tokens=4, stop_token_ids=[9])
    params = processor.process_inputs("r1", PROMPT, given).sampling_params
    assert params is not None and params is not given
    assert params._eos_token_id == eos
    assert params.stop_token_ids == list({106, 107, 9})
    assert params._all_stop_token_ids == {eos, 9, 106, 107}
    assert given.stop_token_ids == [9] and given._eos_token_id is None
    assert given._all_stop_token_ids == {9}

    # vLLM's clone: a shallow copy where skip_clone says the parameters are this request's alone
    # (the OpenAI server's), yet the stop-token set that grows here is the copy's own
    made = SamplingParams(max_tokens=4, stop=["x"], stop_token_ids=[9], skip_clone=True)
    sent = processor.process_inputs("r4", PROMPT, made).sampling_params
    assert sent is not None and sent is not made and sent.stop is made.stop
    assert sent._all_stop_token_ids == {eos, 9, 106, 107} and made._all_stop_token_ids == {9}
    assert made.stop_token_ids == [9] and made._eos_token_id is None
    shared = SamplingParams(max_tokens=4, stop=["x"])  # a library caller's, maybe reused: copied deep
    deep = processor.process_inputs("r5", PROMPT, shared).sampling_params
    assert deep is not None and deep.stop == ["x"] and deep.stop is not shared.stop

    ignoring = processor.process_inputs("r2", PROMPT, SamplingParams(max_tokens=4, ignore_eos=True)).sampling_params
    assert ignoring is not None and ignoring._eos_token_id is None and ignoring.stop_token_ids == []
    assert ignoring._all_stop_token_ids == {eos, 106, 107}

    without = InputProcessor(InputPreprocessor(gemma3_dir)).process_inputs("r3", PROMPT, SamplingParams(max_tokens=4))
    assert without.sampling_params is not None and without.sampling_params._eos_token_id == eos
