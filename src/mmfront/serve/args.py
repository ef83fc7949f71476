"""``mmfront serve MODEL``'s command line: ``vllm serve``'s flag names for everything that
concerns the frontend, mmfront's own beside them, and a refusal naming every other ``vllm serve``
flag (:mod:`mmfront.serve.vllm_flags`), so nothing is silently ignored.

The flags are generated (:mod:`mmfront.flags`) from the fields of the classes that hold them
(:data:`SERVE_FLAGS`): :class:`~mmfront.serve.settings.ServeSettings` (HTTP),
:class:`~mmfront.hub.ModelSource` (where a hub id ``MODEL`` is found),
:class:`~mmfront.config.MultiModalConfig` (processing, caches, media),
:class:`~mmfront.config.DataParallelConfig` (where the engines are),
:class:`~mmfront.serve.settings.LocalEngineOptions` and :class:`~mmfront.serve.settings.ServePlan`
(the engines it starts, the waits). A flag's name, type, default, choices and help are its
field's, and so are the rows of docs/serving.md's flag table (:func:`serve_flag_table`). This
module imports nothing heavy, so ``mmfront --help`` answers at once.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from mmfront.config import DataParallelConfig, MultiModalConfig
from mmfront.errors import ConfigError
from mmfront.flags import Option, add_options, check_unique, expand_argv, flag_table, options, values
from mmfront.hub import ModelSource, resolve_model_folder, resolve_tokenizer_folder
from mmfront.serve.settings import LocalEngineOptions, ServePlan, ServeSettings
from mmfront.serve.vllm_engine import EngineKind, vllm_cli
from mmfront.serve.vllm_flags import ENGINE_FLAGS, SHARED_SERVE_FLAGS, refusal

DESCRIPTION = (
    "Serve MODEL (a local folder, or a Hugging Face hub id read from the local HF cache and downloaded where "
    "missing) over vLLM's OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, "
    "/v1/models, /health, /version, /metrics), in place of 'vllm serve'. By default it starts its engines "
    "itself: --data-parallel-size engine processes on this host, met through vLLM's start-up handshake. With "
    "--engine vllm (the default where vLLM is found: importable here, or 'vllm' on PATH, or --vllm-command) they "
    "are vLLM's own engine cores ('vllm serve MODEL --headless', one per rank), and every 'vllm serve' engine flag "
    "given here (--gpu-memory-utilization, --tensor-parallel-size, --distributed-executor-backend, ...) is passed "
    "on to them unchanged, with MODEL and the processing flags (--max-model-len, --limit-mm-per-prompt, ...). "
    "With --engine mmfront they are mmfront's reference engine ('mmfront worker': HF transformers, greedy "
    "decoding of one sequence per request, no batching), which refuses with 400 what it cannot honour "
    "(temperature above 0, n above 1, penalties, logprobs, structured outputs, logit bias, ...: docs/engine.md) "
    "and takes no engine flag. With --data-parallel-size-local 0 it starts none and waits for headless engines, "
    "vLLM's ('vllm serve MODEL --headless') or mmfront's ('mmfront worker MODEL --data-parallel-address HEAD'), on "
    "--data-parallel-address:--data-parallel-rpc-port. The flags keep vLLM's names; any other flag it does not "
    "take is refused by name."
)


@dataclass(frozen=True)
class ServeFlags:
    """The classes whose fields are ``mmfront serve``'s flags, one per part of the plan (a test
    may extend one with a field of its own)."""

    settings: type[ServeSettings] = ServeSettings
    config: type[MultiModalConfig] = MultiModalConfig
    parallel: type[DataParallelConfig] = DataParallelConfig
    engine: type[LocalEngineOptions] = LocalEngineOptions
    plan: type[ServePlan] = ServePlan
    source: type[ModelSource] = ModelSource

    def groups(self) -> list[tuple[str, type]]:
        """``--help``'s sections, in order, with the class each one's flags come from."""
        return [("HTTP server", self.settings), ("the model's files", self.source),
                ("requests and multimodal processing", self.config),
                ("engines", self.parallel), ("the engines mmfront starts", self.engine),
                ("waiting for the engines", self.plan)]


SERVE_FLAGS = ServeFlags()


def add_serve_parser(commands: Any, flags: ServeFlags = SERVE_FLAGS) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``mmfront`` command's sub-parsers, its flags generated from ``flags``'
    classes; unknown flags are answered by :func:`refuse_unknown`."""
    serve: argparse.ArgumentParser = commands.add_parser(
        "serve", help="an OpenAI-compatible HTTP server in place of 'vllm serve', with vLLM's flags",
        description=DESCRIPTION, epilog=engine_found(), allow_abbrev=False)
    serve.add_argument("--config", metavar="FILE.yaml", dest="config_file",
                       help="read options from a YAML file, as vllm serve --config: 'key: value' is --key value; "
                            "the command line's options win")
    groups = flags.groups()
    check_unique([cls for _, cls in groups])
    for title, cls in groups:
        add_options(serve.add_argument_group(title), cls, mark_own=True)
    serve.set_defaults(refuse_unknown=lambda extras, args: refuse_unknown(serve, extras, args))
    return serve


def serve_argv(argv: Sequence[str], flags: ServeFlags = SERVE_FLAGS) -> list[str]:
    """``mmfront serve``'s command line (``argv`` starts with ``serve``) as vLLM's parser rewrites a
    ``vllm serve`` one: ``--config FILE.yaml``, ``--snake_case`` names and dotted options
    (:func:`mmfront.flags.expand_argv`)."""
    known = {name for _, cls in flags.groups() for option in options(cls) for name in option.names}
    return expand_argv(argv, known)


def serve_flag_table(flags: ServeFlags = SERVE_FLAGS) -> str:
    """docs/serving.md's table of ``mmfront serve``'s flags."""
    return flag_table([cls for _, cls in flags.groups()])


@dataclass(frozen=True)
class RoutedArgv:
    """``mmfront serve``'s command line split as ``vllm serve`` would apply it: what this server parses
    (``frontend``), and what the vLLM engines it starts get after ``vllm serve`` (``engine``: MODEL as
    typed, then the engine flags and the flags the engine shares with the API server, each as typed);
    ``engine_flags``: the engine flags' names, refused where no vLLM engine is started."""

    frontend: list[str]
    engine: list[str]
    engine_flags: list[str]


def route_serve_argv(argv: Sequence[str], flags: ServeFlags = SERVE_FLAGS) -> RoutedArgv:
    """Route ``mmfront serve``'s command line (``argv`` starts with ``serve``, after :func:`serve_argv`):
    engine flags (:data:`~mmfront.serve.vllm_flags.ENGINE_FLAGS`) leave this server's command line for
    the engines'; the vLLM flags of the processing group and the API-server flags vLLM's engine reads
    (:data:`~mmfront.serve.vllm_flags.SHARED_SERVE_FLAGS`) go to both. Values are counted as vLLM's
    parser counts them; anything else stays for this server's parser to take or refuse."""
    taken: dict[str, tuple[Option, bool]] = {}
    for _, cls in flags.groups():
        for option in options(cls):
            shared = option.flag.vllm and (cls is flags.config or option.name in SHARED_SERVE_FLAGS)
            for name in option.names:
                taken[name] = (option, shared)
    frontend: list[str] = [argv[0]]
    engine: list[str] = []
    names: list[str] = []
    model: list[str] = []
    i = 1
    while i < len(argv):
        token = argv[i]
        name, inline = (token.split("=", 1)[0], True) if token.startswith("--") and "=" in token else (token, False)
        if name in taken:
            option, shared = taken[name]
            arity: int | str = 0 if option.is_bool else "+" if option.many and not option.flag.repeat else 1
        elif name in ENGINE_FLAGS:
            shared, arity = True, ENGINE_FLAGS[name]
            names.append(name)
        else:
            if not token.startswith("-") and not model:
                model.append(token)
            frontend.append(token)
            i += 1
            continue
        end = i + 1 if inline or arity == 0 else _values_end(argv, i + 1, arity)
        span = list(argv[i:end])
        if name not in taken:
            engine += span
        else:
            frontend += span
            if shared:
                engine += span
        i = end
    return RoutedArgv(frontend, model + engine, names)


def _values_end(argv: Sequence[str], start: int, arity: int | str) -> int:
    """Where an option's values end: one value, or every value up to the next option (``"+"``)."""
    end = start
    while end < len(argv) and (not argv[end].startswith("-") or _is_number(argv[end])):
        end += 1
        if arity != "+":
            break
    return end


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def engine_found() -> str:
    """``--help``'s closing line: which engine ``mmfront serve`` starts here by default."""
    cli = vllm_cli()
    if cli is None:
        return ("Here vLLM is not found: the engines started are mmfront's reference engine (mmfront worker); give "
                "--vllm-command to start vLLM's.")
    return f"Here the engines started are vLLM's engine cores: 'vllm serve MODEL --headless ...', run by {cli[0]}."


def engine_kind(engine: EngineKind | None, vllm_command: str | None) -> tuple[EngineKind, tuple[str, ...]]:
    """The engine ``mmfront serve`` starts and vLLM's CLI for it: ``engine`` as given (``vllm``
    without vLLM is a :class:`~mmfront.errors.ConfigError`), else ``vllm`` where vLLM is found."""
    cli = vllm_cli(vllm_command) if engine != "mmfront" else None
    if engine == "vllm" and cli is None:
        raise ConfigError("--engine vllm: vLLM is not found (not importable here, no 'vllm' on PATH); install it, or "
                          "give --vllm-command VENV/bin/vllm (or VENV/bin/python of the venv that holds it).")
    return ("vllm", cli) if cli is not None else ("mmfront", ())


def unrouted_engine_flags(args: argparse.Namespace) -> tuple[list[str], str]:
    """The engine flags of parsed ``args`` that no engine of this server takes, and why."""
    names = list(getattr(args, "engine_flags", ()))
    if not names:
        return [], ""
    local = args.data_parallel_size if args.data_parallel_size_local is None else args.data_parallel_size_local
    if local == 0:
        return names, "it starts none (--data-parallel-size-local 0)"
    if args.engine == "mmfront" or (args.engine is None and vllm_cli(args.vllm_command) is None):
        return names, ("it starts mmfront's reference engine (--engine mmfront), which takes no engine flag"
                       if args.engine == "mmfront" else "vLLM is not found, so it would start mmfront's reference "
                       "engine, which takes no engine flag (give --vllm-command)")
    return [], ""


def refuse_unknown(parser: argparse.ArgumentParser, extras: Sequence[str], args: argparse.Namespace) -> None:
    """End the command (exit 2, as argparse) naming each option ``mmfront serve`` does not take, and
    each engine flag no engine of this server takes, with where it belongs; nothing when all are taken."""
    unrouted, why = unrouted_engine_flags(args)
    flags = [e for e in extras if e.startswith("-")]
    stray = [e for e in extras if not e.startswith("-")]
    if not flags and not unrouted:
        if stray:
            parser.error(f"unrecognized arguments: {' '.join(stray)}")
        return
    lines = [refusal(flag, why) for flag in [*flags, *unrouted]]
    if stray:
        lines.append(f"unrecognized arguments: {' '.join(stray)}")
    parser.error("\n  ".join(["refused:", *lines]))


def plan_from_args(args: argparse.Namespace, flags: ServeFlags = SERVE_FLAGS) -> ServePlan:
    """The launcher's plan for parsed ``mmfront serve`` arguments (with ``args.engine_args`` and
    ``args.engine_flags`` from :func:`route_serve_argv` where the command line was routed); a value
    the configuration refuses raises :class:`~mmfront.errors.ConfigError` naming it."""
    if getattr(args, "config_file", None) is not None:
        raise ConfigError("--config is read before parsing: pass the command line through serve_argv().")
    unrouted, why = unrouted_engine_flags(args)
    if unrouted:
        raise ConfigError(" ".join(refusal(name, why) for name in unrouted))
    settings = flags.settings(**values(flags.settings, args))
    parallel = flags.parallel(**values(flags.parallel, args))
    source = flags.source(**values(flags.source, args))
    config = flags.config(**values(flags.config, args))
    config = replace(config, tokenizer=resolve_tokenizer_folder(config.tokenizer, source))
    engine = flags.engine(**values(flags.engine, args), dtype=None if config.dtype == "auto" else config.dtype)
    kind, cli = engine_kind(engine.engine, engine.vllm_command) if parallel.local_ranks else ("mmfront", ())
    engine = replace(engine, engine=kind, vllm_cli=cli,
                     vllm_args=tuple(getattr(args, "engine_args", None) or [settings.model]) if kind == "vllm" else ())
    # this server reads the processor, tokenizer and config from this folder, and the reference workers the
    # weights too; vLLM's engines get MODEL as the user gave it (vllm_args) and download their own
    folder = resolve_model_folder(settings.model, revision=source.revision, download_dir=source.download_dir,
                                  token=source.hf_token, weights=kind == "mmfront" and parallel.local_ranks > 0)
    if config.mm_processor_cache_type == "shm" and config.mm_processor_cache_gb > 0 and (
            not parallel.all_local or parallel.data_parallel_size > 1 or settings.api_server_count > 1
            or kind == "vllm"):
        raise ConfigError("--mm-processor-cache-type shm serves one engine on this host from one API server (its "
                          "shared memory is theirs, and an mmfront worker's only); use lru with vLLM's engines (--engine "
                          "vllm), engines elsewhere, --data-parallel-size or --api-server-count above 1 (lru keeps one "
                          "mirror per rank and API server).")
    return flags.plan(settings, config, parallel, engine, source=source, resolved_model=folder, **values(flags.plan, args))


__all__ = ["DESCRIPTION", "SERVE_FLAGS", "RoutedArgv", "ServeFlags", "add_serve_parser", "engine_kind",
           "plan_from_args", "refuse_unknown", "route_serve_argv", "serve_argv", "serve_flag_table",
           "unrouted_engine_flags"]
