"""The ``mmfront`` command: ``serve`` is the OpenAI-compatible server, ``demo`` runs the main job
on the embedded default model, ``worker`` is the reference engine, ``bench`` runs the benchmarks
in ``benchmarks/``, ``models`` surveys which HF processors mmfront serves (``docs/models.md``),
``fixtures`` writes an offline folder of a served family to try ``serve`` on.

Help strings are plain text (no RST markup), since argparse prints them as they are. Parsing
imports nothing heavy (no torch, transformers or numpy: ``mmfront --help`` answers at once);
each command imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from mmfront._version import __version__
from mmfront.config import DEFAULT_RPC_PORT, CacheType, MultiModalConfig
from mmfront.errors import ConfigError
from mmfront.flags import add_options, flag, port, values
from mmfront.process_end import run_and_end_the_process
from mmfront.serve.args import add_serve_parser, route_serve_argv, serve_argv

DESCRIPTION = (
    "mmfront, a vLLM-style multimodal frontend. 'mmfront serve MODEL' is the OpenAI-compatible server that "
    "takes the place of 'vllm serve'; 'mmfront demo' runs the main job end to end on the "
    "embedded default model (an offline Gemma 3 processor at real sizes); 'mmfront bench' runs the "
    "benchmarks and prints each speed goal as a ratio against a baseline measured in the same run."
)

BENCH_PREFIX = "bench_"

EngineDtype = Literal["float32", "bfloat16", "float16"]


@dataclass(frozen=True)
class WorkerOptions:
    """``mmfront worker``'s flags: how the reference engine meets its frontends and runs the model.
    Its cache flags take the defaults of the configuration fields they mirror."""

    model: str = field(metadata=flag(positional=True, metavar="MODEL"))
    """Model folder (config.json, weights, processor), or a hub id read from the HF cache
    (HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE honoured) and downloaded where missing."""
    transport: str = field(default="zmq", metadata=flag(metavar="NAME"))
    """How to reach the frontends, one of mmfront.engine.transports.ENGINE_TRANSPORTS (zmq: vLLM's ZMQ sockets)."""
    input: list[str] = field(default_factory=list, metadata=flag(repeat=True, metavar="ADDR"))
    """A frontend's request socket (ipc://... or tcp://HOST:PORT); repeat once per frontend."""
    output: list[str] = field(default_factory=list, metadata=flag(repeat=True, metavar="ADDR"))
    """A frontend's output socket; repeat once per frontend, in the order of --input."""
    data_parallel_address: str | None = field(default=None, metadata=flag(metavar="HOST"))
    """Meet the frontend through vLLM's start-up handshake at this host, as a headless engine (vLLM's
    'vllm serve --headless' option)."""
    data_parallel_rpc_port: int = field(default=DEFAULT_RPC_PORT, metadata=flag(parse=port, metavar="PORT"))
    """The frontend's handshake port (vLLM's option)."""
    handshake: list[str] = field(default_factory=list, metadata=flag(repeat=True, metavar="ADDR"))
    """A frontend's handshake address (ipc://... or tcp://HOST:PORT); repeat once per frontend."""
    local: bool = field(default=False, metadata=flag())
    """Greet the --handshake frontends as an engine of their own host, not a headless one."""
    engine_index: int = field(default=0, metadata=flag(metavar="N"))
    """This engine's index."""
    cache: CacheType = field(default=MultiModalConfig.mm_processor_cache_type, metadata=flag())
    """The frontend's processor cache type, which this engine mirrors."""
    cache_gb: float = field(default=MultiModalConfig.mm_processor_cache_gb, metadata=flag(metavar="GB"))
    """Processor cache size; must equal the frontend's (0 turns the cache off)."""
    shm_name: list[str] | None = field(default=None, metadata=flag(repeat=True, metavar="NAME"))
    """With --cache shm: a frontend's segment name; repeat once per frontend, in the order of --input."""
    device: str | None = field(default=None, metadata=flag(metavar="DEVICE"))
    """torch device (default: cuda when available, else cpu)."""
    dtype: EngineDtype | None = field(default=None, metadata=flag())
    """Model dtype (default: the folder's config.json)."""
    json: bool = field(default=False, metadata=flag())
    """Print the closing statistics as one JSON line."""


def _find_benchmarks(directory: str | None) -> Path:
    candidates = [Path(directory)] if directory else [Path.cwd() / "benchmarks", Path(__file__).parents[2] / "benchmarks"]
    for path in candidates:
        if (path / "_harness.py").is_file():
            return path.resolve()
    raise SystemExit(f"mmfront bench: benchmarks folder not found (looked in {[str(c) for c in candidates]}); "
                     "pass --dir with the folder holding _harness.py and bench_*.py")


def _select(modules: list[Path], only: list[str] | None) -> list[Path]:
    """The modules whose name contains one of ``only`` (a key that is a whole name selects that
    one alone: ``serve`` is not ``serving``); a key matching nothing is an error, so a typo does
    not silently run fewer benchmarks than asked for."""
    if not only:
        return modules
    names = [m.stem.removeprefix(BENCH_PREFIX) for m in modules]
    unmatched = [key for key in only if not any(key in name for name in names)]
    if unmatched:
        raise SystemExit(f"mmfront bench: --only {' '.join(unmatched)} matches no benchmark; "
                         f"known benchmarks: {', '.join(names) or '(none)'}")

    def selects(key: str, name: str) -> bool:
        return key == name if key in names else key in name

    return [m for m, name in zip(modules, names) if any(selects(key, name) for key in only)]


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
        sys.modules[path.stem] = module  # as an import would: dataclasses look their module up there
        spec.loader.exec_module(module)
        module.run(report, quick=args.quick)
    missed = [r for r in report.rows if r.ok is False]
    print(f"\n{len(report.rows)} measurements, {len(missed)} below target")
    return 1 if (missed and args.strict) else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from mmfront.demo import run_demo
    from mmfront.errors import ConfigError

    try:
        return run_demo(model=args.model, requests_file=args.requests, cache=args.cache, lanes=args.lanes,
                        engine=args.engine, as_json=args.json, num_requests=args.num_requests)
    except ConfigError as e:
        print(f"mmfront demo: {e}", file=sys.stderr)
        return 2


def cmd_models(args: argparse.Namespace) -> int:
    import tempfile

    from mmfront.testing.api import HOOKED_PROCESSORS, render_table, replace_table, survey_all

    names = args.only or list(HOOKED_PROCESSORS)
    unknown = sorted(set(names) - set(HOOKED_PROCESSORS))
    if unknown:
        raise SystemExit(f"mmfront models: {', '.join(unknown)} is not a processor of the survey; known: "
                         f"{', '.join(HOOKED_PROCESSORS)}")

    def progress(outcome: object) -> None:
        if args.verbose:
            print(outcome, file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="mmfront-models-") as tmp:
        table = render_table(survey_all(Path(tmp), names, progress))
    if args.write is None:
        print(table, end="")
        return 0
    path = Path(args.write)
    path.write_text(replace_table(path.read_text(encoding="utf-8"), table), encoding="utf-8")
    print(f"mmfront models: wrote the table of {len(names)} processors into {path}")
    return 0


def cmd_fixtures_list(args: argparse.Namespace) -> int:
    from mmfront.testing.api import families

    for family in families().values():
        model_type = f" ({family.model_type})" if family.model_type else ""
        print(f"{family.name}\t{family.source}{model_type}{', --weights' if family.weights else ''}")
    return 0


def cmd_fixtures_build(args: argparse.Namespace) -> int:
    from mmfront.testing.api import build_family_folder

    try:
        folder = build_family_folder(args.family, Path(args.dir), with_weights=args.weights)
    except ConfigError as e:
        print(f"mmfront fixtures: {e}", file=sys.stderr)
        return 2
    engines = "" if args.weights else " --data-parallel-size-local 0  # no weights: in front of headless engines"
    print(f"mmfront fixtures: wrote {args.family} to {folder}; serve it with:\n  mmfront serve {folder}{engines}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from mmfront.errors import AddressInUseError, ConfigError, HandshakeError
    from mmfront.serve.api_servers import serve_api_servers
    from mmfront.serve.args import plan_from_args
    from mmfront.serve.banner import log_version_and_args
    from mmfront.serve.launcher import serve, show_logs

    try:
        plan = plan_from_args(args)
    except ConfigError as e:
        print(f"mmfront serve: {e}", file=sys.stderr)
        return 2
    show_logs()
    log_version_and_args(plan)
    try:
        return serve_api_servers(plan) if plan.settings.api_server_count > 1 else serve(plan)
    except ConfigError as e:
        print(f"mmfront serve: {e}", file=sys.stderr)
        return 2
    except (HandshakeError, AddressInUseError) as e:
        print(f"mmfront serve: {e}", file=sys.stderr)
        return 1


def cmd_worker(args: argparse.Namespace) -> int:
    from mmfront.engine.transports import ENGINE_TRANSPORTS
    from mmfront.engine.worker import run_worker, stop_with_parent
    from mmfront.errors import ModelFilesNotFoundError
    from mmfront.hub import resolve_model_folder

    opts = WorkerOptions(**values(WorkerOptions, args))
    handshake = [*opts.handshake]
    if opts.data_parallel_address:
        handshake.append(f"tcp://{opts.data_parallel_address}:{opts.data_parallel_rpc_port}")
    if not opts.input and not handshake:
        raise SystemExit("mmfront worker: give a frontend to serve: --data-parallel-address (vLLM's handshake), "
                         "--handshake ADDR, or --input and --output")
    if len(opts.input) != len(opts.output):
        raise SystemExit(f"mmfront worker: {len(opts.input)} --input and {len(opts.output)} --output addresses; "
                         "give one --input and one --output per frontend (they pair in order)")
    shm_names = opts.shm_name or []
    if opts.cache == "shm" and opts.cache_gb > 0 and len(shm_names) != len(opts.input) + len(handshake):
        raise SystemExit(f"mmfront worker: --cache shm needs one --shm-name per frontend "
                         f"({len(opts.input) + len(handshake)}), "
                         f"got {len(shm_names)}; they pair with the addresses in order")
    config = MultiModalConfig(mm_processor_cache_gb=opts.cache_gb, mm_processor_cache_type=opts.cache)
    connect = ENGINE_TRANSPORTS.get(opts.transport)
    if connect is None:
        raise SystemExit(f"mmfront worker: unknown --transport {opts.transport!r}; known: {', '.join(ENGINE_TRANSPORTS)}")
    try:
        model = resolve_model_folder(opts.model, weights=True)
    except ModelFilesNotFoundError as e:
        raise SystemExit(f"mmfront worker: {e}") from e
    frontends = [connect(i, o) for i, o in zip(opts.input, opts.output)]
    if opts.local:
        stop_with_parent()  # a local engine's server is its parent: it never outlives it
    stats = run_worker(model, frontends, config, engine_index=opts.engine_index, handshake=handshake,
                       local=opts.local,
                       shm_name=shm_names if opts.cache == "shm" else None, device=opts.device, dtype=opts.dtype)
    if opts.json:
        print(json.dumps(dataclasses.asdict(stats)), flush=True)
    else:
        print(f"mmfront worker: {stats.requests} requests, {stats.tokens} tokens, encoder cache "
              f"{stats.encoder_hits}/{stats.encoder_lookups} hits", flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The whole command line; every option carries a help string."""
    parser = argparse.ArgumentParser(prog="mmfront", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"mmfront {__version__}",
                        help="print the mmfront version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="serve, demo, bench, worker, models or fixtures; 'mmfront COMMAND --help' lists its options")
    add_serve_parser(sub).set_defaults(func=cmd_serve)
    demo = sub.add_parser("demo", help="run the main job end to end on the embedded default model",
                          description="Start 'mmfront serve' on a real model (it starts 'mmfront worker'), send "
                                      "chat requests with images over HTTP with OpenAI's client, 8 in flight, half "
                                      "streamed, check the text of a sample of answers against transformers' own "
                                      "generate, and print where the time went. Exits 0 only if every check held.")
    demo.add_argument("--model", metavar="DIR",
                      help="model folder with weights (default: the embedded Gemma 3 at real sizes, built offline)")
    demo.add_argument("--requests", metavar="FILE.jsonl",
                      help="requests to send, one JSON object per line with a 'messages' list (default: 200 "
                           "generated chat requests with 1-3 images each, 40%% of images repeated)")
    demo.add_argument("--num-requests", type=int, default=200, metavar="N",
                      help="how many requests to generate when no --requests file is given (default 200)")
    demo.add_argument("--cache", choices=["lru", "shm", "none"], default="lru",
                      help="the processor cache between frontend and engine (default lru)")
    demo.add_argument("--lanes", type=int, metavar="N",
                      help="processes for HF processing of cache misses (default: cores - 1; 0: in-process)")
    demo.add_argument("--engine", metavar="tcp://HOST:PORT",
                      help="the server starts no engine and waits there (its handshake address) for a headless one: "
                           "mmfront worker MODEL --data-parallel-address HOST --data-parallel-rpc-port PORT")
    demo.add_argument("--json", action="store_true", help="print the summary as JSON instead of a table")
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
    worker = sub.add_parser("worker", help="run a reference engine: a real HF model behind mmfront's receiver",
                            description="Meet one or more frontends (API servers) through vLLM's start-up "
                                        "handshake (--data-parallel-address/--data-parallel-rpc-port, as "
                                        "'vllm serve --headless'; or --handshake), or connect to their sockets, and "
                                        "serve their requests with the model in MODEL (a local folder with "
                                        "weights, or a hub id as 'mmfront serve' takes it), greedy decoding of one sequence per request; a request "
                                        "that asks for more (temperature above 0, n above 1, penalties, "
                                        "logprobs, structured outputs, ...) is refused with the field it names, "
                                        "never answered greedily. For several frontends repeat --input and "
                                        "--output (and --shm-name), paired in order; each frontend keeps its own "
                                        "processor cache. Stops on SIGTERM or Ctrl-C.")
    add_options(worker, WorkerOptions)
    worker.set_defaults(func=cmd_worker)
    models = sub.add_parser("models", help="which HF processors mmfront serves, proven against HF's own output",
                            description="Build a small offline folder for every HF processor class with a "
                                        "replace_<modality>_token hook, run mmfront and the HF processor on the same "
                                        "prompts and items, and print the coverage table (served and proven, or "
                                        "refused with the reason and the error a user gets).")
    models.add_argument("--write", metavar="FILE.md",
                        help="replace the table between the coverage markers of this file (docs/models.md) "
                             "instead of printing it")
    models.add_argument("--only", nargs="+", metavar="CLASS",
                        help="survey only these processor classes (e.g. LlavaProcessor)")
    models.add_argument("--verbose", action="store_true", help="print each outcome as it is found")
    models.set_defaults(func=cmd_models)
    fixtures = sub.add_parser("fixtures", help="write an offline model folder of a served family, to try mmfront serve",
                              description="'mmfront fixtures list' names every family; 'mmfront fixtures build FAMILY "
                                          "DIR' writes its offline folder (config.json, processor, tokenizer, chat "
                                          "template; with --weights a small random-weight model the reference "
                                          "worker runs) with the builders the test suite proves, so nothing is "
                                          "downloaded. A family is a fixture kind (gemma3, qwen2_5_vl, ...) or an "
                                          "HF processor class of docs/models.md's table (LlavaProcessor, ...).")
    actions = fixtures.add_subparsers(dest="action", required=True, metavar="ACTION", help="list or build")
    actions.add_parser("list", help="name every family, its source and whether it takes --weights",
                       description="One line per family: its name, where it comes from (a fixture kind with its "
                                   "model type, or an HF processor class) and ', --weights' where it has a "
                                   "random-weight model.").set_defaults(func=cmd_fixtures_list)
    build = actions.add_parser("build", help="write FAMILY's offline folder into DIR",
                               description="Write FAMILY's offline folder into DIR (a new or empty folder) and "
                                           "print the command that serves it.")
    build.add_argument("family", metavar="FAMILY", help="a name 'mmfront fixtures list' prints")
    build.add_argument("dir", metavar="DIR", help="the folder to write (new, or empty)")
    build.add_argument("--weights", action="store_true",
                       help="add a random-weight model, which the reference worker runs (the families the list "
                            "marks ', --weights')")
    build.set_defaults(func=cmd_fixtures_build)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The ``mmfront`` command on ``argv`` (``None``: this process's command line, as the console
    script and ``python -m mmfront.cli`` run it; then ``serve`` and ``worker`` end the process
    at once when they are done, :func:`run_and_end_the_process`)."""
    own_process = argv is None
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    routed = None
    if argv[:1] == ["serve"]:
        try:
            routed = route_serve_argv(serve_argv(argv))
        except ConfigError as e:
            parser.error(str(e))
        argv = routed.frontend
    args, extras = parser.parse_known_args(argv)
    if routed is not None:
        args.engine_args, args.engine_flags = routed.engine, routed.engine_flags
    refuse = vars(args).get("refuse_unknown")
    if refuse is not None:
        refuse(extras, args)
    elif extras:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    if own_process and args.func in (cmd_serve, cmd_worker):
        return run_and_end_the_process(lambda: int(args.func(args)))
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
