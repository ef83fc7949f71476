"""Data URLs lifted out of a chat body before its bounds check and decode: the request is the
one the original body decodes to, field for field, except that a media part's data URL is the
bytes the media connector would have made of it (with the same errors), and every refusal is the
original's, word for word (mmfront.serve.inline_media, request_decoding.decode_chat_body)."""

from __future__ import annotations

import base64
import copy
import json
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront.config import MultiModalConfig
from mmfront.errors import MMFrontError
from mmfront.media import DecodedDataURL, MediaConnector
from mmfront.serve import inline_media, request_decoding
from mmfront.serve.chat_bounds import check_chat_body
from mmfront.serve.inline_media import MIN_LIFTED_BYTES, lift_data_urls
from mmfront.serve.protocol import ChatCompletionRequest
from mmfront.testing.media import image_data_url, make_image

BOUNDS = partial(check_chat_body, max_messages=8, max_parts=6, max_prompt_chars=400)
PAYLOAD = base64.b64encode(bytes(range(256)) * 24).decode()  # 6,144 bytes -> 8,192 characters
URL = "data:image/png;base64," + PAYLOAD


def chat(*parts: Any, **fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": list(parts)}], **fields}).encode()


def image(url: str = URL, kind: str = "image_url") -> dict[str, Any]:
    return {"type": kind, kind: {"url": url}}


def original(body: bytes) -> ChatCompletionRequest:
    """What the body decodes to without lifting: the bounds check, then the decode."""
    BOUNDS(body)
    return request_decoding.decode_request(body, ChatCompletionRequest)


LIMIT = MultiModalConfig().max_media_bytes
SMALL_LIMIT = 5000
"""A ``max_media_bytes`` between the payloads drawn below, so both sides of it are compared."""
CONNECTORS = {limit: MediaConnector(MultiModalConfig(max_media_bytes=limit)) for limit in (LIMIT, SMALL_LIMIT)}


def fetched(url: Any, limit: int = LIMIT) -> tuple[str, Any]:
    """What the media connector makes of a URL, a data URL decoded or not: bytes, or an error."""
    try:
        return "bytes", CONNECTORS[limit].fetch_bytes(url, timeout=1.0, what="The image")
    except MMFrontError as e:
        return type(e).__name__, str(e)


def resolved(request: ChatCompletionRequest, limit: int = LIMIT) -> ChatCompletionRequest:
    """``request`` with each media part's data URL (a decoded one, or text starting ``data:``)
    replaced by what the connector makes of it."""
    request = copy.deepcopy(request)
    for message in request.messages:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else ():
            media = part.get(part.get("type")) if isinstance(part, dict) and part.get("type") in {
                "image_url", "video_url", "audio_url"} else None
            url = media.get("url") if isinstance(media, dict) else None
            if isinstance(url, DecodedDataURL) or (isinstance(url, str) and url[:5].lower() == "data:"):
                media["url"] = fetched(url, limit)
    return request


def outcome(decode: Any, body: bytes, limit: int = LIMIT) -> tuple[str, Any]:
    try:
        return "request", resolved(decode(body), limit)
    except MMFrontError as e:
        return type(e).__name__, (str(e), e.parameter)


def lifted_decode(body: bytes) -> ChatCompletionRequest:
    return request_decoding.decode_chat_body(body, BOUNDS, max_media_bytes=LIMIT)


def test_a_real_image_request_decodes_to_the_same_request_from_a_short_body() -> None:
    url = image_data_url(make_image(64, 48, seed=3), "PNG")
    body = chat(image(url), {"type": "text", "text": "What is in this picture?"}, max_tokens=8)
    lifted = lift_data_urls(body, max_media_bytes=LIMIT)
    assert lifted is not None and len(lifted.urls) == 1
    assert len(lifted.body) == len(body) - len(url) + len(next(iter(lifted.urls)))
    request = lifted_decode(body)
    payload = url.partition(",")[2]
    assert request.messages[0]["content"][0]["image_url"]["url"] == DecodedDataURL(base64.b64decode(payload), len(payload))
    assert request.messages[0]["content"][1] == {"type": "text", "text": "What is in this picture?"}
    assert outcome(lifted_decode, body) == outcome(original, body)


def test_each_of_several_urls_goes_back_to_its_own_part() -> None:
    payloads = [PAYLOAD[:-4 * k] if k else PAYLOAD for k in range(3)]
    urls = [f"data:image/jpeg;base64,{p}" for p in payloads]
    body = chat(image(urls[0]), image(urls[1], "video_url"), {"type": "text", "text": "x"}, image(urls[2], "audio_url"))
    assert len(lift_data_urls(body, max_media_bytes=LIMIT).urls) == 3  # type: ignore[union-attr]
    request = lifted_decode(body)
    assert [p[p["type"]] for p in request.messages[0]["content"] if p["type"] != "text"] == [
        {"url": DecodedDataURL(base64.b64decode(p), len(p))} for p in payloads]
    assert outcome(lifted_decode, body) == outcome(original, body)


def test_a_url_beside_a_media_field_goes_back_as_its_text() -> None:
    body = chat({"type": "image_url", "image_url": {"url": URL}, "preview": {"url": URL[:-4]}})
    part = lifted_decode(body).messages[0]["content"][0]
    assert isinstance(part["image_url"]["url"], DecodedDataURL) and part["preview"] == {"url": URL[:-4]}


def test_an_image_past_max_media_bytes_stays_in_the_body_to_be_refused_before_it_is_decoded() -> None:
    body = chat(image())
    assert lift_data_urls(body, max_media_bytes=SMALL_LIMIT) is None
    assert lift_data_urls(body, max_media_bytes=6142) is not None  # what the connector allows (padding unknown)
    assert lift_data_urls(body, max_media_bytes=6141) is None
    request = request_decoding.decode_chat_body(body, BOUNDS, max_media_bytes=SMALL_LIMIT)
    assert request.messages[0]["content"][0]["image_url"]["url"] == URL
    assert fetched(URL, SMALL_LIMIT) == (
        "MediaTooLargeError", "The image is about 6144 bytes (from its base64 length), more than max_media_bytes=5000. "
        "Send a smaller file, or raise max_media_bytes.")


@pytest.mark.parametrize("url", [
    URL.replace("/", "\\/", 1),  # JSON's escaped solidus: the decode unescapes it, so the string is not plain
    "data:image/png;base64," + PAYLOAD[:-1] + "\n",  # a line break: not plain base64 (and not valid JSON raw)
    "data:image/png;base64," + PAYLOAD + "=",  # padding past the end
    "data:image/png;base64,\u00e9" + PAYLOAD,  # non-ASCII
    "https://example.com/" + "a" * MIN_LIFTED_BYTES,  # not a data URL
    "data:image/png;base64," + PAYLOAD[:100],  # too short to be worth lifting
    "data:" + "x" * 300 + "," + PAYLOAD,  # a header longer than a data URL's
    "data:image/png," + PAYLOAD,  # not declared base64: the connector refuses it
    "data:image/png;base64x," + PAYLOAD,
])
def test_strings_that_are_not_plainly_a_long_data_url_stay_in_the_body(url: str) -> None:
    body = chat(image(url))
    if "\n" in url:  # written raw, as a careless client would: invalid JSON
        body = body.replace(b"\\n", b"\n")
    assert lift_data_urls(body, max_media_bytes=LIMIT) is None
    assert outcome(lifted_decode, body) == outcome(original, body)


@pytest.mark.parametrize("body", [
    # a "url" outside any content part: lifted, not found on the way back, so the original is decoded
    chat({"type": "text", "text": "hi"}, response_format={"type": "json_schema", "json_schema": {"url": URL}}),
    # a data URL as text is the user's text, whatever it says
    chat({"type": "text", "text": URL}),
    # the key inside a text is text too
    chat({"type": "text", "text": '"url": "' + URL + '"'}),
    # a part that is not an object, beside a lifted URL
    chat(image(), "a bare string part"),
    # a message that is a string beside one with a lifted URL
    json.dumps({"messages": [{"role": "user", "content": [image()]}, "not a message"]}).encode(),
])
def test_urls_anywhere_else_decode_as_the_original(body: bytes) -> None:
    assert outcome(lifted_decode, body) == outcome(original, body)


@pytest.mark.parametrize("tail", [
    b', "max_tokens": "many"}',  # the field is named
    b', "max_tokens": 3',  # truncated: msgspec names the byte where it ended, the original's byte
    b', "max_tokens": 3}}',  # trailing characters, at the original's offset
    b', "stream_options": {"include_usage": true}}',  # vLLM's checks after the decode
])
def test_a_refusal_is_the_original_bodys_word_for_word(tail: bytes) -> None:
    body = chat(image())[:-1] + tail
    kind, (message, parameter) = outcome(lifted_decode, body)
    assert (kind, (message, parameter)) == outcome(original, body)
    assert kind != "request"


def test_the_bounds_still_count_every_message_and_part() -> None:
    body = chat(*([image()] * 7))
    assert outcome(lifted_decode, body) == ("ValidationError", (
        "The request's messages have 7 content parts; the server's limit is 6 (--max-content-parts).", "messages"))


def test_a_token_a_client_makes_up_is_its_own_text() -> None:
    forged = inline_media._TOKEN_PREFIX.split("-")[0] + "-lifted-0000000000000000-0"
    body = chat(image(forged), image())
    request = lifted_decode(body)
    assert request.messages[0]["content"][0]["image_url"]["url"] == forged
    assert outcome(lifted_decode, body) == outcome(original, body)


@st.composite
def chat_bodies(draw: st.DrawFn) -> bytes:
    """Chat bodies with data URLs (plain or not) in parts, in texts and under other keys, written
    with or without spaces, sometimes cut short."""
    plain = st.builds(lambda n, header: f"data:{header}," + PAYLOAD[:4 * n],
                      st.integers(MIN_LIFTED_BYTES // 4 - 2, len(PAYLOAD) // 4),
                      st.sampled_from(["image/png;base64", "IMAGE/JPEG;BASE64", "video/mp4; base64", "image/png",
                                       "audio/wav;charset=x;base64", "base64"]))
    odd = st.builds(lambda u, c, at: u[:at] + c + u[at:], plain, st.sampled_from(["/", "\\", '"', "\u00e9", " ", "-"]),
                    st.integers(0, 40))
    url = st.one_of(plain, plain, plain, odd, st.text(max_size=20))
    part = st.one_of(
        st.builds(image, url, st.sampled_from(["image_url", "video_url", "audio_url"])),
        st.builds(lambda t: {"type": "text", "text": t}, st.one_of(url, st.text(max_size=30))),
        st.builds(lambda u: {"type": "image_url", "image_url": u}, url),
        st.builds(lambda u: {"url": u}, url),
        url,
    )
    messages = st.lists(st.builds(lambda role, parts: {"role": role, "content": parts},
                                  st.sampled_from(["user", "system"]), st.lists(part, max_size=4)), max_size=3)
    fields = st.fixed_dictionaries({}, optional={"max_tokens": st.one_of(st.integers(-2, 5), st.text(max_size=2)),
                                                 "metadata": st.dictionaries(st.just("url"), url, max_size=1)})
    body = json.dumps({"messages": draw(messages), **draw(fields)}, separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
                      ensure_ascii=draw(st.booleans())).encode()
    cut = draw(st.one_of(st.none(), st.none(), st.none(), st.integers(0, len(body))))
    return body if cut is None else body[:cut]


@settings(max_examples=150, deadline=None)  # ~2.8 s; each example decodes its body three ways
@given(chat_bodies(), st.sampled_from([LIMIT, SMALL_LIMIT]))
def test_any_body_decodes_or_is_refused_as_the_original(body: bytes, limit: int) -> None:
    loose = partial(check_chat_body, max_messages=8, max_parts=10, max_prompt_chars=1 << 20)

    def plain(raw: bytes) -> ChatCompletionRequest:
        loose(raw)
        return request_decoding.decode_request(raw, ChatCompletionRequest)

    lifted = partial(request_decoding.decode_chat_body, check_bounds=loose, max_media_bytes=limit)
    assert outcome(lifted, body, limit) == outcome(plain, body, limit)
