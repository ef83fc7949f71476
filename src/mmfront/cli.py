"""The ``mmfront`` command: ``demo`` runs the main job on the embedded default model,
``bench`` runs the benchmarks in ``benchmarks/``.

Help strings are plain text (no RST markup), since argparse prints them as they are.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from mmfront import __version__

DESCRIPTION = (
    "mmfront, a vLLM-style multimodal frontend. 'mmfront demo' runs the main job end to end on the "
    "embedded default model (an offline Gemma 3 processor at real sizes); 'mmfront bench' runs the "
    "benchmarks and prints each speed goal as a ratio against a baseline measured in the same run."
)

BENCH_PREFIX = "bench_"


def _find_benchmarks(directory: str | None) -> Path:
    candidates = [Path(directory)] if directory else [Path.cwd() / "benchmarks", Path(__file__).parents[2] / "benchmarks"]
    for path in candidates:
        if (path / "_harness.py").is_file():
            return path.resolve()
    raise SystemExit(f"mmfront bench: benchmarks folder not found (looked in {[str(c) for c in candidates]}); "
                     "pass --dir with the folder holding _harness.py and bench_*.py")


def _select(modules: list[Path], only: list[str] | None) -> list[Path]:
    """The modules whose name contains one of ``only``; a key matching nothing is an error, so a
    typo does not silently run fewer benchmarks than asked for."""
    if not only:
        return modules
    names = [m.stem.removeprefix(BENCH_PREFIX) for m in modules]
    unmatched = [key for key in only if not any(key in name for name in names)]
    if unmatched:
        raise SystemExit(f"mmfront bench: --only {' '.join(unmatched)} matches no benchmark; "
                         f"known benchmarks: {', '.join(names) or '(none)'}")
    return [m for m, name in zip(modules, names) if any(key in name for key in only)]


def cmd_bench(args: argparse.Namespace) -> int:
    folder = _find_benchmarks(args.dir)
    modules = _select(sorted(folder.glob(f"{BENCH_PREFIX}*.py")), args.only)
    sys.path.insert(0, str(folder))
    from _harness import Report

    report = Report()
    for path in modules:
        print(f"== {path.stem}", flush=True)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.run(report, quick=args.quick)
    missed = [r for r in report.rows if r.ok is False]
    print(f"\n{len(report.rows)} measurements, {len(missed)} below target")
    return 1 if (missed and args.strict) else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from mmfront.demo import run_demo

    return run_demo(verbose=args.verbose)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; every option carries a help string."""
    parser = argparse.ArgumentParser(prog="mmfront", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"mmfront {__version__}",
                        help="print the mmfront version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="demo or bench; 'mmfront COMMAND --help' lists its options")
    demo = sub.add_parser("demo", help="run the main job on the embedded default model",
                          description="Send three chat requests with images from the frontend (P0) to an "
                                      "in-process engine receiver (P1): a miss, a partial hit, and a full hit "
                                      "after P1's cache is cleared, which the client recovers from by resending.")
    demo.add_argument("-v", "--verbose", action="store_true", help="also print the first prompt ids of each request")
    demo.set_defaults(func=cmd_demo)
    bench = sub.add_parser("bench", help="run the benchmarks and print ratios against same-run baselines",
                           description="Run every bench_*.py in the benchmarks folder and print one line per "
                                       "measurement; a speed goal ends in 'ok' or 'MISS'.")
    bench.add_argument("--dir", metavar="FOLDER",
                       help="benchmarks folder holding _harness.py (default: ./benchmarks, then the one next to "
                            "the installed source)")
    bench.add_argument("--only", nargs="+", metavar="NAME",
                       help="run only benchmarks whose name contains one of these (e.g. hashing cache); "
                            "a name matching no benchmark is an error")
    bench.add_argument("--quick", action="store_true", help="fewer repeats: faster, noisier numbers")
    bench.add_argument("--strict", action="store_true", help="exit 1 when a measurement misses its target")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
