"""BaseMultiModalProcessor.apply on the small two-modality processor of ``toy_models``."""

from __future__ import annotations

import io
from typing import Any

import pytest
from PIL import Image

from mmfront import MediaWithBytes, MultiModalConfig
from mmfront.cache.lru import (
    LruKeyReplicatedReceiverCache,
    LruKeyReplicatedSenderCache,
    MultiModalProcessorOnlyCache,
)
from mmfront.errors import MultiModalCacheMissError, ValidationError
from mmfront.inputs import MultiModalFeatureSpec
from mmfront.testing.media import make_audio, make_image
from toy_models import toy


class RecordingCache(LruKeyReplicatedSenderCache):
    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.log: list[tuple[str, str, bool]] = []

    def touch_sender_cache_item(self, mm_hash: str) -> None:
        self.log.append(("touch", mm_hash, False))
        super().touch_sender_cache_item(mm_hash)

    def get_and_update_item(self, mm_item: Any, mm_hash: str) -> Any:
        self.log.append(("update", mm_hash, mm_item is not None))
        return super().get_and_update_item(mm_item, mm_hash)


def lazy_png(width: int, height: int, seed: int) -> MediaWithBytes[Image.Image]:
    buf = io.BytesIO()
    make_image(width, height, seed).save(buf, format="PNG")
    data = buf.getvalue()
    return MediaWithBytes(decode=lambda: Image.open(io.BytesIO(data)).convert("RGB"), original_bytes=data,
                          info={"width": width, "height": height})


def test_cache_commits_follow_placeholder_offsets_on_interleaved_prompts() -> None:
    proc = toy()
    cache = RecordingCache(1 << 20)
    images, audios = [make_image(4, 4, 0), make_image(5, 4, 1)], [make_audio(0.01, seed=0)]
    out = proc.apply("a <img> b <aud> c <img>", {"image": images, "audio": audios}, cache=cache)
    by_offset = sorted(((r.offset, m, i) for m, rs in out["mm_placeholders"].items() for i, r in enumerate(rs)))
    expected = [out["mm_hashes"][m][i] for _, m, i in by_offset]
    assert [m for _, m, _ in by_offset] == ["image", "audio", "image"]
    assert [h for op, h, _ in cache.log if op == "touch"] == expected
    assert [h for op, h, _ in cache.log if op == "update"] == expected

    # P1 walks features sorted by offset: with the same capacity it mirrors P0 exactly.
    receiver = LruKeyReplicatedReceiverCache(1 << 20)
    features = [MultiModalFeatureSpec(out["mm_kwargs"][m][i], m, out["mm_hashes"][m][i],
                                      out["mm_placeholders"][m][i], out["mm_hashes"][m][i]) for _, m, i in by_offset]
    receiver.get_and_update_features(features)
    assert all(receiver.is_cached_item(h) for h in expected)


def test_duplicate_item_is_processed_once_and_sent_once() -> None:
    proc = toy()
    cache = LruKeyReplicatedSenderCache(1 << 20)
    image = make_image(4, 4, 0)
    out = proc.apply("<img> and <img>", {"image": [image, image.copy()]}, cache=cache)
    assert proc.calls == [{"image": 1}]
    first, second = out["mm_kwargs"]["image"]
    assert first is not None and second is None  # P1 stores the first, then finds it
    assert out["mm_hashes"]["image"][0] == out["mm_hashes"]["image"][1]

    only = MultiModalProcessorOnlyCache(1 << 20)
    out = toy().apply("<img> and <img>", {"image": [image, image]}, cache=only)
    assert all(item is not None for item in out["mm_kwargs"]["image"])


def test_cache_hit_neither_processes_nor_decodes() -> None:
    proc = toy()
    cache = MultiModalProcessorOnlyCache(1 << 20)
    first = lazy_png(7, 5, seed=2)
    proc.apply("x <img>", {"image": [first]}, cache=cache)
    assert first.decode_count == 1 and proc.calls == [{"image": 1}]
    again = lazy_png(7, 5, seed=2)
    out = proc.apply("y <img> z", {"image": [again]}, cache=cache)
    assert again.decode_count == 0 and proc.calls == [{"image": 1}]
    assert out["mm_placeholders"]["image"][0].length == 1 + (7 % 3 + 1)


def test_uuid_rules() -> None:
    proc = toy()
    cache = MultiModalProcessorOnlyCache(1 << 20)
    image = make_image(4, 4, 0)
    out = proc.apply("<img>", {"image": [image]}, mm_uuids={"image": ["my-image"]}, cache=cache)
    assert out["mm_hashes"] == {"image": ["my-image"]}  # a UUID without factors is the hash
    reused = proc.apply("<img>", {"image": [None]}, mm_uuids={"image": "my-image"}, cache=cache)
    assert reused["mm_kwargs"]["image"][0] == out["mm_kwargs"]["image"][0] and len(proc.calls) == 1
    with pytest.raises(ValidationError, match="Cache miss for image at index 0"):
        proc.apply("<img>", {"image": [None]}, mm_uuids={"image": ["never-seen"]}, cache=cache)
    with pytest.raises(ValidationError, match="has 2 entries but 1 image"):
        proc.apply("<img>", {"image": [image]}, mm_uuids={"image": ["a", "b"]}, cache=cache)
    scoped = proc.apply("<img>", {"image": [image]}, mm_uuids={"image": ["my-image"]},
                        hf_processor_mm_kwargs={"images_kwargs": {"size": 3}})
    assert scoped["mm_hashes"]["image"][0] != "my-image"  # with factors the UUID is hashed


@pytest.mark.parametrize(("num_images", "limit", "valid"),
                         [(0, 0, True), (0, 1, True), (1, 0, False), (1, 1, True), (1, 2, True), (2, 1, False),
                          (2, 2, True)])
def test_limit_mm_per_prompt(num_images: int, limit: int, valid: bool) -> None:
    proc = toy(MultiModalConfig(limit_mm_per_prompt={"image": limit}))
    data = {"image": [make_image(4, 4, i) for i in range(num_images)]}
    prompt = "<img>" * num_images + "x"
    if valid:
        proc.apply(prompt, data)
    else:
        with pytest.raises(ValidationError, match="At most"):
            proc.apply(prompt, data)


def test_allowed_limit_is_min_of_user_and_supported() -> None:
    assert toy(MultiModalConfig(limit_mm_per_prompt={"audio": 10})).info.allowed_mm_limits["audio"] == 4
    assert toy().info.allowed_mm_limits == {"image": 999, "audio": 4}
    with pytest.raises(ValidationError, match="At most 4 audio") as info:
        toy().apply("<aud>" * 5, {"audio": [make_audio(0.01, seed=i) for i in range(5)]})
    assert "limit-mm-per-prompt" not in str(info.value)  # more than the model supports: no knob helps


def test_item_evicted_by_its_own_request_is_reprocessed_and_resent() -> None:
    # Each item is 8 bytes (two float32); the caches hold two items.
    proc = toy()
    sender, receiver = LruKeyReplicatedSenderCache(16), LruKeyReplicatedReceiverCache(16)

    def send(prompt: str, images: list[Image.Image]) -> list[Any]:
        out = proc.apply(prompt, {"image": images}, cache=sender)
        order = sorted(((r.offset, i) for i, r in enumerate(out["mm_placeholders"]["image"])))
        features = [MultiModalFeatureSpec(out["mm_kwargs"]["image"][i], "image", out["mm_hashes"]["image"][i],
                                          out["mm_placeholders"]["image"][i], out["mm_hashes"]["image"][i])
                    for _, i in order]
        return [f.data for f in receiver.get_and_update_features(features)]

    a, b, c = make_image(4, 4, 0), make_image(5, 4, 1), make_image(6, 4, 2)
    send("<img>", [a])
    # Offset order B, C, A: inserting C evicts A before A's own update, so A is processed again.
    data = send("<img> <img> <img>", [b, c, a])
    assert proc.calls == [{"image": 1}, {"image": 2}, {"image": 1}]
    assert all(d is not None for d in data)


def test_receiver_reports_every_missing_hash() -> None:
    proc = toy()
    sender = LruKeyReplicatedSenderCache(1 << 20)
    out = proc.apply("<img> <img>", {"image": [make_image(4, 4, 0), make_image(5, 4, 1)]}, cache=sender)
    out = proc.apply("<img> <img>", {"image": [make_image(4, 4, 0), make_image(5, 4, 1)]}, cache=sender)
    features = [MultiModalFeatureSpec(out["mm_kwargs"]["image"][i], "image", h, out["mm_placeholders"]["image"][i], h)
                for i, h in enumerate(out["mm_hashes"]["image"])]
    assert all(f.data is None for f in features)
    with pytest.raises(MultiModalCacheMissError) as info:
        LruKeyReplicatedReceiverCache(1 << 20).get_and_update_features(features)
    assert info.value.mm_hashes == out["mm_hashes"]["image"]


# --- prepare -> commit, typed ---------------------------------------------------------------------


def test_prepared_inputs_leave_the_cache_untouched_until_committed_once() -> None:
    from mmfront.processing.commit import commit, pending_commit

    proc = toy()
    cache = RecordingCache(1 << 20)
    image = make_image(4, 4, 0)
    prepared = proc.prepare("a <img>", {"image": [image]}, cache=cache)
    pending = pending_commit(prepared)
    assert pending is not None and pending is prepared["mm_pending"]
    assert [m for _, m, _ in pending.order] == ["image"] and cache.log == []
    committed = commit(prepared, cache)
    assert "mm_pending" not in committed and pending_commit(committed) is None
    assert [op for op, _, _ in cache.log] == ["touch", "update"]
    assert committed["mm_kwargs"]["image"][0] is not None  # a miss: it travels with its data
    assert committed["mm_hashes"] == prepared["mm_hashes"]
    # Committing committed inputs is a no-op: the same inputs back, the cache untouched.
    assert commit(committed, cache) is committed
    assert len(cache.log) == 2


def test_a_request_without_items_commits_without_touching_the_cache() -> None:
    from mmfront.processing.commit import NOTHING_TO_COMMIT, commit

    proc = toy()
    cache = RecordingCache(1 << 20)
    prepared = proc.prepare("just text", None, cache=cache)
    assert prepared["mm_pending"] is NOTHING_TO_COMMIT
    committed = commit(prepared, cache)
    assert "mm_pending" not in committed and cache.log == [] and cache.make_stats().total == 0
    assert committed["prompt_token_ids"] == prepared["prompt_token_ids"]


def test_a_hit_evicted_before_the_commit_is_processed_again() -> None:
    from mmfront.processing.commit import commit

    proc = toy()
    cache = LruKeyReplicatedSenderCache(1 << 20)
    image = make_image(4, 4, 0)
    proc.apply("a <img>", {"image": [image]}, cache=cache)
    prepared = proc.prepare("b <img>", {"image": [image]}, cache=cache)
    assert prepared["mm_kwargs"]["image"] == [None] and proc.calls == [{"image": 1}]  # a hit: not processed
    cache.clear_cache()
    committed = commit(prepared, cache)
    assert committed["mm_kwargs"]["image"][0] is not None and len(proc.calls) == 2
