"""docs/index.md's configuration table lists every field of ``MultiModalConfig``, and only
those: a knob nobody can read about is a knob nobody sets, and a documented one that is gone
misleads."""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from mmfront.config import MultiModalConfig

INDEX = Path(__file__).resolve().parents[1] / "docs" / "index.md"


def documented_fields() -> list[str]:
    text = INDEX.read_text()
    section = text.split("## Configuration: `MultiModalConfig`", 1)[1].split("\n## ", 1)[0]
    table = section.split("| field |", 1)[1].split("\n\n", 1)[0]
    names = []
    for line in table.splitlines():
        if line.startswith("| `"):
            names += re.findall(r"`([a-z_]+)`", line.split("|")[1])
    return names


def test_every_config_field_is_documented_once() -> None:
    documented = documented_fields()
    assert sorted(documented) == sorted(f.name for f in fields(MultiModalConfig))
    assert len(documented) == len(set(documented))
