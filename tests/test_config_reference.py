"""The configuration reference is generated from the configuration fields: docs/index.md's
``MultiModalConfig`` table and docs/serving.md's ``mmfront serve`` flag table are the generated
ones, every field is documented once, and a knob written once (one field) reaches ``mmfront serve
--help``, the docs table and the plan.

After changing a field, rewrite the tables with ``MMFRONT_WRITE_DOCS=1 pytest tests/test_config_reference.py``."""

from __future__ import annotations

import contextlib
import io
import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest

from mmfront.cli import build_parser, main
from mmfront.config import MultiModalConfig
from mmfront.errors import ConfigError
from mmfront.flags import between, field_table, flag, replace_between
from mmfront.serve.args import ServeFlags, add_serve_parser, plan_from_args, serve_flag_table

DOCS = Path(__file__).resolve().parents[1] / "docs"
TABLES = [(DOCS / "index.md", "fields: MultiModalConfig", lambda: field_table(MultiModalConfig)),
          (DOCS / "serving.md", "flags: mmfront serve", serve_flag_table)]


@pytest.mark.parametrize(("path", "marker", "render"), TABLES, ids=[marker for _, marker, _ in TABLES])
def test_the_docs_table_is_the_generated_one(path: Path, marker: str, render: object) -> None:
    assert callable(render)
    table = render()
    text = path.read_text(encoding="utf-8")
    if os.environ.get("MMFRONT_WRITE_DOCS") == "1":
        path.write_text(replace_between(text, marker, table), encoding="utf-8")
        text = path.read_text(encoding="utf-8")
    assert between(text, marker) == table, (f"{path.name}'s <!-- {marker} --> table is stale; rewrite it with "
                                            "MMFRONT_WRITE_DOCS=1 pytest tests/test_config_reference.py")


def documented_fields() -> list[str]:
    table = between((DOCS / "index.md").read_text(encoding="utf-8"), "fields: MultiModalConfig")
    return [re.findall(r"`([a-z_]+)`", line.split("|")[1])[0] for line in table.splitlines() if line.startswith("| `")]


def test_every_config_field_is_documented_once() -> None:
    documented = documented_fields()
    assert sorted(documented) == sorted(f.name for f in fields(MultiModalConfig))
    assert len(documented) == len(set(documented))


def test_every_flag_of_mmfront_serve_is_in_the_docs_table() -> None:
    table = between((DOCS / "serving.md").read_text(encoding="utf-8"), "flags: mmfront serve")
    import argparse

    serve = add_serve_parser(argparse.ArgumentParser(prog="mmfront").add_subparsers())
    options = {o for a in serve._actions for o in a.option_strings if o not in ("-h", "--help")}
    # the 42 flags mmfront serve had before they were generated, issue 32's --model-impl and
    # --mm-device-do-normalize, issue 33's API-server, tool and reasoning flags, and its observability
    # flags (--disable-log-stats, --enable/--disable-log-outputs, -log-deltas, -prompt-tokens-details,
    # --sse-keep-alive-interval, --enable/--disable-per-request-metrics), its --tool-strict-level and
    # --reasoning-effort-map, issue 35's hub flags (--revision, --tokenizer-revision, --download-dir,
    # --hf-token) and issue 36's HTTP front door (--h11-max-header-count, --max-url-length,
    # --header-read-timeout, --body-read-timeout, --http-timeout-keep-alive, --max-connections,
    # --max-body-bytes-in-flight, --max-chat-messages, --max-content-parts)
    # and its --engine and --vllm-command, and /v1/messages' --anthropic-disabled-thinking-effort
    assert len(options) == 128
    # --config is not a field: it stands for a file's flags, read before parsing (the text above the table)
    assert "`--config FILE.yaml`" in (DOCS / "serving.md").read_text(encoding="utf-8")
    assert sorted(o for o in options - {"--config"} if f"`{o}`" not in table) == []


@dataclass(frozen=True)
class ConfigWithAThrowawayKnob(MultiModalConfig):
    mm_throwaway_knob: int = field(default=7, metadata=flag(metavar="N"))
    """A knob that exists only in this test: how often to throw away."""


THROWAWAY = ServeFlags(config=ConfigWithAThrowawayKnob)


def throwaway_parser() -> object:
    import argparse

    parser = argparse.ArgumentParser(prog="mmfront")
    add_serve_parser(parser.add_subparsers(), THROWAWAY)
    return parser


def test_a_new_flag_is_one_field(tmp_path: Path) -> None:
    """Adding a ``vllm serve`` flag that sets a configuration field: the field alone puts it in
    ``mmfront serve --help``, in docs/serving.md's table and in the plan."""
    import argparse

    parser = throwaway_parser()
    assert isinstance(parser, argparse.ArgumentParser)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser.parse_args(["serve", "--help"])
    help_text = " ".join(out.getvalue().split())
    assert "--mm-throwaway-knob N A knob that exists only in this test: how often to throw away. (default: 7)" in help_text
    assert ("| `--mm-throwaway-knob` | `7` | A knob that exists only in this test: how often to throw away. | "
            "`ConfigWithAThrowawayKnob.mm_throwaway_knob` |") in serve_flag_table(THROWAWAY).splitlines()
    assert "--mm-throwaway-knob" not in serve_flag_table()
    assert ("| `mm_throwaway_knob` | `7` | A knob that exists only in this test: how often to throw away. | "
            "`--mm-throwaway-knob` |") in field_table(ConfigWithAThrowawayKnob).splitlines()
    plan = plan_from_args(parser.parse_args(["serve", str(tmp_path), "--mm-throwaway-knob", "3"]), THROWAWAY)
    assert isinstance(plan.config, ConfigWithAThrowawayKnob) and plan.config.mm_throwaway_knob == 3
    default = plan_from_args(parser.parse_args(["serve", str(tmp_path)]), THROWAWAY)
    assert isinstance(default.config, ConfigWithAThrowawayKnob) and default.config.mm_throwaway_knob == 7


def test_a_flag_name_taken_twice_is_refused_when_the_parser_is_built() -> None:
    import argparse

    @dataclass(frozen=True)
    class Clash(MultiModalConfig):
        host_name: str = field(default="x", metadata=flag(name="--host"))
        """A second --host."""

    with pytest.raises(ConfigError, match="'--host' is already a flag of ServeSettings"):
        add_serve_parser(argparse.ArgumentParser().add_subparsers(), ServeFlags(config=Clash))


def test_the_worker_flags_mirror_the_config_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["worker", "m"])
    assert (args.cache, args.cache_gb, args.data_parallel_rpc_port) == (
        MultiModalConfig().mm_processor_cache_type, MultiModalConfig().mm_processor_cache_gb, 29550)
    with pytest.raises(SystemExit):
        main(["worker", "--help"])
    text = capsys.readouterr().out
    for option in ["--transport", "--input", "--output", "--data-parallel-address", "--data-parallel-rpc-port",
                   "--handshake", "--local", "--engine-index", "--cache", "--cache-gb", "--shm-name", "--device",
                   "--dtype", "--json"]:
        assert option in text
