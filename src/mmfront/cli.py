"""The ``mmfront`` command: ``demo`` runs the main job on the embedded default model,
``bench`` runs the benchmarks in ``benchmarks/``."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def _find_benchmarks(directory: str | None) -> Path:
    candidates = [Path(directory)] if directory else [Path.cwd() / "benchmarks", Path(__file__).parents[2] / "benchmarks"]
    for path in candidates:
        if (path / "_harness.py").is_file():
            return path.resolve()
    raise SystemExit(f"benchmarks folder not found (looked in {[str(c) for c in candidates]}); pass --dir")


def cmd_bench(args: argparse.Namespace) -> int:
    folder = _find_benchmarks(args.dir)
    sys.path.insert(0, str(folder))
    from _harness import Report

    report = Report()
    modules = sorted(folder.glob("bench_*.py"))
    if args.only:
        modules = [m for m in modules if any(key in m.stem for key in args.only)]
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mmfront", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the main job on the embedded default model")
    demo.add_argument("-v", "--verbose", action="store_true")
    demo.set_defaults(func=cmd_demo)
    bench = sub.add_parser("bench", help="run the benchmarks and print ratios against same-run baselines")
    bench.add_argument("--dir", help="benchmarks folder (default: ./benchmarks)")
    bench.add_argument("--only", nargs="*", help="run only benchmarks whose name contains one of these")
    bench.add_argument("--quick", action="store_true", help="fewer repeats")
    bench.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    bench.set_defaults(func=cmd_bench)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
