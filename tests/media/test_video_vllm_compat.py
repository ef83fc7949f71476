"""Video keys equal vLLM 0.33's ``mm_hash`` on the same clips, checked against the real vLLM.

Two levels: vLLM's parser and hasher on mmfront's frames and metadata (needs the vLLM peer venv),
and vLLM's own loader decoding the same file with OpenCV (needs ``opencv-python-headless`` in that
venv too, as vLLM itself does): frames, metadata and key all equal.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av", reason="videos are decoded with PyAV: pip install 'mmfront[video]'")

from mmfront.config import MultiModalConfig
from mmfront.hashing import get_mm_hashes
from mmfront.media import DecodeBudget, load_video_bytes
from mmfront.parse import MultiModalDataParser
from mmfront.testing.media import make_video
from mmfront.testing.peer import SKIP_REASON, vllm_peer_python

PEER = vllm_peer_python()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(PEER is None, reason=SKIP_REASON)]

MODEL_ID = "org/video-model"

_FRAMING = """
import json, sys
import numpy as np
from vllm.multimodal.hasher import MultiModalHasher
from vllm.multimodal.media.base import MediaWithBytes
from vllm.multimodal.parse import MultiModalDataParser
out = []
for case in json.load(open(sys.argv[1])):
    frames = np.load(case["frames"])
    data = open(case["clip"], "rb").read()
    loaded = MediaWithBytes((frames, case["metadata"]), data)
    parser = MultiModalDataParser(video_needs_metadata=case["needs_metadata"])
    items = parser.parse_mm_data({"video": [loaded]})["video"]
    out.append(MultiModalHasher.hash_kwargs("blake3", model_id=sys.argv[2], video=items.get_item_for_hash(0)))
print(json.dumps(out))
"""

_LOADER = """
import hashlib, json, sys
from vllm.multimodal.hasher import MultiModalHasher
from vllm.multimodal.media.image import ImageMediaIO
from vllm.multimodal.media.video import VideoMediaIO
from vllm.multimodal.parse import MultiModalDataParser
out = []
for case in json.load(open(sys.argv[1])):
    data = open(case["clip"], "rb").read()
    loaded = VideoMediaIO(ImageMediaIO(), **case["options"]).load_bytes(data)
    frames, metadata = loaded.media
    items = MultiModalDataParser().parse_mm_data({"video": [loaded]})["video"]
    key = MultiModalHasher.hash_kwargs("blake3", model_id=sys.argv[2], video=items.get_item_for_hash(0))
    out.append({"key": key, "metadata": metadata, "frames": hashlib.sha256(frames.tobytes()).hexdigest()})
print(json.dumps(out))
"""

CLIPS = {
    "h264-mp4-3s-10fps": {"seconds": 3.0, "fps": 10},
    "vp9-webm-2s-12fps": {"seconds": 2.0, "fps": 12, "codec": "libvpx-vp9", "container": "webm"},
    "mpeg4-avi-5s-6fps": {"seconds": 5.0, "fps": 6, "codec": "mpeg4", "container": "avi"},
    "tiny-h264": {"seconds": 1.0, "fps": 10, "width": 16, "height": 16},  # one kept frame is smaller than the file
    "qwen2_vl-h264-7s-9fps": {"seconds": 7.0, "fps": 9},
    "qwen3_vl-h264-7s-9fps": {"seconds": 7.0, "fps": 9},
    "qwen3_vl-mkv-3s-25fps": {"seconds": 3.0, "fps": 25, "container": "matroska"},
}
OPTIONS = {"h264-mp4-3s-10fps": {"num_frames": 8}, "vp9-webm-2s-12fps": {"num_frames": 32},
           "mpeg4-avi-5s-6fps": {"num_frames": 4, "fps": 1}, "tiny-h264": {"num_frames": 1},
           # vLLM's Qwen loaders, as its connector picks them for Qwen2-VL's and Qwen3-VL's video processors
           "qwen2_vl-h264-7s-9fps": {"video_backend": "qwen2_vl"}, "qwen3_vl-h264-7s-9fps": {"video_backend": "qwen3_vl"},
           "qwen3_vl-mkv-3s-25fps": {"video_backend": "qwen3_vl", "fps": 3, "max_frames": 7}}


def _peer(script: str, cases: list[dict[str, object]], tmp_path: Path) -> list[object]:
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    assert PEER is not None
    done = subprocess.run([str(PEER), "-c", script, str(tmp_path / "cases.json"), MODEL_ID], capture_output=True,
                          text=True, timeout=300, check=False, env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"}
                          | _pythonpath())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _pythonpath() -> dict[str, str]:
    import os

    return {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}


def _mmfront(tmp_path: Path) -> dict[str, tuple[str, object]]:
    """Each clip's file, mmfront's loaded item and its key."""
    config = MultiModalConfig()
    out = {}
    for name, spec in CLIPS.items():
        clip = tmp_path / f"{name}.bin"
        clip.write_bytes(make_video(**spec))  # type: ignore[arg-type]
        item = load_video_bytes(clip.read_bytes(), config=config, budget=DecodeBudget(10**9),
                                media_io_kwargs={"video": OPTIONS[name]})
        items = MultiModalDataParser().parse_mm_data({"video": item})["video"]
        key = get_mm_hashes({"video": items.get_all_items_for_hash()}, MODEL_ID, "blake3")["video"][0]
        out[name] = (key, item)
    return out


def test_video_keys_equal_vllms_on_mmfronts_frames_and_metadata(tmp_path: Path) -> None:
    ours = _mmfront(tmp_path)
    cases = []
    for name, (_, item) in ours.items():
        np.save(tmp_path / f"{name}.npy", item.media)
        for needs_metadata in (False, True):
            cases.append({"clip": str(tmp_path / f"{name}.bin"), "frames": str(tmp_path / f"{name}.npy"),
                          "metadata": item.info["metadata"], "needs_metadata": needs_metadata})
    theirs = _peer(_FRAMING, cases, tmp_path)
    assert theirs == [key for key, _ in ours.values() for _ in (False, True)]


def test_vllms_own_loader_gives_the_same_frames_metadata_and_keys(tmp_path: Path) -> None:
    assert PEER is not None
    has_cv2 = subprocess.run([str(PEER), "-c", "import cv2"], capture_output=True, env=_pythonpath(), timeout=120,
                             check=False)
    if has_cv2.returncode != 0:
        pytest.skip("vLLM's video loader needs opencv-python-headless in the vLLM venv (pip install it there)")
    ours = _mmfront(tmp_path)
    cases = [{"clip": str(tmp_path / f"{name}.bin"), "options": OPTIONS[name]} for name in CLIPS]
    theirs = _peer(_LOADER, cases, tmp_path)
    import hashlib

    for (name, (key, item)), vllm in zip(ours.items(), theirs):
        assert vllm["metadata"] == item.info["metadata"], name
        assert vllm["frames"] == hashlib.sha256(item.media.tobytes()).hexdigest(), name
        assert vllm["key"] == key, name
