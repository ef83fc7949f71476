"""`mmfront demo` (what `make demo` runs): the main job end to end through `mmfront serve` and OpenAI's
client, on a reduced workload."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmfront.cli import main
from mmfront.demo import generate_workload, read_workload
from mmfront.errors import ConfigError


@pytest.mark.slow
def test_a_reduced_demo_runs_the_main_job_and_checks_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MMFRONT_HOME", str(tmp_path))
    assert main(["demo", "--num-requests", "12", "--json"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out[out.index("{"):])
    assert summary["requests"] == 12 and summary["tokens"] == 12 * 8
    assert summary["checks"] == {"every request answered once": True,
                                 "4 answers' text equals transformers' generate, decoded": True}
    assert summary["streamed"] == 6 and summary["first_token_p50_ms"] > 0
    assert summary["p0_cache_hit_rate"] > 0 and summary["encoder_cache_hit_rate"] > 0
    assert summary["cache_saved_bytes"] > 0 and summary["wire_bytes"] > summary["cache_saved_bytes"] / 10
    assert set(summary["stage_seconds"]) == {"load", "hash", "cache", "hf", "updates", "encode", "send"}


def test_the_generated_workload_is_what_the_issue_describes() -> None:
    workload = generate_workload(200)
    assert len(workload) == 200
    slots = [part["image_url"]["url"] for r in workload for part in r.messages[-1]["content"] if "image_url" in part]
    counts = [sum("image_url" in p for p in r.messages[-1]["content"]) for r in workload]
    assert min(counts) == 1 and max(counts) == 3
    repeated = len(slots) - len(set(slots))
    assert 0.3 < repeated / len(slots) < 0.5
    assert any(u.startswith("data:image/png") for u in slots) and any(u.startswith("data:image/jpeg") for u in slots)
    assert [m["role"] for m in workload[0].messages] == ["system", "user", "assistant", "user"]


def test_a_requests_file_is_read_and_bad_lines_are_named(tmp_path: Path) -> None:
    good = tmp_path / "requests.jsonl"
    good.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}) + "\n\n")
    [request] = read_workload(good)
    assert request.max_tokens == 3 and request.request_id == "demo-0"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": []}\n{"nope": 1}\n')
    with pytest.raises(ConfigError, match=r"bad.jsonl:2 needs a \"messages\" list"):
        read_workload(bad)
