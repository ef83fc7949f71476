"""Issue 22, class 10: the process running out of a resource is a ResourceError, never the request's.

With its open files exhausted, a legitimate request failed as if it were malformed ("Too many open
files" typed as ``ChatFormatError``, ``MediaPathError``, ``MediaFetchError``, ``ProcessorError``);
an ``ENOMEM`` from a memfd or its mapping surfaced as a bare ``OSError`` or as "the peer is
gone"; a ``/dev/shm`` filled by someone else after the shm cache checked it would kill the
process with ``SIGBUS`` on the first write. Each is now a ``ResourceError`` naming the resource
and the setting to change, and never a ``ValidationError``.
"""

from __future__ import annotations

import errno
import json
import os
import sys
import textwrap
from collections.abc import Callable
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import ImageFile

import preloaded
from mmfront.cache import _shm_ring as shm_ring
from mmfront.cache.shm_cache import ShmObjectStoreSenderCache
from mmfront.config import MultiModalConfig
from mmfront.errors import ResourceError, ValidationError, resource_error
from mmfront.media import DecodeBudget, load_image_bytes
from mmfront.preprocess import InputPreprocessor
from mmfront.processing.hf import call_hf
from mmfront.testing.media import make_image
from mmfront.wire import memfd, pipe, shared_buffer

MiB = 1 << 20


def _os_error(code: int) -> Callable[..., Any]:
    def fail(*args: object, **kwargs: object) -> Any:
        raise OSError(code, os.strerror(code))
    return fail


def _is_resource(exc: BaseException, resource: str, setting_words: str) -> None:
    assert isinstance(exc, ResourceError), repr(exc)
    assert not isinstance(exc, ValidationError)
    assert exc.resource == resource and setting_words in exc.setting and setting_words in str(exc)
    assert exc.retryable


# --- open files, for real: RLIMIT_NOFILE in a subprocess ---------------------------------------

_EMFILE_SCRIPT = textwrap.dedent("""
    import json, os, resource, socket, sys, tempfile, threading
    from pathlib import Path
    from mmfront.config import MultiModalConfig
    from mmfront.preprocess import InputPreprocessor
    from mmfront.testing.media import make_image
    from mmfront.testing.models import build_model_folder

    folder = build_model_folder("gemma3", Path(tempfile.mkdtemp()))
    root = tempfile.mkdtemp()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    pre = InputPreprocessor(folder, MultiModalConfig(allowed_local_media_path=root,
                                                     allowed_media_domains=("127.0.0.1",)))
    text = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    pre.preprocess(text)  # warm: the template, the tokenizer, lazy imports
    sources = {"file": "file://" + root + "/{n}.png", "path": "{n}.png",
               "http": "http://127.0.0.1:%d/{n}.png" % port}
    for n in range(len(sources)):
        make_image(20 + n, 10, seed=n).save(os.path.join(root, f"{n}.png"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    hog = []
    try:
        while True:
            hog.append(os.open("/dev/null", os.O_RDONLY))
    except OSError:
        pass
    out = {}
    for n, (name, url) in enumerate(sources.items()):
        part = {"type": "image_url", "image_url": {"url": url.format(n=n)}}
        try:
            pre.preprocess([{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}])
            out[name] = ["ok", ""]
        except Exception as exc:
            out[name] = [type(exc).__name__, str(exc), getattr(exc, "resource", None)]
    for fd in hog:
        os.close(fd)
    print(json.dumps(out))
""")


def test_exhausted_open_files_fail_a_legitimate_request_with_a_resource_error() -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(os.path.abspath(p) for p in sys.path if p))
    done = preloaded.run([sys.executable, "-c", _EMFILE_SCRIPT], env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = json.loads(done.stdout.strip().splitlines()[-1])
    for source, (kind, message, *rest) in outcomes.items():
        assert kind == "ResourceError", (source, kind, message)
        assert rest == ["open files"] and "ulimit -n" in message, (source, message)


# --- open files and memory where a catch-all turned them into request errors -----------------


def test_a_chat_template_failing_for_open_files_is_not_a_chat_format_error(
    gemma3_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pre = InputPreprocessor(gemma3_dir, MultiModalConfig())
    tokenizer = pre.processor.info.tokenizer
    monkeypatch.setattr(tokenizer, "apply_chat_template", _os_error(errno.EMFILE))
    with pytest.raises(ResourceError) as info:
        pre.preprocess([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    _is_resource(info.value, "open files", "ulimit -n")


@pytest.mark.parametrize("failure", [OSError(errno.ENOMEM, "Cannot allocate memory"), MemoryError()])
def test_an_hf_processor_out_of_memory_is_not_a_processor_error(failure: BaseException) -> None:
    def processor(**kwargs: object) -> None:
        raise failure

    with pytest.raises(ResourceError) as info:
        call_hf(processor, what="Gemma3Processor", data_desc="1 image")
    _is_resource(info.value, "memory", "max_media_request_decode_bytes")


def test_an_image_decode_out_of_memory_is_not_a_corrupt_image(monkeypatch: pytest.MonkeyPatch) -> None:
    from io import BytesIO

    buf = BytesIO()
    make_image(16, 8).save(buf, format="JPEG")

    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(ImageFile.ImageFile, "load", no_memory)
    monkeypatch.setattr(simplejpeg, "decode_jpeg", no_memory)  # libjpeg-turbo's decode falls back to Pillow's
    item = load_image_bytes(buf.getvalue(), config=MultiModalConfig(), budget=DecodeBudget(MiB))
    with pytest.raises(ResourceError) as info:
        _ = item.media
    _is_resource(info.value, "memory", "container")


# --- memfd and its mapping -----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "code", "resource"), [
    ("memfd_create", errno.ENOMEM, "memory"), ("memfd_create", errno.EMFILE, "open files"),
    ("ftruncate", errno.ENOSPC, "shared memory"), ("pwrite", errno.ENOMEM, "memory"),
])
def test_writing_a_memfd_without_resources_is_a_resource_error(
    monkeypatch: pytest.MonkeyPatch, name: str, code: int, resource: str
) -> None:
    monkeypatch.setattr(memfd.os, name, _os_error(code))
    with pytest.raises(ResourceError) as info:
        memfd.write_sealed([memoryview(b"x" * 100)])
    assert info.value.resource == resource


def test_mapping_a_memfd_without_memory_is_a_resource_error(monkeypatch: pytest.MonkeyPatch) -> None:
    fd = memfd.write_sealed([memoryview(b"x" * 100)])
    try:
        def no_memory(*args: object, **kwargs: object) -> None:
            raise RuntimeError("unable to mmap 128 bytes from file </proc/self/fd/9>: Cannot allocate memory (12)")

        monkeypatch.setattr(torch, "from_file", no_memory)
        with pytest.raises(ResourceError) as info:
            memfd.map_sealed(fd, [100])
        _is_resource(info.value, "memory", "container")
    finally:
        os.close(fd)


def test_a_lane_pipe_out_of_memory_is_not_a_gone_peer(monkeypatch: pytest.MonkeyPatch) -> None:
    """send_frames typed every OSError as TransportError ("the peer is gone")."""
    left, right = Pipe()
    out = shared_buffer.OutBuffer()
    try:
        with monkeypatch.context() as patch:
            patch.setattr(shared_buffer.os, "memfd_create", _os_error(errno.ENOMEM))
            with pytest.raises(ResourceError) as info:
                pipe.send_frames(left, [np.zeros(1 << 16, dtype=np.uint8).data], out=out)
            assert info.value.resource == "memory"
        with monkeypatch.context() as patch:
            patch.setattr(shared_buffer.os, "ftruncate", _os_error(errno.ENOSPC))
            with pytest.raises(ResourceError) as info:
                pipe.send_frames(left, [np.zeros(1 << 16, dtype=np.uint8).data], out=out)
            assert info.value.resource == "shared memory"
        with monkeypatch.context() as patch:
            patch.setattr(pipe.socket, "fromfd", _os_error(errno.EMFILE))
            with pytest.raises(ResourceError) as info:
                pipe.send_frames(left, [np.zeros(1 << 16, dtype=np.uint8).data], out=out)
            assert info.value.resource == "open files"
    finally:
        out.close()
        left.close()
        right.close()


# --- a full /dev/shm --------------------------------------------------------------------------


def test_a_full_dev_shm_is_a_resource_error_at_creation_not_a_sigbus_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """statvfs saw room, but the space went to someone else before the segment got it: the
    segment's pages are reserved at creation, so the shortage is an error now, not a SIGBUS on the
    first write into a page /dev/shm no longer has."""
    reserved: list[tuple[int, int]] = []
    real = os.posix_fallocate

    def record(fd: int, offset: int, length: int) -> None:
        reserved.append((offset, length))
        real(fd, offset, length)

    monkeypatch.setattr(shm_ring.os, "posix_fallocate", record)
    cache = ShmObjectStoreSenderCache(MiB)
    try:
        assert reserved and reserved[0][0] == 0 and reserved[0][1] >= MiB
    finally:
        cache.close()
    before = set(os.listdir(shm_ring.SHM_DIR))
    monkeypatch.setattr(shm_ring.os, "posix_fallocate", _os_error(errno.ENOSPC))
    with pytest.raises(ResourceError) as info:
        ShmObjectStoreSenderCache(MiB)
    _is_resource(info.value, "shared memory", "--shm-size")
    assert set(os.listdir(shm_ring.SHM_DIR)) == before  # nothing left behind


def test_an_exhausted_open_file_table_when_creating_the_shm_cache_is_a_resource_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(shm_ring._posixshmem, "shm_open", _os_error(errno.EMFILE))
    with pytest.raises(ResourceError) as info:
        ShmObjectStoreSenderCache(MiB)
    _is_resource(info.value, "open files", "ulimit -n")


# --- the classifier ------------------------------------------------------------------------------


def test_only_resource_shortages_are_classified() -> None:
    assert resource_error(OSError(errno.ENOENT, "No such file"), doing="x") is None
    assert resource_error(ValueError("bad"), doing="x") is None
    try:
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as inner:
            raise ImportError("cannot import name") from inner
    except ImportError as outer:
        found = resource_error(outer, doing="Rendering the chat template")
    assert found is not None and found.resource == "open files"
    assert str(found).startswith("Rendering the chat template failed: the process is out of open files")
