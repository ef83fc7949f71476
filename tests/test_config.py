"""Every validation rule of ``MultiModalConfig``: a bad value raises ``ConfigError`` naming the
field; a good one is normalized the way the rest of mmfront reads it."""

from __future__ import annotations

import dataclasses
import logging
import math
import re
from pathlib import Path
from typing import Any

import pytest

from mmfront.config import DEFAULT_IMAGE_FORMATS, DEFAULT_LIMIT_PER_PROMPT, GiB_bytes, MiB_bytes, ModalityLimit
from mmfront.config import MultiModalConfig as Config
from mmfront.errors import ConfigError, MMFrontError


def rejects(message: str, **kwargs: Any) -> ConfigError:
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        Config(**kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, MMFrontError)
    return info.value


def test_defaults_are_valid_and_vllms() -> None:
    config = Config()
    assert config.mm_processor_cache_bytes == 4 * GiB_bytes
    assert config.mm_shm_cache_max_object_size_bytes == 128 * MiB_bytes
    assert config.get_limit_per_prompt("image") == DEFAULT_LIMIT_PER_PROMPT == 999
    assert config.get_dummy_options("image") is None
    assert config.allowed_image_formats == DEFAULT_IMAGE_FORMATS
    assert config.rgba_background_color == (255, 255, 255)


# --- processor cache -----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [-1, -0.5, math.nan, math.inf, True, "4"])
def test_cache_gb_must_be_a_finite_number_at_least_zero(value: object) -> None:
    rejects(f"mm_processor_cache_gb must be a finite number >= 0, got {value!r}", mm_processor_cache_gb=value)


def test_cache_gb_zero_and_fractions_are_accepted() -> None:
    assert Config(mm_processor_cache_gb=0).mm_processor_cache_bytes == 0
    assert Config(mm_processor_cache_gb=0.5).mm_processor_cache_bytes == GiB_bytes // 2


@pytest.mark.parametrize("value", ["LRU", "memory", None, ["lru"]])
def test_cache_type_must_be_lru_or_shm(value: object) -> None:
    rejects(f"mm_processor_cache_type must be one of ['lru', 'shm'], got {value!r}", mm_processor_cache_type=value)


def test_shm_object_size_is_ignored_with_lru_as_in_vllm(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="mmfront.config"):
        assert Config(mm_shm_cache_max_object_size_mb=128).mm_processor_cache_type == "lru"
    assert "mm_shm_cache_max_object_size_mb=128 is ignored" in caplog.text
    config = Config(mm_processor_cache_type="shm", mm_shm_cache_max_object_size_mb=16)
    assert config.mm_shm_cache_max_object_size_bytes == 16 * MiB_bytes


@pytest.mark.parametrize("value", [0, -3, 1.5, True])
def test_shm_object_size_must_be_a_positive_integer(value: object) -> None:
    rejects(
        f"mm_shm_cache_max_object_size_mb must be an integer >= 1, got {value!r}",
        mm_processor_cache_type="shm",
        mm_shm_cache_max_object_size_mb=value,
    )


# --- choices -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "choices"),
    [
        ("mm_hasher_algorithm", "md5", ["blake3", "sha256", "sha512"]),
        ("mm_hasher_algorithm", "BLAKE3", ["blake3", "sha256", "sha512"]),
        ("dtype", "float64", ["auto", "float32", "bfloat16", "float16"]),
        ("transformers_backend", "native", ["auto", "legacy", "offsets"]),
        ("chat_template_content_format", "parts", ["auto", "string", "openai"]),
    ],
)
def test_choice_fields_accept_only_their_choices(field: str, value: str, choices: list[str]) -> None:
    rejects(f"{field} must be one of {choices}, got {value!r}", **{field: value})


@pytest.mark.parametrize("value", ["", "  \n", 3, b"{{ messages }}"])
def test_chat_template_is_non_empty_template_text(value: object) -> None:
    rejects(
        f"chat_template must be the text of a Jinja chat template (read a .jinja file with Path.read_text()), "
        f"got {value!r}",
        chat_template=value,
    )


def test_chat_template_text_is_kept() -> None:
    assert Config(chat_template="{{ messages }}").chat_template == "{{ messages }}"


# --- limit_mm_per_prompt -----------------------------------------------------------------------


def test_limits_must_be_a_mapping() -> None:
    rejects(
        "limit_mm_per_prompt must be a mapping modality -> count, got [('image', 2)]",
        limit_mm_per_prompt=[("image", 2)],
    )


def test_limits_name_known_modalities() -> None:
    rejects(
        "limit_mm_per_prompt has unknown modalities 'images', 'tile'; use image, audio, video",
        limit_mm_per_prompt={"tile": 1, "image": 1, "images": 2},
    )


@pytest.mark.parametrize("value", ["2", True, 2.0, None])
def test_a_limit_is_a_count_or_a_mapping(value: object) -> None:
    rejects(
        f"limit_mm_per_prompt['image'] must be a count or a mapping like "
        f"{{'count': 2, 'width': 512, 'height': 512}}, got {value!r}",
        limit_mm_per_prompt={"image": value},
    )


def test_a_limit_mapping_has_only_known_keys() -> None:
    rejects(
        "limit_mm_per_prompt['image'] has unknown keys ['depth', 'num']; use count, width, height, length",
        limit_mm_per_prompt={"image": {"count": 1, "num": 2, "depth": 3}},
    )


def test_a_limit_mapping_needs_a_count() -> None:
    rejects(
        "limit_mm_per_prompt['image'] has no 'count'; give the number of items, e.g. {'count': 2, 'width': 64}",
        limit_mm_per_prompt={"image": {"width": 64}},
    )


@pytest.mark.parametrize(("key", "value"), [("count", -1), ("width", 1.5), ("height", True), ("length", "3")])
def test_limit_numbers_are_non_negative_integers(key: str, value: object) -> None:
    limit = {"count": 1, key: value}
    rejects(
        f"limit_mm_per_prompt['audio'].{key} must be a non-negative integer, got {value!r}",
        limit_mm_per_prompt={"audio": limit},
    )


def test_limits_are_normalized_to_modality_limits() -> None:
    given = ModalityLimit(count=3, length=100)
    config = Config(limit_mm_per_prompt={"image": {"count": 1, "width": 64, "height": 32}, "audio": 0, "video": given})
    assert config.limit_mm_per_prompt == {
        "image": ModalityLimit(count=1, width=64, height=32),
        "audio": ModalityLimit(count=0),
        "video": given,
    }
    assert (config.get_limit_per_prompt("image"), config.get_limit_per_prompt("audio")) == (1, 0)
    assert config.get_dummy_options("image") == ModalityLimit(count=1, width=64, height=32)
    assert Config(limit_mm_per_prompt={"image": 2}).limit_mm_per_prompt == {"image": ModalityLimit(count=2)}


# --- kwargs mappings -----------------------------------------------------------------------------


def test_processor_kwargs_must_be_a_mapping() -> None:
    rejects("mm_processor_kwargs must be a mapping, got list", mm_processor_kwargs=[("do_pan_and_scan", True)])
    assert Config(mm_processor_kwargs={"do_pan_and_scan": True}).mm_processor_kwargs == {"do_pan_and_scan": True}


@pytest.mark.parametrize("value", [["image"], {"image": "RGB"}, {"image": {}, "audio": 16000}])
def test_media_io_kwargs_map_a_modality_to_options(value: object) -> None:
    rejects(
        "media_io_kwargs must map a modality to a mapping of options, e.g. "
        "{'image': {'rgba_background_color': [0, 0, 0]}}",
        media_io_kwargs=value,
    )


# --- integer and timeout limits ------------------------------------------------------------------


@pytest.mark.parametrize(
    "field",
    [
        "max_model_len",
        "encoder_cache_size",
        "api_process_count",
        "data_parallel_size",
        "max_image_pixels",
        "max_media_request_decode_bytes",
        "max_media_bytes",
    ],
)
@pytest.mark.parametrize("value", [0, -1, 2.0, True, "8"])
def test_size_limits_are_integers_at_least_one(field: str, value: object) -> None:
    rejects(f"{field} must be an integer >= 1, got {value!r}", **{field: value})


@pytest.mark.parametrize("field", ["max_model_len", "encoder_cache_size"])
def test_optional_limits_may_be_none(field: str) -> None:
    assert getattr(Config(**{field: None}), field) is None
    assert getattr(Config(**{field: 1}), field) == 1


@pytest.mark.parametrize("field", ["image_fetch_timeout", "audio_fetch_timeout"])
@pytest.mark.parametrize("value", [0, -1.0, math.inf, math.nan, False, "5"])
def test_fetch_timeouts_are_finite_positive_numbers(field: str, value: object) -> None:
    rejects(f"{field} must be a finite number > 0, got {value!r}", **{field: value})


# --- media loading -------------------------------------------------------------------------------


def test_local_media_root_must_be_an_existing_absolute_directory(tmp_path: Path) -> None:
    file = tmp_path / "image.png"
    file.write_bytes(b"")
    for value in ["media", str(tmp_path / "missing"), str(file), 5]:
        rejects(
            f"allowed_local_media_path must be an existing absolute directory, got {value!r}",
            allowed_local_media_path=value,
        )
    assert Config(allowed_local_media_path=str(tmp_path)).allowed_local_media_path == str(tmp_path)


@pytest.mark.parametrize("value", ["example.com", ["example.com", ""], [3], 5])
def test_media_domains_are_a_list_of_host_names(value: object) -> None:
    rejects(f"allowed_media_domains must be a list of host names, got {value!r}", allowed_media_domains=value)


def test_media_domains_are_lower_cased_into_a_tuple() -> None:
    config = Config(allowed_media_domains=["Example.COM", "*.cdn.example.com"])
    assert config.allowed_media_domains == ("example.com", "*.cdn.example.com")


@pytest.mark.parametrize("value", ["PNG", ["PNG", 3], 5])
def test_image_formats_are_a_set_of_format_names(value: object) -> None:
    rejects(
        f"allowed_image_formats must be a set of Pillow format names like {{'PNG', 'JPEG'}}, got {value!r}",
        allowed_image_formats=value,
    )


def test_image_formats_are_upper_cased() -> None:
    assert Config(allowed_image_formats=["png", "Jpeg", "mpo"]).allowed_image_formats == frozenset(
        {"PNG", "JPEG", "MPO"}
    )


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("ico", "Pillow decodes an ICO's largest picture while opening it"),
        ("EPS", "Pillow renders EPS by running Ghostscript"),
        ("WMF", "Pillow only identifies it and cannot decode it"),
    ],
)
def test_unsafe_image_formats_cannot_be_allowed(name: str, why: str) -> None:
    rejects(f"allowed_image_formats cannot include {name.upper()}: {why}", allowed_image_formats={"PNG", name})


def test_image_formats_are_formats_pillow_opens() -> None:
    rejects(
        "allowed_image_formats has 'PNGG', which is not an image format Pillow opens", allowed_image_formats={"PNGG"}
    )


@pytest.mark.parametrize("value", [(0, 0), (0, 0, 0, 0), (0, 256, 0), (-1, 0, 0), (0.0, 0, 0), (True, 0, 0), "abc", 5])
def test_background_color_is_three_bytes(value: object) -> None:
    rejects(f"rgba_background_color must be three integers in 0..255, got {value!r}", rgba_background_color=value)


def test_background_color_list_becomes_a_tuple() -> None:
    assert Config(rgba_background_color=[0, 128, 255]).rgba_background_color == (0, 128, 255)


# --- replace() revalidates -----------------------------------------------------------------------


def test_replace_validates_the_new_value_and_keeps_the_rest() -> None:
    config = Config(mm_processor_cache_gb=1, limit_mm_per_prompt={"image": 2})
    replaced = config.replace(mm_processor_cache_type="shm")
    assert (replaced.mm_processor_cache_type, replaced.mm_processor_cache_gb) == ("shm", 1)
    assert replaced.limit_mm_per_prompt == {"image": ModalityLimit(count=2)}
    with pytest.raises(ConfigError, match="mm_processor_cache_gb must be a finite number >= 0, got -2"):
        config.replace(mm_processor_cache_gb=-2)


def test_vllm_dataclass_names_and_defaults_are_accepted() -> None:
    config = Config(limit_per_prompt={"image": 2})
    assert config.limit_mm_per_prompt["image"].count == 2 and config.limit_per_prompt is None
    assert dataclasses.replace(config, mm_processor_cache_gb=1).limit_mm_per_prompt["image"].count == 2
    rejects("limit_per_prompt is vLLM's name for limit_mm_per_prompt; give one of them, not both",
            limit_per_prompt={"image": 2}, limit_mm_per_prompt={"image": 3})
    assert Config(allowed_local_media_path="").allowed_local_media_path is None
