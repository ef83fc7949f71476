"""Issue 13.2: request-level ``mm_processor_kwargs`` are validated and bounded.

Gemma 3 declares what a request may set (pan-and-scan, with types and ranges; the crop cap is
its ``max_pan_and_scan_crops`` option, ``MultiModalConfig.model_options``); everything else HF takes is refused per request,
and whatever still fails inside HF or the native pixel path comes out as a ``ProcessorError``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mmfront import MultiModalConfig
from mmfront.errors import ConfigError, ProcessorError, ValidationError
from mmfront.models.gemma3 import MAX_PAN_AND_SCAN_CROPS, Gemma3MultiModalProcessor
from mmfront.models.registry import create_processor
from mmfront.preprocess import InputPreprocessor
from mmfront.processing.hf import ProcessorKwargSpec, refuse_processor_kwargs
from mmfront.testing.media import make_image

PROMPT = "<start_of_image>"
WIDE = make_image(512, 16, seed=3)  # 32:1, enough for many crops at min crop size 1


def refused(folder: Path, kwargs: Any, config: MultiModalConfig | None = None) -> ValidationError:
    pre = InputPreprocessor(folder, config)
    with pytest.raises(ValidationError) as e:
        pre.preprocess(PROMPT, {"image": [WIDE]}, hf_processor_mm_kwargs=kwargs)
    assert e.value.parameter == "mm_processor_kwargs"
    return e.value


def test_a_huge_crop_count_is_refused_before_any_crop_is_made(gemma3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Gemma3MultiModalProcessor, "_native", staticmethod(lambda *a: pytest.fail("processed")))
    error = refused(gemma3_dir, {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 1,
                                 "pan_and_scan_max_num_crops": 100_000})
    assert str(error) == ("mm_processor_kwargs.pan_and_scan_max_num_crops must be an integer in [1, 16], got 100000. "
                          "The cap is MultiModalConfig.model_options.max_pan_and_scan_crops; the deployment may raise it.")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pan_and_scan_min_crop_size": 0}, "pan_and_scan_min_crop_size must be an integer >= 1, got 0."),
    ({"pan_and_scan_min_crop_size": -5}, "pan_and_scan_min_crop_size must be an integer >= 1, got -5."),
    ({"pan_and_scan_min_crop_size": 1.5}, "pan_and_scan_min_crop_size must be an integer >= 1, got 1.5."),
    ({"pan_and_scan_min_crop_size": True}, "pan_and_scan_min_crop_size must be an integer >= 1, got True."),
    ({"pan_and_scan_max_num_crops": 0}, "pan_and_scan_max_num_crops must be an integer in [1, 16], got 0."),
    ({"pan_and_scan_max_num_crops": "four"}, "pan_and_scan_max_num_crops must be an integer in [1, 16], got 'four'."),
    ({"pan_and_scan_min_ratio_to_activate": float("nan")},
     "pan_and_scan_min_ratio_to_activate must be a finite number >= 0, got nan."),
    ({"pan_and_scan_min_ratio_to_activate": -1}, "pan_and_scan_min_ratio_to_activate must be a finite number >= 0, got -1."),
    ({"do_pan_and_scan": 1}, "do_pan_and_scan must be a boolean, got 1."),
    ({"do_pan_and_scan": "yes"}, "do_pan_and_scan must be a boolean, got 'yes'."),
])
def test_wrong_types_and_ranges_are_refused_by_name(gemma3_dir: Path, kwargs: dict[str, Any], message: str) -> None:
    assert str(refused(gemma3_dir, kwargs)).startswith("mm_processor_kwargs." + message)


def test_scoped_kwargs_are_checked_the_same(gemma3_dir: Path) -> None:
    error = refused(gemma3_dir, {"images_kwargs": {"pan_and_scan_min_crop_size": 0}})
    assert str(error) == "mm_processor_kwargs.images_kwargs.pan_and_scan_min_crop_size must be an integer >= 1, got 0."


@pytest.mark.parametrize("kwargs", [{"size": {"height": 0, "width": 0}},
                                    {"images_kwargs": {"size": {"height": 100_000, "width": 100_000}}},
                                    {"do_resize": False}])
def test_undeclared_hf_kwargs_cannot_be_set_per_request(gemma3_dir: Path, kwargs: dict[str, Any]) -> None:
    message = str(refused(gemma3_dir, kwargs))
    assert "cannot be set per request: Gemma3MultiModalProcessor takes only do_pan_and_scan (a boolean), " in message
    assert "pan_and_scan_max_num_crops (an integer in [1, 16])" in message


def test_apply_checks_too(gemma3_dir: Path) -> None:
    """The check is the processor's, so users of ``apply`` without InputPreprocessor get it."""
    proc = create_processor(gemma3_dir)
    with pytest.raises(ValidationError, match=r"^mm_processor_kwargs.size cannot be set per request") as e:
        proc.apply(PROMPT, {"image": [WIDE]}, hf_processor_mm_kwargs={"size": {"height": 0, "width": 0}})
    assert e.value.parameter == "mm_processor_kwargs"
    with pytest.raises(ValidationError, match=r"^mm_processor_kwargs.images_kwargs must be an object of kwargs, got int"):
        proc.apply(PROMPT, {"image": [WIDE]}, hf_processor_mm_kwargs={"images_kwargs": 3})
    with pytest.raises(ValidationError, match=r"^mm_processor_kwargs must be an object of HF processor kwargs, got list"):
        proc.apply(PROMPT, {"image": [WIDE]}, hf_processor_mm_kwargs=[("do_pan_and_scan", True)])  # type: ignore[arg-type]


def test_the_deployment_sets_the_crop_cap(gemma3_dir: Path) -> None:
    config = MultiModalConfig(model_options={"max_pan_and_scan_crops": 3})
    error = refused(gemma3_dir, {"do_pan_and_scan": True, "pan_and_scan_max_num_crops": 4}, config)
    assert "must be an integer in [1, 3], got 4" in str(error)
    pre = InputPreprocessor(gemma3_dir, config)
    out = pre.preprocess(PROMPT, {"image": [WIDE]}, hf_processor_mm_kwargs={
        "do_pan_and_scan": True, "pan_and_scan_min_crop_size": 1, "pan_and_scan_max_num_crops": 3})
    assert out["mm_placeholders"]["image"][0].get_num_embeds() == (3 + 1) * 16  # the original and 3 crops


def test_the_largest_allowed_request_makes_at_most_the_cap(gemma3_dir: Path) -> None:
    pre = InputPreprocessor(gemma3_dir)
    out = pre.preprocess(PROMPT, {"image": [WIDE]}, hf_processor_mm_kwargs={
        "do_pan_and_scan": True, "pan_and_scan_min_crop_size": 1, "pan_and_scan_max_num_crops": 16})
    assert out["mm_placeholders"]["image"][0].get_num_embeds() == (16 + 1) * 16


def test_deployment_kwargs_are_checked_at_start_up(gemma3_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"^MultiModalConfig.mm_processor_kwargs.pan_and_scan_max_num_crops must be "
                                          r"an integer in \[1, 16\], got 100"):
        create_processor(gemma3_dir, MultiModalConfig(mm_processor_kwargs={"pan_and_scan_max_num_crops": 100}))
    # The deployment may set kwargs a request may not (the operator owns the image size).
    create_processor(gemma3_dir, MultiModalConfig(mm_processor_kwargs={"size": {"height": 32, "width": 32}}))


@pytest.mark.parametrize(("extra", "where"), [({}, "Gemma3 image processing"), ({"resample": 3}, "Gemma3ImageProcessor")])
def test_failures_inside_processing_are_processor_errors(gemma3_dir: Path, extra: dict[str, Any], where: str) -> None:
    """A deployment kwarg that breaks processing fails each request with a typed error, on the
    native path and the HF fallback alike (it was torch's RuntimeError)."""
    config = MultiModalConfig(mm_processor_kwargs={"size": {"height": 0, "width": 0}, **extra})
    pre = InputPreprocessor(gemma3_dir, config)
    with pytest.raises(ProcessorError, match=f"^Failed to apply {where} on 1 image") as e:
        pre.preprocess(PROMPT, {"image": [WIDE]})
    assert isinstance(e.value.__cause__, Exception) and not isinstance(e.value.__cause__, ProcessorError)


@pytest.mark.parametrize(("name", "value"), [("max_pan_and_scan_crops", 0), ("max_pan_and_scan_crops", True)])
def test_the_cap_is_a_positive_integer(gemma3_dir: Path, name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"{name} must be an integer >= 1, got {value!r}"):
        create_processor(gemma3_dir, MultiModalConfig(model_options={name: value}))


def test_spec_bounds_come_from_the_config() -> None:
    spec = ProcessorKwargSpec("n", int, minimum=2, maximum=MAX_PAN_AND_SCAN_CROPS)
    config = MultiModalConfig(model_options={"max_pan_and_scan_crops": 5})
    assert [v for v in range(8) if spec.accepts(v, config)] == [2, 3, 4, 5]
    assert refuse_processor_kwargs([spec], {"n": 5, "other": 1}, config, accepted=frozenset(), owner="P") is None
    assert refuse_processor_kwargs([spec], {"other": 1}, config, accepted=frozenset({"other"}), owner="P") == (
        "mm_processor_kwargs.other cannot be set per request: P takes only n (an integer in [2, 5]). Settings such "
        "as the image size are the model's, fixed by its checkpoint.")
