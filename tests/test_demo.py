"""`mmfront demo` (what `make demo` runs): the main job end to end, including a drift recovery."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmfront.cli import main


def test_demo_runs_the_main_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MMFRONT_HOME", str(tmp_path))
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "req-1: 276 prompt tokens, 1 image(s); sent 1 with data, 0 as cache references" in out
    assert "req-2: 545 prompt tokens, 2 image(s); sent 1 with data, 1 as cache references" in out
    assert "sent 0 with data, 2 as cache references / resent 2 with data, 0 as cache references" in out
    assert "1 resend(s)" in out and "3 of 3 requests admitted by the engine" in out
    assert out.count("engine has pixel_values (1, 3, 896, 896)") == 5
