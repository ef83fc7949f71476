"""What the lane tests share: requests built alike for two preprocessors, and the codec's bytes
of their inputs (equal frames mean byte-identical tensors, dtypes, field layouts, hashes and
placeholders)."""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path
from typing import Any

from PIL import Image

from mmfront.config import MultiModalConfig
from mmfront.inputs import MultiModalInputs
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.registry import create_processor
from mmfront.preprocess import InputPreprocessor
from mmfront.processing.executors import LocalProcessExecutor
from mmfront.testing.media import natural_image
from mmfront.wire import MsgpackEncoder

COMPARED = ("prompt_token_ids", "mm_kwargs", "mm_hashes", "mm_placeholders")


def png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def wire(inputs: MultiModalInputs) -> list[bytes]:
    return [bytes(f) for f in MsgpackEncoder().encode({key: inputs[key] for key in COMPARED})]  # type: ignore[literal-required]


def prompt(pre: InputPreprocessor, n: int) -> list[int]:
    placeholder = pre.processor.get_placeholder_str("image", 0)
    return pre.tokenizer.encode("Look: " + " and ".join([placeholder] * n) + " now.")


def items(kind: str, tags: list[int], connector: MediaConnector) -> list[Any]:
    images = [natural_image(48, 40, tag=t) for t in tags]
    if kind == "pil":
        return images
    return [connector.load_image(png(im), budget=DecodeBudget(1 << 30)) for im in images]


def build_with_a_thread(model_dir: str, config: MultiModalConfig, *, model_id: str) -> Any:
    """A lane spec's ``built_by`` whose build leaves a thread running in the lane parent."""
    threading.Thread(target=threading.Event().wait, daemon=True).start()
    return create_processor(model_dir, config, model_id=model_id)


def wait_started(lanes: LocalProcessExecutor) -> list[int]:
    """The lanes' pids, once every lane is up."""
    deadline = time.monotonic() + 240
    while None in lanes.pids():
        assert time.monotonic() < deadline, "the lanes did not start"
        time.sleep(0.1)
    return [pid for pid in lanes.pids() if pid is not None]


def ended(pid: int) -> bool:
    """Whether process ``pid`` has ended: gone, or a zombie whose parent has not reaped it yet."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def wait_ended(pid: int) -> None:
    deadline = time.monotonic() + 30
    while not ended(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs"
        time.sleep(0.02)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))
