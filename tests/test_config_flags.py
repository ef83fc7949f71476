"""``mmfront.flags``: a field's flag is read from the field (name, type, choices, default, help
from the docstring under it), the value reaches the field as parsed, and ``DataParallelConfig``
(the engines' place, now beside ``MultiModalConfig``) resolves vLLM's defaults."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pytest

from mmfront.config import DEFAULT_RPC_PORT, DataParallelConfig, MultiModalConfig, chat_template_text
from mmfront.errors import ConfigError
from mmfront.flags import add_options, field_docs, field_table, flag, markdown, options, plain_text, values
from mmfront.serve.settings import ServeSettings


@dataclass(frozen=True)
class Knobs:
    size: int = field(default=3, metadata=flag(aliases=("-s",), metavar="N"))
    """How many, as ``N``; see :class:`~mmfront.config.MultiModalConfig`."""
    mode: Literal["fast", "slow"] = field(default="fast", metadata=flag(vllm=False))
    """The ``fast`` or ``slow`` way."""
    kinds: tuple[str, ...] | None = field(default=None, metadata=flag(metavar="KIND"))
    """Several kinds at once."""
    on: bool = field(default=True, metadata=flag(negation="--no-on"))
    """Whether it is on."""
    extra: dict[str, int] = field(default_factory=dict, metadata=flag(metavar="JSON", example="'{\"a\": 1}'"))
    """A JSON object."""
    hidden: int = 0
    """A field without a flag."""


@dataclass(frozen=True)
class MoreKnobs(Knobs):
    more: float = field(default=0.5, metadata=flag())
    """A subclass's own knob."""


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_options(parser, MoreKnobs, mark_own=True)
    return parser.parse_args(list(argv))


def test_the_docstring_under_each_field_is_read_through_the_bases() -> None:
    docs = field_docs(MoreKnobs)
    assert docs["size"] == "How many, as ``N``; see :class:`~mmfront.config.MultiModalConfig`."
    assert (docs["more"], docs["hidden"]) == ("A subclass's own knob.", "A field without a flag.")


def test_only_fields_with_flag_metadata_are_flags() -> None:
    assert [(o.dest, o.names) for o in options(MoreKnobs)] == [
        ("size", ("--size", "-s")), ("mode", ("--mode",)), ("kinds", ("--kinds",)), ("on", ("--on", "--no-on")),
        ("extra", ("--extra",)), ("more", ("--more",))]


def test_types_choices_and_defaults_come_from_the_field() -> None:
    args = parse()
    assert values(MoreKnobs, args) == {"size": 3, "mode": "fast", "kinds": None, "on": True, "extra": {}, "more": 0.5}
    args = parse("-s", "7", "--mode", "slow", "--kinds", "a", "b", "--no-on", "--extra", '{"a": 1}', "--more", "2")
    assert MoreKnobs(**values(MoreKnobs, args)) == MoreKnobs(size=7, mode="slow", kinds=("a", "b"), on=False,
                                                             extra={"a": 1}, more=2.0)


@pytest.mark.parametrize(("argv", "message"), [
    (["--mode", "medium"], "argument --mode: invalid choice: 'medium'"),
    (["--size", "x"], "argument --size/-s: invalid int value: 'x'"),
    (["--extra", "[1]"], "argument --extra: --extra takes a JSON object, e.g. '{\"a\": 1}'; got '[1]'"),
])
def test_a_bad_value_names_the_flag(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)
    assert message in capsys.readouterr().err


def test_help_is_the_docstring_as_plain_text_with_the_default() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, MoreKnobs, mark_own=True)
    helps = {a.option_strings[0]: a.help for a in parser._actions}
    assert helps["--size"] == "How many, as N; see MultiModalConfig. (default: 3)"
    assert helps["--mode"] == "The fast or slow way. (default: fast) (mmfront's own flag)"
    assert (helps["--on"], helps["--no-on"]) == ("Whether it is on.", "turn --on off")


def test_rst_becomes_markdown_in_the_tables() -> None:
    assert markdown("``a|b`` and :data:`mmfront.config.X` and :class:`~mmfront.config.Y`") == (
        "`a\\|b` and `mmfront.config.X` and `Y`")
    assert plain_text(":attr:`image_pixel_limit`, ``None``") == "image_pixel_limit, None"
    assert field_table(Knobs).splitlines()[2:4] == [
        "| `size` | `3` | How many, as `N`; see `MultiModalConfig`. | `--size` |",
        '| `mode` | `"fast"` | The `fast` or `slow` way. | `--mode` |']


def test_the_api_key_takes_one_key() -> None:
    parser = argparse.ArgumentParser()
    add_options(parser, ServeSettings)
    assert values(ServeSettings, parser.parse_args(["/m", "--api-key", "k"]))["api_key"] == "k"
    with pytest.raises(ConfigError, match="--api-key takes one key in mmfront serve, got 2"):
        values(ServeSettings, parser.parse_args(["/m", "--api-key", "k", "l"]))


def test_every_config_field_with_a_flag_has_a_docstring() -> None:
    for cls in (MultiModalConfig, DataParallelConfig, ServeSettings):
        assert [o.dest for o in options(cls) if not o.help] == []


def test_the_data_parallel_defaults_are_vllms() -> None:
    assert DataParallelConfig() == DataParallelConfig(1, 1, "127.0.0.1", DEFAULT_RPC_PORT)
    assert DEFAULT_RPC_PORT == 29550
    four = DataParallelConfig(4)
    assert (four.data_parallel_size_local, four.local_ranks, four.all_local) == (4, 4, True)
    headless = DataParallelConfig(2, 0)
    assert (headless.local_ranks, headless.all_local) == (0, False)
    with pytest.raises(ConfigError, match=r"data_parallel_size_local must be in \[0, data_parallel_size=1\], got 2"):
        DataParallelConfig(1, 2)
    with pytest.raises(ConfigError, match="data_parallel_rpc_port must be a port number, got 70000"):
        DataParallelConfig(data_parallel_rpc_port=70000)


def test_a_chat_template_is_its_text_or_a_files(tmp_path: Path) -> None:
    assert chat_template_text("{{ messages }}") == "{{ messages }}"
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}{% endfor %}")
    assert chat_template_text(str(path)) == "{% for m in messages %}{% endfor %}"
