"""Issue 22, class 3: every malformed URL is typed, whatever its scheme.

A ``file://`` URL whose authority is malformed (an unclosed IPv6 bracket) escaped from
``urlsplit`` as a bare ``ValueError``. Parsing is fuzzed here for every scheme the connector
knows (``data:``, ``http(s)``, ``file``) and for others: the only exceptions that may come out are
mmfront's own (``MMFrontError`` subclasses), and each names the request field.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmfront.config import MultiModalConfig
from mmfront.errors import MediaPathError, MMFrontError, ValidationError
from mmfront.media import MediaConnector
from mmfront.media.fetch import check_url_allowed


@pytest.fixture(scope="module")
def connector(tmp_path_factory: pytest.TempPathFactory) -> MediaConnector:
    root = tmp_path_factory.mktemp("media-root")
    (root / "a.png").write_bytes(b"not really a png")
    # No URL may be fetched (allowed_media_domains=(): no host): parsing is what is fuzzed, not the network.
    return MediaConnector(MultiModalConfig(allowed_local_media_path=str(root), allowed_media_domains=()))


@pytest.mark.parametrize("url", [
    "file://[/a.png", "file://[::1/a.png", "file://]/a.png", "file://[fe80::1%/a.png", "file://[zz]/a.png",
    "FILE://[/etc/passwd", "file://localhost:99999/a.png", "file://[::1]:x/a.png",
])
def test_file_urls_with_a_malformed_authority_are_typed(connector: MediaConnector, url: str) -> None:
    with pytest.raises(MediaPathError) as info:
        connector.fetch_bytes(url, timeout=1.0)
    assert info.value.parameter == "multi_modal_data"
    assert "file:///" in str(info.value)  # says what a file URL must look like


_ROOTLESS = MediaConnector(MultiModalConfig(allowed_media_domains=()))


def _outcome(connector: MediaConnector, url: str) -> None:
    try:
        connector.fetch_bytes(url, timeout=1.0)
    except MMFrontError as exc:
        assert isinstance(exc, ValidationError) and exc.parameter == "multi_modal_data", repr(exc)


_AUTHORITY = st.text(alphabet="[]:@%/.?#0123456789abcdefxyz-_~ \x00\udcff\u00e9\uff0e", max_size=24)
_PATH = st.text(max_size=24)
_SCHEMES = st.sampled_from(["file", "FILE", "http", "https", "HTTPS", "data", "ftp", "gopher", "s3", "x-y+z", "a"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(scheme=_SCHEMES, slashes=st.sampled_from(["", "/", "//", "///"]), authority=_AUTHORITY, path=_PATH)
def test_any_url_gives_bytes_or_a_typed_error(
    connector: MediaConnector, scheme: str, slashes: str, authority: str, path: str
) -> None:
    _outcome(connector, f"{scheme}:{slashes}{authority}/{path}")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(header=st.text(max_size=20), payload=st.text(max_size=40))
def test_any_data_url_gives_bytes_or_a_typed_error(connector: MediaConnector, header: str, payload: str) -> None:
    _outcome(connector, f"data:{header},{payload}")
    _outcome(connector, f"data:{header};base64,{payload}")


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40))
def test_any_string_gives_bytes_or_a_typed_error(text: str) -> None:
    """Without a local root, with a string that may be base64, a path or a URL."""
    _outcome(_ROOTLESS, text)


@settings(max_examples=300, deadline=None)
@given(scheme=st.sampled_from(["http", "https", "HTTP"]), authority=_AUTHORITY, path=_PATH)
def test_any_http_url_is_normalised_or_refused_typed(scheme: str, authority: str, path: str) -> None:
    """With every host allowed, the allowlist check parses and normalises without connecting."""
    try:
        wire = check_url_allowed(f"{scheme}://{authority}/{path}", ("*",))
    except MMFrontError as exc:
        assert isinstance(exc, ValidationError) and exc.parameter == "multi_modal_data"
    else:
        assert wire.isascii() and wire.startswith(("http://", "https://"))


def test_the_fuzzed_root_is_readable(connector: MediaConnector) -> None:
    """The fuzz reaches the file reader itself, not only the parser."""
    root = Path(connector.config.allowed_local_media_path or "")
    assert connector.fetch_bytes(f"file://{root}/a.png", timeout=1.0) == b"not really a png"
    assert connector.fetch_bytes("a.png", timeout=1.0) == b"not really a png"
