from __future__ import annotations

import base64
import os
import socket
from pathlib import Path

import numpy as np
import pytest
from media_samples import PNG_32, SLOW_SECONDS, WAV_1S, encode

from mmfront.config import MultiModalConfig
from mmfront.errors import (
    ConfigError,
    InputTypeError,
    MediaDecodeError,
    MediaFetchError,
    MediaPathError,
    MediaTooLargeError,
    MediaURLNotAllowedError,
    ValidationError,
)
from mmfront.media import DecodeBudget, DecodedDataURL, MediaConnector, fetch, is_domain_allowed
from mmfront.media.fetch import address_kind
from mmfront.testing.media import make_image

PNG_B64 = base64.b64encode(PNG_32).decode()
LOCAL = MultiModalConfig(allowed_media_domains=("127.0.0.1",))


def _connector(**changes: object) -> MediaConnector:
    return MediaConnector(LOCAL.replace(**changes) if changes else LOCAL)


# --- inline sources ---------------------------------------------------------------------------


def test_data_url_loads_lazily(budget: DecodeBudget) -> None:
    item = _connector().load_image(f"data:image/png;base64,{PNG_B64}", budget=budget)
    assert item.original_bytes == PNG_32
    assert item.decode_count == 0
    assert item.info["width"] == 32 and item.info["format"] == "PNG"


def test_raw_base64_bytes_and_bytearray_load(budget: DecodeBudget) -> None:
    connector = _connector()
    wrapped = "\n".join(PNG_B64[i:i + 76] for i in range(0, len(PNG_B64), 76))
    for source in (PNG_B64, wrapped, PNG_32, bytearray(PNG_32)):
        assert connector.load_image(source, budget=budget).original_bytes == PNG_32


def test_a_jpeg_base64_starting_with_a_slash_is_not_taken_for_a_path(budget: DecodeBudget) -> None:
    jpeg = encode(make_image(8, 8), "JPEG")
    text = base64.b64encode(jpeg).decode()
    assert text.startswith("/9j/")
    assert _connector().load_image(text, budget=budget).info["format"] == "JPEG"


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("data:image/png;base64,@@@@", r"The image is not valid base64"),
        ("data:image/png,rawdata", r"Only base64 data URLs are supported"),
        ("data:image/png;base64", r"Malformed data URL .*no ','"),
        ("not*base64", r"The image is not valid base64"),
        ("   ", r"The image is an empty string"),
    ],
)
def test_bad_inline_data_is_refused(budget: DecodeBudget, source: str, fragment: str) -> None:
    with pytest.raises(MediaDecodeError, match=fragment):
        _connector().load_image(source, budget=budget)


@pytest.mark.parametrize("source", [42, None, 3.5, ["data:..."]])
def test_wrong_python_types_are_refused(budget: DecodeBudget, source: object) -> None:
    with pytest.raises(InputTypeError, match=rf"must be given as a URL, .* got {type(source).__name__}"):
        _connector().load_image(source, budget=budget)  # type: ignore[arg-type]


def test_oversize_base64_is_refused_before_decoding(budget: DecodeBudget) -> None:
    with pytest.raises(MediaTooLargeError, match=r"about \d+ bytes \(from its base64 length\), more than max_media_bytes=64"):
        _connector(max_media_bytes=64).load_image(PNG_B64, budget=budget)


def test_a_decoded_data_url_loads_as_its_url_under_the_same_limits(budget: DecodeBudget) -> None:
    decoded = DecodedDataURL(PNG_32, len(PNG_B64))
    item = _connector().load_image(decoded, budget=budget)
    assert item.original_bytes == PNG_32 and item.info == _connector().load_image(
        f"data:image/png;base64,{PNG_B64}", budget=DecodeBudget(budget.limit_bytes)).info
    errors = []
    for source in (decoded, f"data:image/png;base64,{PNG_B64}"):
        with pytest.raises(MediaTooLargeError) as info:
            _connector(max_media_bytes=64).load_image(source, budget=budget)
        errors.append(str(info.value))
    assert errors[0] == errors[1] and f"about {len(PNG_B64) // 4 * 3} bytes (from its base64 length)" in errors[0]


def test_unsupported_scheme_is_refused(budget: DecodeBudget) -> None:
    with pytest.raises(MediaFetchError, match="unsupported scheme 'ftp'"):
        _connector().load_image("ftp://127.0.0.1/x.png", budget=budget)


# --- local files ------------------------------------------------------------------------------


@pytest.fixture
def media_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "cat.png").write_bytes(PNG_32)
    (root / "sub" / "with space.png").write_bytes(PNG_32)
    (tmp_path / "secret.png").write_bytes(PNG_32)
    return root


def _local(root: Path, **changes: object) -> MediaConnector:
    return _connector(allowed_local_media_path=str(root), **changes)


def test_files_below_the_root_load_by_path_relative_path_and_file_url(media_root: Path, budget: DecodeBudget) -> None:
    connector = _local(media_root)
    for source in (str(media_root / "cat.png"), "cat.png", "sub/../cat.png",
                   f"file://{media_root}/sub/with%20space.png", f"file://localhost{media_root}/cat.png"):
        assert connector.load_image(source, budget=budget).original_bytes == PNG_32


def test_local_files_are_refused_without_a_root(media_root: Path, budget: DecodeBudget) -> None:
    with pytest.raises(MediaPathError, match=r"Loading local files is disabled.*Set allowed_local_media_path"):
        _connector().load_image(str(media_root / "cat.png"), budget=budget)


@pytest.mark.parametrize("escape", ["../secret.png", "sub/../../secret.png", "{tmp}/secret.png",
                                    "file://{tmp}/secret.png", "/etc/hostname.png"])
def test_paths_escaping_the_root_are_refused(media_root: Path, budget: DecodeBudget, escape: str) -> None:
    source = escape.format(tmp=media_root.parent)
    with pytest.raises(MediaPathError, match="leads outside allowed_local_media_path"):
        _local(media_root).load_image(source, budget=budget)


def test_symlink_out_of_the_root_is_refused(media_root: Path, budget: DecodeBudget) -> None:
    os.symlink(media_root.parent / "secret.png", media_root / "link.png")
    os.symlink(media_root / "cat.png", media_root / "inside.png")
    connector = _local(media_root)
    with pytest.raises(MediaPathError, match=r"leads outside allowed_local_media_path \(after resolving"):
        connector.load_image("link.png", budget=budget)
    assert connector.load_image("inside.png", budget=budget).original_bytes == PNG_32


def test_missing_file_directory_and_remote_file_url(media_root: Path, budget: DecodeBudget) -> None:
    connector = _local(media_root)
    with pytest.raises(MediaPathError, match=r"No file at nope\.png below allowed_local_media_path"):
        connector.load_image("nope.png", budget=budget)
    with pytest.raises(MediaPathError, match="is not a regular file"):
        connector.load_image(str(media_root / "sub") + "/.", budget=budget)
    os.mkfifo(media_root / "pipe.png")
    with pytest.raises(MediaPathError, match=r"pipe\.png is not a regular file"):
        connector.load_image("pipe.png", budget=budget)
    with pytest.raises(MediaPathError, match=r"names the host 'example\.com'"):
        connector.load_image("file://example.com/cat.png", budget=budget)


def test_local_file_over_the_size_cap(media_root: Path, budget: DecodeBudget) -> None:
    with pytest.raises(MediaTooLargeError, match=rf"The file cat.png is {len(PNG_32)} bytes, more than max_media_bytes=99"):
        _local(media_root, max_media_bytes=99).load_image("cat.png", budget=budget)


# --- http(s) ----------------------------------------------------------------------------------


def test_http_image_and_audio_load(http_base: str, budget: DecodeBudget) -> None:
    connector = _connector()
    image = connector.load_image(f"{http_base}/ok.png", budget=budget)
    assert image.original_bytes == PNG_32 and image.decode_count == 0
    audio = connector.load_audio(f"{http_base}/ok.wav", budget=budget)
    assert audio.original_bytes == WAV_1S
    assert audio.info["num_frames"] == 16000


@pytest.mark.parametrize("allowed", [None, ("*",), ("*", "*.example.com")])
def test_a_loopback_url_is_refused_unless_the_flag_names_its_host(http_base: str, budget: DecodeBudget,
                                                                 allowed: tuple[str, ...] | None) -> None:
    """Any public host is fetched by default (vLLM's default), but never a loopback address:
    not by default, not through ``*``; the error names the flag."""
    with pytest.raises(MediaURLNotAllowedError) as info:
        _connector(allowed_media_domains=allowed).load_image(f"{http_base}/ok.png", budget=budget)
    assert str(info.value) == (
        "The media host '127.0.0.1' is at 127.0.0.1, a loopback address, which mmfront does not fetch from unless "
        "--allowed-media-domains names the host (e.g. --allowed-media-domains 127.0.0.1). Send the media inline as a "
        "data: URL, or name the host in --allowed-media-domains.")
    assert (info.value.retryable, info.value.parameter) == (False, "multi_modal_data")


def test_a_named_loopback_host_is_fetched(http_base: str, budget: DecodeBudget) -> None:
    assert _connector(allowed_media_domains=("*", "127.0.0.1")).load_image(
        f"{http_base}/ok.png", budget=budget).info["width"] == 32
    port = http_base.rsplit(":", 1)[1]
    assert _connector(allowed_media_domains=("localhost",)).load_image(
        f"http://localhost:{port}/ok.png", budget=budget).info["width"] == 32


@pytest.mark.parametrize(("ip", "kind"), [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"), ("64:ff9b::7f00:1", "loopback"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"), ("10.0.0.1", "private"), ("192.168.1.1", "private"),
    ("172.16.0.1", "private"), ("fd00::1", "private"), ("0.0.0.0", "private"), ("224.0.0.1", "multicast"),
    ("100.64.0.1", "non-public"), ("8.8.8.8", None), ("2606:4700::1", None),
])
def test_address_kinds(ip: str, kind: str | None) -> None:
    assert address_kind(ip) == kind


def test_a_host_resolving_to_a_private_address_is_refused_and_never_contacted(
        monkeypatch: pytest.MonkeyPatch, http_base: str, budget: DecodeBudget) -> None:
    """The name is resolved once and the connection goes to the checked address: a public-looking
    name whose DNS answer is link-local (the metadata service) is refused before any connection."""
    port = int(http_base.rsplit(":", 1)[1])
    looked_up = []

    def resolve(host: str, port: int, *args: object, **kwargs: object) -> list[tuple[object, ...]]:
        looked_up.append(host)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("169.254.169.254", port))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with pytest.raises(MediaURLNotAllowedError, match=r"'media\.example\.com' is at 169\.254\.169\.254, a link-local"):
        _connector(allowed_media_domains=None).fetch_bytes(f"http://media.example.com:{port}/ok.png", timeout=5)
    assert looked_up == ["media.example.com"]


def test_a_redirect_to_a_loopback_address_is_refused(http_base: str) -> None:
    """An allowed host cannot bounce the server to an address the flag does not name: the
    redirect's host passes ``*`` but is checked at connect time too."""
    connector = _connector(allowed_media_domains=("*", "127.0.0.1"))
    with pytest.raises(MediaURLNotAllowedError, match=r"'localhost' is at 127\.0\.0\.1, a loopback address"):
        connector.fetch_bytes(f"{http_base}/redirect-out", timeout=5)


def test_this_servers_own_address_is_refused(monkeypatch: pytest.MonkeyPatch, http_base: str) -> None:
    """A connection whose two ends are one address reaches this server itself (its public
    address included): refused unless named, even where the address counts as public."""
    monkeypatch.setattr(fetch, "address_kind", lambda ip: None)  # as if 127.0.0.1 were this host's public address
    with pytest.raises(MediaURLNotAllowedError, match=r"is at 127\.0\.0\.1, this server, which mmfront does not"):
        _connector(allowed_media_domains=None).fetch_bytes(f"{http_base}/ok.png", timeout=5)
    assert _connector(allowed_media_domains=("127.0.0.1",)).fetch_bytes(f"{http_base}/ok.png", timeout=5) == PNG_32


def test_host_outside_allowed_domains_is_refused(http_base: str, budget: DecodeBudget) -> None:
    with pytest.raises(MediaFetchError, match=r"The host '127\.0\.0\.1' .* is not in --allowed-media-domains"):
        _connector(allowed_media_domains=("example.com", "*.example.org")).load_image(f"{http_base}/ok.png",
                                                                                     budget=budget)


def test_no_domains_refuse_every_url(http_base: str, budget: DecodeBudget) -> None:
    with pytest.raises(MediaURLNotAllowedError, match="not in --allowed-media-domains"):
        _connector(allowed_media_domains=()).load_image(f"{http_base}/ok.png", budget=budget)


@pytest.mark.parametrize(
    ("host", "allowed", "expected"),
    [
        ("a.example.com", ("*.example.com",), True),
        ("a.b.example.com", ("*.example.com",), True),
        ("example.com", ("*.example.com",), False),
        ("badexample.com", ("*.example.com",), False),
        ("Images.Example.COM.", ("images.example.com",), True),
        ("images.example.com", ("example.com",), False),
        ("anything", ("*",), True),
        ("anything", (), False),
    ],
)
def test_domain_matching(host: str, allowed: tuple[str, ...], expected: bool) -> None:
    assert is_domain_allowed(host, allowed) is expected


@pytest.mark.parametrize(("status", "retryable"), [(404, False), (403, False), (408, True), (429, True),
                                                   (500, True), (503, True)])
def test_http_errors_are_typed_with_retryability(http_base: str, budget: DecodeBudget, status: int,
                                                 retryable: bool) -> None:
    url = f"{http_base}/status/{status}"
    with pytest.raises(MediaFetchError, match=rf"Fetching media from {url} failed with HTTP {status}") as info:
        _connector().load_image(url, budget=budget)
    assert info.value.retryable is retryable


def test_http_timeout_is_retryable(http_base: str, budget: DecodeBudget) -> None:
    connector = _connector(image_fetch_timeout=0.2)
    with pytest.raises(MediaFetchError, match=r"slow\.png timed out after 0\.2 s") as info:
        connector.load_image(f"{http_base}/slow.png", budget=budget)
    assert info.value.retryable is True
    assert SLOW_SECONDS > 0.2


def test_oversize_body_is_cut_off(http_base: str, budget: DecodeBudget) -> None:
    with pytest.raises(MediaTooLargeError, match=r"/big is more than max_media_bytes=1000 bytes"):
        _connector(max_media_bytes=1000).load_image(f"{http_base}/big", budget=budget)


def test_content_length_over_the_cap_is_refused_before_reading(http_base: str, budget: DecodeBudget) -> None:
    with pytest.raises(MediaTooLargeError, match=r"is 1000000000 bytes \(Content-Length\), more than max_media_bytes"):
        _connector(max_media_bytes=1000).load_image(f"{http_base}/biglen", budget=budget)


def test_redirects_follow_only_allowed_hosts(http_base: str, budget: DecodeBudget) -> None:
    connector = _connector()
    assert connector.load_image(f"{http_base}/redirect-in", budget=budget).original_bytes == PNG_32
    with pytest.raises(MediaFetchError, match=r"redirects \(HTTP 302\) to a URL that is not allowed: .*'localhost'"):
        connector.load_image(f"{http_base}/redirect-out", budget=budget)


def test_load_images_keeps_order_and_raises_the_first_failure(http_base: str, budget: DecodeBudget) -> None:
    connector = _connector()
    other = encode(make_image(8, 8, seed=5))
    items = connector.load_images([f"{http_base}/ok.png", other, f"data:image/png;base64,{PNG_B64}"], budget=budget)
    assert [item.original_bytes for item in items] == [PNG_32, other, PNG_32]
    with pytest.raises(MediaFetchError, match="HTTP 404"):
        connector.load_images([f"{http_base}/ok.png", f"{http_base}/status/404", PNG_32], budget=budget)
    audios = connector.load_audios([WAV_1S, f"{http_base}/ok.wav"], budget=budget)
    assert [a.info["num_frames"] for a in audios] == [16000, 16000]


# --- options and configuration ----------------------------------------------------------------


def test_audio_takes_no_media_io_options(budget: DecodeBudget) -> None:
    with pytest.raises(ValidationError, match=r"media_io_kwargs\['audio'\] has options \['rate'\]"):
        _connector().load_audio(WAV_1S, budget=budget, media_io_kwargs={"audio": {"rate": 1}})


def test_connector_refuses_bad_config_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"config.media_io_kwargs\['image'\] has unknown options \['mode'\]"):
        MediaConnector(MultiModalConfig(media_io_kwargs={"image": {"mode": "RGB"}}))
    with pytest.raises(ConfigError, match="max_workers must be an integer >= 1"):
        MediaConnector(MultiModalConfig(), max_workers=0)


def test_eager_load_through_the_connector(budget: DecodeBudget) -> None:
    item = _connector().load_image(PNG_32, budget=budget, lazy=False)
    assert item.decode_count == 1
    assert np.array_equal(np.asarray(item.media), np.asarray(make_image(32, 32)))
