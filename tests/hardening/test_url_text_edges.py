"""Issue 13, class 5: URL and text edge cases stay inside the error tree.

Malformed URLs (IPv6 literals, IDNA labels, ports, controls, lone surrogates), Content-Length
values ``http.client`` would misread, and lone surrogates in chat text, roles, prompts and
UUIDs: each is refused with a typed error naming the request field, before anything is fetched,
tokenized or hashed. Well-formed internationalized URLs are fetched in their ASCII form.
"""

from __future__ import annotations

import socketserver
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from local_services import serve_http
from mmfront.config import MultiModalConfig
from mmfront.errors import MediaFetchError, MediaTooLargeError, MMFrontError, ValidationError
from mmfront.media import MediaConnector
from mmfront.media.fetch import check_url_allowed
from mmfront.preprocess import InputPreprocessor
from mmfront.processing import processor as processor_module
from mmfront.testing.media import image_data_url, make_image

# --- a local server: Content-Length values written as raw bytes, and an echo of the path ------


class _RawHandler(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        path = self.rfile.readline().split()[1].decode("ascii")
        while self.rfile.readline() not in (b"\r\n", b""):
            pass
        if path.startswith("/cl/"):
            values = bytes.fromhex(path[4:]).split(b"\n")
            header = b"".join(b"Content-Length: " + value + b"\r\n" for value in values)
            self.wfile.write(b"HTTP/1.1 200 OK\r\n" + header + b"Connection: close\r\n\r\nabc")
        elif path.startswith("/redirect-to/"):
            target = bytes.fromhex(path[len("/redirect-to/"):])
            self.wfile.write(b"HTTP/1.1 302 Found\r\nLocation: " + target + b"\r\nContent-Length: 0\r\n\r\n")
        else:
            body = path.encode("ascii")
            self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    with serve_http(_RawHandler) as url:
        yield url


def _hex(header_values: list[bytes]) -> str:
    """Content-Length header values, one header each, as the server's path expects them."""
    return b"\n".join(header_values).hex()


def _connector(**kwargs: Any) -> MediaConnector:
    return MediaConnector(MultiModalConfig(**{"allowed_media_domains": ("*", "127.0.0.1"), **kwargs}))


# --- malformed URLs ---------------------------------------------------------------------------

MALFORMED = {
    "ipv6 bad hex digit": "http://[::g]/x.png",
    "ipv6 two double colons": "http://[1::2::3]/x.png",
    "ipv6 unclosed bracket": "http://[::1/x.png",
    "ipv6 too many groups": "http://[1:2:3:4:5:6:7:8:9]/x.png",
    "empty label": "http://a..b/x.png",
    "leading empty label": "http://.a/x.png",
    "two trailing dots": "http://a../x.png",
    "non-ascii empty label": "http://ü..b/x.png",
    "label of 64": f"http://{'a' * 64}.com/x.png",
    "idna label over 63": f"http://{'a' * 60}ü.com/x.png",
    "host over 253": "http://" + ".".join(["a" * 60] * 5) + "/x.png",
    "surrogate host": "http://\ud800.com/x.png",
    "surrogate path": "http://127.0.0.1/\ud800.png",
    "surrogate query": "http://127.0.0.1/x.png?q=\udfff",
    "space in host": "http://x y/x.png",
    "percent in host": "http://a%2fb.com/x.png",
    "crlf in host": "http://a\r\nb/x.png",
    "crlf in path": "http://127.0.0.1/a\r\nHost: evil",
    "tab in path": "http://127.0.0.1/a\tb",
    "nul in path": "http://127.0.0.1/a\x00b",
    "port out of range": "http://127.0.0.1:99999/x.png",
    "port not a number": "http://127.0.0.1:abc/x.png",
    "credentials": "http://user:pw@127.0.0.1/x.png",
}


@pytest.mark.parametrize("url", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_urls_are_refused_typed_before_any_connection(url: str) -> None:
    with pytest.raises(MediaFetchError, match=r"^Media URL .* is malformed: ") as info:
        _connector().fetch_bytes(url, timeout=5)
    assert info.value.parameter == "multi_modal_data"
    assert info.value.retryable is False
    assert str(info.value).isprintable()  # control characters and surrogates are shown escaped


@pytest.mark.parametrize(
    ("url", "allowed", "wire"),
    [
        ("http://例え.テスト/x.png", ("例え.テスト",), "http://xn--r8jz45g.xn--zckzah/x.png"),
        ("http://例え.テスト/x.png", ("*.xn--zckzah",), "http://xn--r8jz45g.xn--zckzah/x.png"),
        ("http://xn--r8jz45g.xn--zckzah/x.png", ("*.テスト",), "http://xn--r8jz45g.xn--zckzah/x.png"),
        ("http://EXAMPLE.com./x.png#frag", ("example.com",), "http://example.com./x.png"),
        ("http://h.example.com/é 1.png?q=ü&r=%20", ("*.example.com",),
         "http://h.example.com/%C3%A9%201.png?q=%C3%BC&r=%20"),
        ("https://[0:0::1]:8443", ("::1",), "https://[::1]:8443/"),
    ],
)
def test_well_formed_urls_go_on_the_wire_in_ascii(url: str, allowed: tuple[str, ...], wire: str) -> None:
    assert check_url_allowed(url, allowed) == wire


def test_an_idna_host_outside_the_allowlist_is_refused() -> None:
    with pytest.raises(MediaFetchError, match="not in --allowed-media-domains") as info:
        _connector(allowed_media_domains=("example.com", "bad..pattern.例")).fetch_bytes("http://例え.テスト/x",
                                                                                      timeout=5)
    assert info.value.parameter == "multi_modal_data"


def test_a_non_ascii_path_is_fetched_percent_encoded(base: str) -> None:
    assert _connector().fetch_bytes(f"{base}/ÿé ü.png?q=例", timeout=5) == b"/%C3%BF%C3%A9%20%C3%BC.png?q=%E4%BE%8B"


@pytest.mark.parametrize("target", ["http://a..b/x.png", "http://[::g]/x.png", "http://user@127.0.0.1/x.png"])
def test_a_redirect_to_a_malformed_url_is_refused_typed(base: str, target: str) -> None:
    with pytest.raises(MediaFetchError, match=r"^(Media URL .* redirects \(HTTP 302\) to a URL that is not allowed: "
                       r"Media URL .* is malformed|The media host's answer for .* is malformed)") as info:
        _connector().fetch_bytes(f"{base}/redirect-to/{target.encode().hex()}", timeout=5)
    assert info.value.parameter == "multi_modal_data"


# --- Content-Length -----------------------------------------------------------------------------

BAD_LENGTHS = {
    "hex": [b"0x10"],
    "exponent": [b"1e3"],
    "negative": [b"-1"],
    "plus sign": [b"+3"],
    "underscore": [b"1_0"],
    "arabic-indic digits": ["١٢".encode()],
    "superscript two": [b"\xb2"],
    "empty": [b""],
    "disagreeing list": [b"3, 4"],
    "disagreeing headers": [b"3", b"4"],
}


@pytest.mark.parametrize("values", BAD_LENGTHS.values(), ids=BAD_LENGTHS.keys())
def test_a_content_length_that_is_not_one_decimal_number_is_refused(base: str, values: list[bytes]) -> None:
    with pytest.raises(MediaFetchError, match="invalid Content-Length") as info:
        _connector().fetch_bytes(f"{base}/cl/{_hex(values)}", timeout=5)
    assert info.value.parameter == "multi_modal_data"
    assert info.value.retryable is False


@pytest.mark.parametrize("values", [[b"3"], [b"0003"], [b"3, 3"], [b"3", b"3"], [b" 3 "]])
def test_agreeing_decimal_content_lengths_are_read(base: str, values: list[bytes]) -> None:
    assert _connector().fetch_bytes(f"{base}/cl/{_hex(values)}", timeout=5) == b"abc"


def test_a_content_length_too_long_for_int_is_too_large_not_a_crash(base: str) -> None:
    with pytest.raises(MediaTooLargeError, match=r"is 1000000000000000000 bytes \(Content-Length\)") as info:
        _connector().fetch_bytes(f"{base}/cl/{_hex([b'9' * 5000])}", timeout=5)
    assert info.value.parameter == "multi_modal_data"


# --- lone surrogates in text ------------------------------------------------------------------

URL = image_data_url(make_image(40, 30, seed=0))
PROMPT = "<start_of_turn>user\nA <start_of_image><end_of_turn>\n"


@pytest.fixture(scope="module")
def pre(gemma3_dir: Path) -> InputPreprocessor:
    return InputPreprocessor(gemma3_dir, MultiModalConfig())


def _user(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": list(parts)}]


CHAT_CASES = {
    "string content": ([{"role": "user", "content": "Hi \udfff."}], r"messages\[0\]\.content"),
    "text part": (_user({"type": "text", "text": "A"}, {"type": "text", "text": "\ud83d\ude00"}),
                  r"messages\[0\]\.content"),
    "part uuid": (_user({"type": "image_url", "image_url": {"url": URL}, "uuid": "img-\udc80"}),
                  r"messages\[0\]\.content\[0\]\.uuid"),
    "uuid-only part": (_user({"type": "image_url", "image_url": None, "uuid": "\ud800"}),
                       r"messages\[0\]\.content\[0\]\.uuid"),
}


@pytest.fixture
def nothing_hashed(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("hashed a request that should have been refused")

    monkeypatch.setattr(processor_module, "get_mm_hashes", refuse)


@pytest.mark.parametrize(("messages", "where"), CHAT_CASES.values(), ids=CHAT_CASES.keys())
def test_lone_surrogates_in_chat_messages_are_refused(pre: InputPreprocessor, nothing_hashed: None,
                                                      messages: list[dict[str, Any]], where: str) -> None:
    with pytest.raises(ValidationError, match=where + r" holds the lone surrogate U\+D[89A-F][0-9A-F]{2}") as info:
        pre.preprocess(messages)
    assert info.value.parameter == "messages"


def test_a_lone_surrogate_in_a_role_is_refused(pre: InputPreprocessor, nothing_hashed: None) -> None:
    with pytest.raises(ValidationError, match=r"^messages\[1\]\.role ") as info:
        pre.preprocess([{"role": "system", "content": "Be brief."}, {"role": "us\ud800er", "content": "Hi."}])
    assert info.value.parameter == "messages"
    assert str(info.value).isprintable()


def test_a_lone_surrogate_in_a_prompt_is_refused_before_tokenizing(pre: InputPreprocessor, nothing_hashed: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("tokenized a prompt that should have been refused")

    monkeypatch.setattr(pre.processor.info.tokenizer, "encode", refuse)
    with pytest.raises(ValidationError, match=r"The prompt holds the lone surrogate U\+D800 at character 3") as info:
        pre.preprocess("Hi \ud800")
    assert info.value.parameter == "prompt"


@pytest.mark.parametrize("uuids", [["x\ud800"], "x\ud800", [None, "\udfff"]])
def test_a_lone_surrogate_in_mm_uuids_is_refused_before_hashing(pre: InputPreprocessor, nothing_hashed: None,
                                                                uuids: Any) -> None:
    images = [make_image(40, 30, seed=0)] * (len(uuids) if isinstance(uuids, list) else 1)
    with pytest.raises(ValidationError, match=r"multi_modal_uuids\['image'\]\[\d\] holds the lone surrogate") as info:
        pre.preprocess(PROMPT * len(images), {"image": images}, mm_uuids={"image": uuids})
    assert info.value.parameter == "multi_modal_uuids"


def test_valid_non_ascii_text_passes(pre: InputPreprocessor) -> None:
    out = pre.preprocess(_user({"type": "image_url", "image_url": {"url": URL}, "uuid": "图-😀"},
                               {"type": "text", "text": "Décris 😀 例え"}))
    assert out["mm_hashes"] == {"image": ["图-😀"]}


_ANY_CHAR = st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=())
_TEXT = st.lists(st.one_of(_ANY_CHAR, st.sampled_from(["\ud800", "\udfff", "<start_of_image>", "{{", "%"])),
                 max_size=12).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(role=st.one_of(st.sampled_from(["user", "system", "assistant"]), _TEXT), text=_TEXT, uuid=_TEXT,
       prompt=_TEXT)
def test_random_unicode_is_processed_or_refused_typed(pre: InputPreprocessor, role: str, text: str, uuid: str,
                                                       prompt: str) -> None:
    messages = _user({"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": URL}, "uuid": uuid})
    messages[0]["role"] = role
    for call in (lambda: pre.preprocess(messages),
                 lambda: pre.preprocess(prompt + PROMPT, {"image": [make_image(40, 30, seed=0)]},
                                        mm_uuids={"image": [uuid]})):
        try:
            call()
        except MMFrontError as exc:
            parameter = getattr(exc, "parameter", None)
            assert parameter is None or isinstance(parameter, str)
            str(exc).encode("utf-8")  # the message itself is valid text, safe to log or send
