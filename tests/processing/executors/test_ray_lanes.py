"""Ray lanes give the same inputs, byte for byte, as processing in place."""

from __future__ import annotations

from pathlib import Path

import pytest
from lane_inputs import items, prompt, wire

from mmfront import MultiModalConfig
from mmfront.preprocess import InputPreprocessor


@pytest.mark.slow
@pytest.mark.hf_version(">=5.15", reason="the Ray path is tested once, under the newest transformers: nothing in it "
                        "depends on the transformers version, and the local lanes test the lanes' processing under both")
def test_ray_lanes_give_the_same_inputs_as_in_place(gemma3_dir: Path, in_place: InputPreprocessor) -> None:
    ray = pytest.importorskip("ray", reason="Ray is the optional extra mmfront[ray], which `make test` installs")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        config = MultiModalConfig(mm_processing_lanes=2, mm_lane_executor="ray", mm_processor_cache_gb=0)
        with InputPreprocessor(gemma3_dir, config) as pre:
            for kind, tags in (("pil", [1, 2, 3]), ("png", [4, 5, 4])):
                ids = prompt(pre, len(tags))
                got = pre.preprocess(ids, {"image": items(kind, tags, pre.connector)})
                want = in_place.preprocess(ids, {"image": items(kind, tags, in_place.connector)})
                assert wire(got) == wire(want)
    finally:
        ray.shutdown()
