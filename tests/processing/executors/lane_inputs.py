"""What the lane tests share: requests built alike for two preprocessors, and the codec's bytes
of their inputs (equal frames mean byte-identical tensors, dtypes, field layouts, hashes and
placeholders)."""

from __future__ import annotations

import io
import threading
from typing import Any

from PIL import Image

from mmfront.config import MultiModalConfig
from mmfront.inputs import MultiModalInputs
from mmfront.media import DecodeBudget, MediaConnector
from mmfront.models.registry import create_processor
from mmfront.preprocess import InputPreprocessor
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
