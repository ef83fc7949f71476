"""``mmfront serve`` and ``vllm serve`` side by side on Qwen2.5-VL, images and videos, each in front
of a STOCK vLLM 0.33 engine core with the stub executor (the harness of test_vllm_serve_parity.py),
both started with ``--trust-request-mm-kwargs`` and at most 4 images and 2 videos a prompt: the
same chat gets the same answer, field by field (the rendered prompt, its token count, the text).

Compared: images as PNG and JPEG data URLs, of several sizes, two in a message; a video as an MP4
(H.264) and a WebM (VP9) data URL, alone, before and after an image, twice, named by a ``uuid``, in
a part without ``type``; a stream with a video; the request's ``mm_processor_kwargs`` (pixel limits
flat and as ``size``, a video's ``fps``, ``num_frames`` and ``max_pixels``) and ``media_io_kwargs``
(a video's ``num_frames``, ``fps``, every frame; an image's background colour), which both honour
with the flag; and the requests both refuse alike (a video that does not decode, a video URL as a
bare string, kwargs that are not objects).

Left different on purpose (docs/serving.md, "Differences from vllm serve"): an option no processor
or loader takes (``{"nope": 1}``) and a frame count that is not a positive integer are refused
with 400 naming the field, where vLLM drops them and answers.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
from test_vllm_serve_parity import (
    MODEL,
    PEER,
    PEER_DIR,
    SERVED,
    Pair,
    ask,
    both,
    error,
    explain,
    masked,
    read_stream,
    running_pair,
)

from mmfront.testing.media import image_data_url, make_image, make_video
from mmfront.testing.peer import SKIP_REASON, qwen2_5_vl_peer_folder

pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side,
              pytest.mark.skipif(PEER is None or MODEL is None or not PEER_DIR.is_dir(), reason=SKIP_REASON)]

MAX_PIXELS = 200704
"""256 tokens an image at most: room for several images and videos in the 4,096-token context."""
LIMITS = '{"image": 4, "video": 2}'
FLAGS = ["--limit-mm-per-prompt", LIMITS, "--trust-request-mm-kwargs"]


def video_url(codec: str = "libx264", container: str = "mp4", mime: str = "video/mp4") -> str:
    """A 4 s clip at 4 frames/s: 16 frames, more than Qwen's 2 frames/s sampling keeps."""
    clip = make_video(seconds=4.0, fps=4, width=64, height=48, seed=2, codec=codec, container=container)
    return f"data:{mime};base64,{base64.b64encode(clip).decode()}"


MP4 = video_url()
WEBM = video_url("libvpx-vp9", "webm", "video/webm")
PNG = image_data_url(make_image(100, 80, seed=3))
JPEG = image_data_url(make_image(300, 200, seed=4), "JPEG")
ODD = image_data_url(make_image(33, 17, seed=5))
TEXT = {"type": "text", "text": "What happens?"}
VIDEO = {"type": "video_url", "video_url": {"url": MP4}}
IMAGE = {"type": "image_url", "image_url": {"url": PNG}}


def user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [*parts, TEXT]}]


def chat(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "max_tokens": 3, "return_prompt_text": True, "messages": messages, **fields}


SAME: dict[str, dict[str, Any]] = {
    "image_png": chat(user(IMAGE)),
    "images_png_and_jpeg": chat(user(IMAGE, {"type": "image_url", "image_url": {"url": JPEG}})),
    "image_odd_size": chat(user({"type": "image_url", "image_url": {"url": ODD}})),
    "video_mp4": chat(user(VIDEO)),
    "video_webm": chat(user({"type": "video_url", "video_url": {"url": WEBM}})),
    "video_then_image": chat(user(VIDEO, IMAGE)),
    "image_then_video": chat(user(IMAGE, VIDEO)),
    "two_videos": chat(user(VIDEO, VIDEO)),
    "video_without_type": chat(user({"video_url": {"url": MP4}})),
    "video_with_uuid": chat(user({**VIDEO, "uuid": "clip-1"})),
    "image_with_uuid": chat(user({**IMAGE, "uuid": "picture-1"})),
    "mm_kwargs_max_pixels": chat(user(IMAGE), mm_processor_kwargs={"max_pixels": 3136}),
    "mm_kwargs_min_and_max_pixels": chat(user(IMAGE), mm_processor_kwargs={"min_pixels": 25088, "max_pixels": 50176}),
    "mm_kwargs_size": chat(user(IMAGE), mm_processor_kwargs={"size": {"shortest_edge": 3136, "longest_edge": 6272}}),
    "mm_kwargs_video_fps": chat(user(VIDEO), mm_processor_kwargs={"fps": 1}),
    "mm_kwargs_video_num_frames": chat(user(VIDEO), mm_processor_kwargs={"num_frames": 2}),
    "mm_kwargs_video_max_pixels": chat(user(VIDEO), mm_processor_kwargs={"max_pixels": 3136}),
    "mm_kwargs_video_size": chat(user(VIDEO), mm_processor_kwargs={"size": {"shortest_edge": 12544,
                                                                            "longest_edge": 50176}}),
    "media_io_num_frames": chat(user(VIDEO), media_io_kwargs={"video": {"num_frames": 4}}),
    "media_io_fps": chat(user(VIDEO), media_io_kwargs={"video": {"fps": 1}}),
    "media_io_num_frames_and_fps": chat(user(VIDEO), media_io_kwargs={"video": {"num_frames": 6, "fps": 2}}),
    "media_io_every_frame": chat(user(VIDEO), media_io_kwargs={"video": {"num_frames": -1}}),
    "media_io_image_background": chat(user(IMAGE), media_io_kwargs={"image": {"rgba_background_color": [0, 0, 0]}}),
    "media_io_for_another_modality": chat(user(IMAGE), media_io_kwargs={"audio": {"x": 1}}),
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    if PEER is None or MODEL is None or not PEER_DIR.is_dir():
        pytest.skip(SKIP_REASON)
    folder = tmp_path_factory.mktemp("qwen-media")
    with running_pair(folder, model=qwen2_5_vl_peer_folder(folder, MAX_PIXELS), server_args=FLAGS,
                      engine_args=["--limit-mm-per-prompt", LIMITS]) as servers:
        yield servers


@pytest.mark.parametrize("case", SAME)
def test_the_same_chat_gets_the_same_answer(pair: Pair, case: str) -> None:
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", SAME[case])
    assert vllm.status == mmfront.status == 200, explain(pair, vllm, mmfront)
    assert masked(mmfront.json()) == masked(vllm.json()), explain(pair, vllm, mmfront)


def vllm_prompt_tokens(pair: Pair, case: str) -> int:
    answer = ask(pair.vllm, "POST", "/v1/chat/completions", SAME[case])
    assert answer.status == 200, answer.text
    return int(answer.json()["usage"]["prompt_tokens"])


@pytest.mark.parametrize(("case", "baseline"), [
    ("mm_kwargs_max_pixels", "image_png"), ("mm_kwargs_min_and_max_pixels", "image_png"),
    ("mm_kwargs_video_size", "video_mp4"), ("media_io_fps", "video_mp4"),
    ("two_videos", "video_mp4"), ("video_then_image", "video_mp4"),
])
def test_the_options_compared_change_the_prompt(pair: Pair, case: str, baseline: str) -> None:
    """Each option compared above changes vLLM's prompt, so the comparison is of the option's effect."""
    assert vllm_prompt_tokens(pair, case) != vllm_prompt_tokens(pair, baseline)


def test_a_stream_with_a_video_says_the_same(pair: Pair) -> None:
    body = chat(user(VIDEO), stream=True, stream_options={"include_usage": True})
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", body)
    want, got = read_stream(vllm), read_stream(mmfront)
    for name in ("role", "text", "finish", "usage"):
        assert getattr(got, name) == getattr(want, name), f"{name} differs" + explain(pair, vllm, mmfront)


REFUSED: dict[str, tuple[dict[str, Any], str, tuple[str | None, str | None]]] = {
    "video_that_does_not_decode": (
        chat(user({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}})), "BadRequestError",
        (None, "multi_modal_data")),
    "video_url_as_a_bare_string": (chat(user({"type": "video_url", "video_url": MP4})), "BadRequestError",
                                   (None, None)),
    "mm_kwargs_not_an_object": (chat(user(IMAGE), mm_processor_kwargs=5), "Bad Request",
                                ("body.mm_processor_kwargs", "body.mm_processor_kwargs")),
}
"""Each case: the body, the error type both answer and the ``param`` of each (vLLM's, mmfront's):
mmfront names ``multi_modal_data`` for media that does not load, where vLLM gives none."""


@pytest.mark.parametrize("case", REFUSED)
def test_a_request_both_refuse_is_refused_alike(pair: Pair, case: str) -> None:
    body, kind, params = REFUSED[case]
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", body)
    assert vllm.status == mmfront.status == 400, explain(pair, vllm, mmfront)
    assert error(vllm)["type"] == error(mmfront)["type"] == kind, explain(pair, vllm, mmfront)
    assert (error(vllm)["param"], error(mmfront)["param"]) == params, explain(pair, vllm, mmfront)


@pytest.mark.parametrize(("options", "param"), [
    ({"media_io_kwargs": {"video": {"nope": 2}}}, "media_io_kwargs"),
    ({"media_io_kwargs": {"video": {"num_frames": 0}}}, "media_io_kwargs"),
    ({"mm_processor_kwargs": {"nope": 1}}, "mm_processor_kwargs"),
])
def test_an_option_vllm_drops_is_refused_by_mmfront_naming_it(pair: Pair, options: dict[str, Any], param: str) -> None:
    vllm, mmfront = both(pair, "POST", "/v1/chat/completions", chat(user(VIDEO), **options))
    assert vllm.status == 200, explain(pair, vllm, mmfront)
    assert mmfront.status == 400 and error(mmfront)["param"] == param, explain(pair, vllm, mmfront)
