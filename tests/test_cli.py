"""The ``mmfront`` command line: version, help on every option, plain-text help, ``bench --only``."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import mmfront
from mmfront.cli import build_parser, main

# RST that argparse would print verbatim: ``literal``, :role:`target`, `interpreted text`_.
RST_MARKUP = re.compile(r"``|:[a-z]+:`|`_\b|\.\. [a-z]+::")


def _parsers(parser: argparse.ArgumentParser | None = None, prefix: str = "mmfront") -> Iterator[
        tuple[str, argparse.ArgumentParser]]:
    """Every parser of the command line, sub-commands' own sub-commands included (``fixtures list``)."""
    parser = parser or build_parser()
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prefix} {name}")


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"mmfront {mmfront.__version__}\n"


def test_version_through_the_module_entry_point() -> None:
    done = subprocess.run([sys.executable, "-m", "mmfront.cli", "--version"], capture_output=True, text=True,
                          timeout=120, check=False)
    assert (done.returncode, done.stdout) == (0, f"mmfront {mmfront.__version__}\n"), done.stderr


def test_the_parsers_are_the_expected_ones() -> None:
    assert [name for name, _ in _parsers()] == ["mmfront", "mmfront serve", "mmfront demo", "mmfront bench",
                                                "mmfront worker", "mmfront models", "mmfront fixtures",
                                                "mmfront fixtures list", "mmfront fixtures build"]


@pytest.mark.parametrize(("name", "parser"), list(_parsers()), ids=lambda v: v if isinstance(v, str) else "")
def test_every_option_has_help(name: str, parser: argparse.ArgumentParser) -> None:
    missing = [a.option_strings or a.dest for a in parser._actions if not (a.help and a.help.strip())]
    assert missing == [], f"{name}: options without help"


@pytest.mark.parametrize(("name", "parser"), list(_parsers()), ids=lambda v: v if isinstance(v, str) else "")
def test_help_is_plain_text(name: str, parser: argparse.ArgumentParser) -> None:
    text = parser.format_help()
    assert parser.description and parser.description.split()[0] in text
    assert RST_MARKUP.findall(text) == [], f"{name} --help:\n{text}"


def test_rst_pattern_catches_the_markup_it_guards_against() -> None:
    assert RST_MARKUP.findall("run ``demo`` with :class:`Foo` and `link`_") == ["``", "``", ":class:`", "`_"]
    assert RST_MARKUP.findall("run 'mmfront demo' (default: ./benchmarks)") == []


def test_main_help_lists_both_commands_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--version" in out and "serve" in out and "demo" in out and "bench" in out


@pytest.fixture
def bench_folder(tmp_path: Path) -> Iterator[Path]:
    """A benchmarks folder with a minimal harness and two benchmarks that only print their name."""
    (tmp_path / "_harness.py").write_text("class Report:\n    rows = []\n")
    for name in ("alpha", "beta_cache"):
        (tmp_path / f"bench_{name}.py").write_text(f"def run(report, quick):\n    print('ran {name}', quick)\n")
    saved = list(sys.path)
    yield tmp_path
    sys.path[:] = saved
    sys.modules.pop("_harness", None)


def test_bench_only_runs_the_matching_benchmarks(bench_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--dir", str(bench_folder), "--only", "cache", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "== bench_beta_cache\nran beta_cache True\n" in out
    assert "alpha" not in out
    assert out.endswith("0 measurements, 0 below target\n")


def test_bench_only_with_a_whole_name_runs_that_benchmark_alone(bench_folder: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    (bench_folder / "bench_alphabet.py").write_text("def run(report, quick):\n    print('ran alphabet', quick)\n")
    assert main(["bench", "--dir", str(bench_folder), "--only", "alpha"]) == 0
    out = capsys.readouterr().out
    assert "ran alpha False" in out and "alphabet" not in out
    assert main(["bench", "--dir", str(bench_folder), "--only", "alph"]) == 0
    out = capsys.readouterr().out
    assert "ran alpha False" in out and "ran alphabet False" in out


def test_bench_runs_a_benchmark_that_defines_dataclasses(bench_folder: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    (bench_folder / "bench_options.py").write_text(
        "from __future__ import annotations\nfrom dataclasses import dataclass\n\n@dataclass\nclass Options:\n"
        "    minutes: float = 10.0\n\ndef run(report, quick):\n    print('ran options', Options().minutes)\n")
    try:
        assert main(["bench", "--dir", str(bench_folder), "--only", "options"]) == 0
    finally:
        sys.modules.pop("bench_options", None)
    assert "ran options 10.0" in capsys.readouterr().out


def test_bench_runs_everything_without_only(bench_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--dir", str(bench_folder)]) == 0
    out = capsys.readouterr().out
    assert "ran alpha False" in out and "ran beta_cache False" in out


def test_bench_only_matching_nothing_is_an_error_naming_the_benchmarks(bench_folder: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--dir", str(bench_folder), "--only", "alpha", "hashng"])
    assert exc.value.code == "mmfront bench: --only hashng matches no benchmark; known benchmarks: alpha, beta_cache"
    assert "ran" not in capsys.readouterr().out


def test_bench_only_matching_nothing_exits_non_zero_from_the_command_line(bench_folder: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mmfront.cli", "bench", "--dir", str(bench_folder), "--only", "nope"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert "--only nope matches no benchmark; known benchmarks: alpha, beta_cache" in done.stderr
    assert done.stdout == ""


def test_bench_only_needs_a_name() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--only"])
    assert exc.value.code == 2


def test_bench_without_a_harness_says_to_pass_dir(tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--dir", str(tmp_path)])
    assert isinstance(exc.value.code, str) and "pass --dir" in exc.value.code and str(tmp_path) in exc.value.code


def test_bench_lists_the_real_benchmarks_when_only_matches_nothing() -> None:
    repo_benchmarks = Path(__file__).parents[1] / "benchmarks"
    names = sorted(p.stem.removeprefix("bench_") for p in repo_benchmarks.glob("bench_*.py"))
    assert {"cache", "hashing", "processing", "updates"} <= set(names)
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--dir", str(repo_benchmarks), "--only", "no-such-benchmark"])
    assert exc.value.code == ("mmfront bench: --only no-such-benchmark matches no benchmark; "
                              f"known benchmarks: {', '.join(names)}")


def test_models_refuses_a_class_outside_the_survey() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["models", "--only", "NoSuchProcessor"])
    assert str(exc.value.code).startswith("mmfront models: NoSuchProcessor is not a processor of the survey")


def test_worker_names_the_transports_it_knows() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["worker", "unused-model", "--input", "ipc://a", "--output", "ipc://b", "--transport", "pigeon"])
    assert str(exc.value.code) == "mmfront worker: unknown --transport 'pigeon'; known: zmq"


def test_worker_needs_a_frontend_by_handshake_or_by_sockets() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["worker", "unused-model"])
    assert str(exc.value.code).startswith("mmfront worker: give a frontend to serve: --data-parallel-address")


def test_worker_takes_a_hub_id_and_says_what_to_do_when_it_is_not_cached() -> None:
    with pytest.raises(SystemExit) as exc:  # the suite runs with HF_HUB_OFFLINE=1 (tests/conftest.py)
        main(["worker", "tiny-org/absent", "--data-parallel-address", "127.0.0.1"])
    assert str(exc.value.code).startswith("mmfront worker: MODEL 'tiny-org/absent' is not a folder, and the hub "
                                          "repository is not in the Hugging Face cache (HF_HUB_CACHE) (HF_HUB_OFFLINE "
                                          "is set). Download it where the network allows")


def test_worker_takes_vllms_handshake_options() -> None:
    from mmfront.cli import build_parser

    args = build_parser().parse_args(["worker", "m", "--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port",
                                      "29551"])
    assert (args.data_parallel_address, args.data_parallel_rpc_port, args.input) == ("10.0.0.1", 29551, [])
