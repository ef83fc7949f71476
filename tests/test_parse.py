from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from mmfront.config import MultiModalConfig
from mmfront.errors import InputTypeError, UnsupportedModalityError, ValidationError
from mmfront.media import DecodeBudget, load_audio_bytes, load_image_bytes
from mmfront.parse import (
    AudioEmbeddingItems,
    AudioProcessorItems,
    ImageEmbeddingItems,
    ImageProcessorItems,
    ImageSize,
    MediaWithBytes,
    MultiModalDataItems,
    MultiModalDataParser,
)
from mmfront.testing.media import make_audio, make_image, wav_bytes


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return buffer.getvalue()


PARSER = MultiModalDataParser()


# --- images -----------------------------------------------------------------------------------


def test_single_rgb_pil_image_is_kept_without_a_copy() -> None:
    image = make_image(8, 6)
    items = PARSER.parse_mm_data({"image": image})
    images = items.get_items("image", ImageProcessorItems)
    assert images.get_count() == 1 and len(images) == 1
    assert images.get(0) is image
    assert images.get_processor_data() == {"images": [image]}
    assert images.get_passthrough_data() == {}
    assert images.get_image_size(0) == ImageSize(8, 6)


def test_list_with_none_items_keeps_them() -> None:
    first, last = make_image(8, 6, seed=1), make_image(8, 6, seed=2)
    images = PARSER.parse_mm_data({"image": [first, None, last]})["image"]
    assert images.get_count() == 3
    assert images.get_all_items_for_hash() == [first, None, last]
    with pytest.raises(ValidationError, match=r"image 1 is None .* its size is unknown"):
        images.get_image_size(1)  # type: ignore[attr-defined]


def test_bare_none_is_one_item_named_by_uuid_and_empty_list_is_no_item() -> None:
    items = PARSER.parse_mm_data({"image": None, "audio": []})
    assert items.get_all_counts() == {"image": 1}
    assert items["image"].get(0) is None
    assert items.get_count("audio", strict=False) == 0
    with pytest.raises(KeyError, match="Modality 'audio' not found"):
        items.get_count("audio")


def test_rgba_pil_image_is_composited_on_the_parser_background() -> None:
    image = Image.new("RGBA", (2, 1))
    image.putpixel((0, 0), (255, 0, 0, 0))
    image.putpixel((1, 0), (200, 100, 50, 128))
    parser = MultiModalDataParser(rgba_background_color=(0, 0, 0))
    converted = parser.parse_mm_data({"image": image})["image"].get(0)
    assert converted.mode == "RGB"
    assert list(converted.getdata()) == [(0, 0, 0), (100, 50, 25)]


def test_exif_oriented_pil_image_is_transposed() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    make_image(10, 4).save(buffer, "JPEG", exif=exif.tobytes())
    parsed = PARSER.parse_mm_data({"image": Image.open(buffer)})["image"]
    assert parsed.get(0).size == (4, 10)
    assert parsed.get_image_size(0) == ImageSize(4, 10)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("shape", "size"),
    [((6, 8, 3), (8, 6)), ((6, 8, 1), (8, 6)), ((6, 8, 4), (8, 6)), ((3, 6, 8), (8, 6)), ((2, 6, 8), (8, 6))],
)
def test_array_image_sizes_hwc_and_chw(shape: tuple[int, int, int], size: tuple[int, int]) -> None:
    # a lone 3-D tensor means embeddings (vLLM's rule), so the tensor goes in a list
    for data in (np.zeros(shape, dtype=np.uint8), [torch.zeros(shape, dtype=torch.uint8)]):
        images = PARSER.parse_mm_data({"image": data})["image"]
        assert images.get_image_size(0) == ImageSize(*size)  # type: ignore[attr-defined]


def test_four_d_arrays_and_tensors_are_several_images() -> None:
    batch = np.zeros((3, 6, 8, 3), dtype=np.uint8)
    assert PARSER.parse_mm_data({"image": batch})["image"].get_count() == 3
    tensors = torch.zeros((2, 3, 6, 8))
    images = PARSER.parse_mm_data({"image": tensors})["image"]
    assert isinstance(images, ImageProcessorItems) and images.get_count() == 2
    assert images.get_image_size(1) == ImageSize(8, 6)


def test_lazy_media_with_bytes_stays_undecoded() -> None:
    config, budget = MultiModalConfig(), DecodeBudget(1 << 20)
    loaded = load_image_bytes(_png(make_image(12, 5)), config=config, budget=budget)
    images = PARSER.parse_mm_data({"image": [loaded]})["image"]
    assert images.get_item_for_hash(0) is loaded
    assert images.get_image_size(0) == ImageSize(12, 5)  # type: ignore[attr-defined]
    assert loaded.decode_count == 0
    assert images.get(0).size == (12, 5)
    assert loaded.decode_count == 1


def test_eager_media_with_bytes_without_info_answers_from_media() -> None:
    image = make_image(7, 3)
    wrapped = MediaWithBytes(image, b"raw")
    images = PARSER.parse_mm_data({"image": wrapped})["image"]
    assert images.get_image_size(0) == ImageSize(7, 3)  # type: ignore[attr-defined]
    assert images.get(0) is image


# --- embeddings -------------------------------------------------------------------------------


def test_embeddings_need_enable_mm_embeds() -> None:
    with pytest.raises(ValidationError, match=r"You must set `enable_mm_embeds` to input `image_embeds`"):
        PARSER.parse_mm_data({"image": torch.zeros(2, 4, 16)})
    with pytest.raises(ValidationError, match=r"to input `audio_embeds`"):
        PARSER.parse_mm_data({"audio": [torch.zeros(4, 16)]})


def test_embedding_forms() -> None:
    parser = MultiModalDataParser(enable_mm_embeds=True, expected_hidden_size=16)
    stacked = torch.zeros(2, 4, 16)
    items = parser.parse_mm_data({"image": stacked})["image"]
    assert isinstance(items, ImageEmbeddingItems)
    assert items.get_count() == 2 and items.get_feature_size(1) == 4
    assert items.get_processor_data() == {}
    assert items.get_passthrough_data()["image_embeds"] is stacked

    listed = parser.parse_mm_data({"audio": [np.ones((3, 16), dtype=np.float32), torch.ones(5, 16)]})["audio"]
    assert isinstance(listed, AudioEmbeddingItems)
    assert [tuple(t.shape) for t in listed.get_all()] == [(3, 16), (5, 16)]
    assert isinstance(listed.get(0), torch.Tensor)

    with pytest.raises(ValidationError, match="image embedding 0 has hidden size 8, but the model expects 16"):
        parser.parse_mm_data({"image": [torch.zeros(3, 8)]})
    with pytest.raises(ValidationError, match="image embedding 1 is None"):
        parser.parse_mm_data({"image": [torch.zeros(3, 16), None]})


def test_two_d_array_mixed_with_images_is_refused() -> None:
    with pytest.raises(ValidationError, match="image 1 is a 2-D array of shape \\(4, 4\\); an image array is 3-D"):
        PARSER.parse_mm_data({"image": [make_image(8, 6), np.zeros((4, 4))]})
    with pytest.raises(ValidationError, match="image data is a 2-D array of shape \\(4, 4\\)"):
        PARSER.parse_mm_data({"image": np.zeros((4, 4))})


# --- audio ------------------------------------------------------------------------------------


def test_audio_forms_without_resampling() -> None:
    wave_a = np.linspace(-1, 1, 10, dtype=np.float32)
    items = PARSER.parse_mm_data({"audio": wave_a})["audio"]
    assert isinstance(items, AudioProcessorItems)
    assert items.get(0) is wave_a
    assert items.get_processor_data()["audios"][0] is wave_a
    assert items.get_audio_length(0) == 10

    listed = PARSER.parse_mm_data({"audio": [0.0, 0.5, -0.5]})["audio"]
    assert listed.get_count() == 1 and listed.get(0).dtype == np.float64
    assert listed.get(0).tolist() == [0.0, 0.5, -0.5]

    batch = PARSER.parse_mm_data({"audio": np.zeros((3, 7), dtype=np.float32)})["audio"]
    assert batch.get_count() == 3 and batch.get(2).shape == (7,)

    tupled = PARSER.parse_mm_data({"audio": (wave_a, 8000)})["audio"]
    assert tupled.get(0) is wave_a  # no target rate: kept as given

    several = PARSER.parse_mm_data({"audio": [(wave_a, 8000), torch.zeros(4), None]})["audio"]
    assert several.get_count() == 3 and several.get(1).shape == (4,) and several.get(2) is None


def test_audio_tuple_is_resampled_to_the_target_rate() -> None:
    parser = MultiModalDataParser(target_sr=16000)
    rate = 44100
    sine = np.sin(2 * np.pi * 440 * np.arange(rate) / rate).astype(np.float32)
    out = parser.parse_mm_data({"audio": [(sine, rate)]})["audio"].get(0)
    assert out.shape == (16000,) and out.dtype == np.float32
    ideal = np.sin(2 * np.pi * 440 * np.arange(16000) / 16000)
    assert np.max(np.abs(out - ideal)[200:-200]) < 1e-3


def test_lazy_audio_is_resampled_lazily() -> None:
    loaded = load_audio_bytes(wav_bytes(make_audio(0.1, 44100), 44100), config=MultiModalConfig(), budget=DecodeBudget(1 << 20))
    parser = MultiModalDataParser(target_sr=16000)
    items = parser.parse_mm_data({"audio": loaded})["audio"]
    wrapped = items.get_item_for_hash(0)
    assert isinstance(wrapped, MediaWithBytes) and wrapped is not loaded
    assert wrapped.original_bytes == loaded.original_bytes
    assert wrapped.info["sample_rate"] == 16000 and wrapped.info["original_sample_rate"] == 44100
    assert items.get_audio_length(0) == 1600  # type: ignore[attr-defined]
    assert loaded.decode_count == 0 and wrapped.decode_count == 0
    waveform = items.get(0)
    assert waveform.shape == (1600,) and waveform.dtype == np.float32
    assert loaded.decode_count == 1 and wrapped.decode_count == 1


def test_lazy_audio_at_the_target_rate_is_unwrapped_to_the_waveform() -> None:
    loaded = load_audio_bytes(wav_bytes(make_audio(100 / 16000), 16000), config=MultiModalConfig(), budget=DecodeBudget(1 << 20))
    items = MultiModalDataParser(target_sr=16000).parse_mm_data({"audio": loaded})["audio"]
    assert items.get_audio_length(0) == 100  # type: ignore[attr-defined]
    assert items.get(0).shape == (100,)


@pytest.mark.parametrize(
    ("data", "error", "fragment"),
    [
        ({"audio": np.zeros(4, dtype=np.int16)}, InputTypeError, "audio 0 has dtype int16; send float samples"),
        ({"audio": [(np.zeros((2, 4)), 16000)]}, ValidationError, r"audio 0 has shape \(2, 4\); audio must be 1-D"),
        ({"audio": (np.zeros(4), 16000, "x")}, InputTypeError, "audio 0 is a tuple of 3 values"),
        ({"audio": (np.zeros(4), "16k")}, InputTypeError, "audio 0 is a tuple of 2 values"),
        ({"audio": [[0.1, "x"]]}, InputTypeError, "audio 0 is a list that is not all numbers"),
        ({"audio": ["a.wav"]}, InputTypeError, "audio 0 has type str; .*load URLs, paths and base64 with MediaConnector"),
        ({"audio": np.zeros((2, 2, 2))}, ValidationError, "audio data is a 3-D array"),
        ({"audio": 5}, InputTypeError, "audio data has type int"),
        ({"image": 5}, InputTypeError, "image data has type int; expected a PIL image"),
        ({"image": [make_image(8, 6), "cat.png"]}, InputTypeError, "image 1 has type str; .*MediaConnector"),
        ({"image": {"url": "x"}}, InputTypeError, "image data has type dict"),
        ({"image": np.zeros((1, 2, 3, 4, 5))}, ValidationError, "image data is a 5-D array"),
    ],
)
def test_wrong_types_and_shapes_are_typed_errors(data: dict[str, object], error: type[Exception], fragment: str) -> None:
    with pytest.raises(error, match=fragment):
        PARSER.parse_mm_data(data)


def test_unknown_modality_and_non_mapping() -> None:
    with pytest.raises(UnsupportedModalityError, match=r"Unsupported modality: 'xyz'\. Supported: image, audio") as info:
        PARSER.parse_mm_data({"image": make_image(8, 6), "xyz": [1]})
    assert info.value.parameter == "multi_modal_data"
    with pytest.raises(InputTypeError, match="multi_modal_data must be a mapping"):
        PARSER.parse_mm_data([make_image(8, 6)])  # type: ignore[arg-type]


# --- MultiModalDataItems ------------------------------------------------------------------------


def test_items_select_subset_counts_and_typed_access() -> None:
    images = [make_image(8, 6, seed=i) for i in range(3)]
    items = PARSER.parse_mm_data({"image": images, "audio": [np.zeros(3), np.ones(2)]})
    assert list(items) == ["image", "audio"]
    assert items.get_all_counts() == {"image": 3, "audio": 2}
    assert list(items.select({"audio"})) == ["audio"]

    picked = items.subset({"image": [2, 0]})
    assert list(picked) == ["image"]
    assert isinstance(picked["image"], ImageProcessorItems)
    assert picked["image"].get_all() == [images[2], images[0]]
    assert items["image"].get_count() == 3

    with pytest.raises(InputTypeError, match="Invalid type of data items for modality='image'"):
        items.get_items("image", AudioProcessorItems)
    with pytest.raises(KeyError, match="Modality 'video' not found"):
        items.get_items("video", ImageProcessorItems)
    assert MultiModalDataItems().get_all_counts() == {}


def test_embedding_subset_indexes_the_tensor() -> None:
    parser = MultiModalDataParser(enable_mm_embeds=True)
    stacked = torch.arange(24, dtype=torch.float32).reshape(3, 2, 4)
    picked = parser.parse_mm_data({"image": stacked}).subset({"image": [2]})["image"]
    assert isinstance(picked, ImageEmbeddingItems)
    assert torch.equal(picked.get(0), stacked[2])
