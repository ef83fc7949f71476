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
from mmfront.flags import add_options, check_unique, expand_argv, flag_table, options, values
from mmfront.hub import ModelSource, resolve_model_folder, resolve_tokenizer_folder
from mmfront.serve.settings import LocalEngineOptions, ServePlan, ServeSettings
from mmfront.serve.vllm_flags import refusal

DESCRIPTION = (
    "Serve MODEL (a local folder, or a Hugging Face hub id read from the local HF cache and downloaded where "
    "missing) over vLLM's OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, "
    "/v1/models, /health, /version, /metrics), in place of 'vllm serve'. By default it starts its engines "
    "itself (--data-parallel-size 'mmfront worker' processes on this host, met through vLLM's start-up "
    "handshake); with --data-parallel-size-local 0 it starts none and waits for headless engines, vLLM's "
    "('vllm serve MODEL --headless') or mmfront's ('mmfront worker MODEL --data-parallel-address HEAD'), on "
    "--data-parallel-address:--data-parallel-rpc-port. The flags keep vLLM's names; a 'vllm serve' flag that "
    "configures only the engines is refused with a message saying it belongs on the engines' command line, "
    "and any other flag it does not take is refused by name. "
    "The engines it starts are mmfront's reference engine ('mmfront worker': HF transformers, greedy "
    "decoding of one sequence per request, no batching): it refuses with 400 what it cannot honour "
    "(temperature above 0, n above 1, penalties, logprobs, structured outputs, logit bias, ...: "
    "docs/engine.md, 'What the reference engine refuses'); for sampling and real serving, run vLLM's engine "
    "cores ('vllm serve MODEL --headless ...') behind --data-parallel-size-local 0."
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
        description=DESCRIPTION, allow_abbrev=False)
    serve.add_argument("--config", metavar="FILE.yaml", dest="config_file",
                       help="read options from a YAML file, as vllm serve --config: 'key: value' is --key value; "
                            "the command line's options win")
    groups = flags.groups()
    check_unique([cls for _, cls in groups])
    for title, cls in groups:
        add_options(serve.add_argument_group(title), cls, mark_own=True)
    serve.set_defaults(refuse_unknown=lambda extras: refuse_unknown(serve, extras))
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


def refuse_unknown(parser: argparse.ArgumentParser, extras: Sequence[str]) -> None:
    """End the command (exit 2, as argparse) naming each option ``mmfront serve`` does not take, and
    where an engine-only one belongs."""
    flags = [e for e in extras if e.startswith("-")]
    if not flags:
        parser.error(f"unrecognized arguments: {' '.join(extras)}")
    parser.error("\n  ".join(["refused:", *(refusal(flag) for flag in flags)]))


def plan_from_args(args: argparse.Namespace, flags: ServeFlags = SERVE_FLAGS) -> ServePlan:
    """The launcher's plan for parsed ``mmfront serve`` arguments; a value the configuration
    refuses raises :class:`~mmfront.errors.ConfigError` naming it."""
    if getattr(args, "config_file", None) is not None:
        raise ConfigError("--config is read before parsing: pass the command line through serve_argv().")
    settings = flags.settings(**values(flags.settings, args))
    parallel = flags.parallel(**values(flags.parallel, args))
    source = flags.source(**values(flags.source, args))
    config = flags.config(**values(flags.config, args))
    config = replace(config, tokenizer=resolve_tokenizer_folder(config.tokenizer, source))
    # the reference workers load the weights from this folder; vLLM's engines download their own
    folder = resolve_model_folder(settings.model, revision=source.revision, download_dir=source.download_dir,
                                  token=source.hf_token, weights=parallel.local_ranks > 0)
    if config.mm_processor_cache_type == "shm" and config.mm_processor_cache_gb > 0 and (
            not parallel.all_local or parallel.data_parallel_size > 1 or settings.api_server_count > 1):
        raise ConfigError("--mm-processor-cache-type shm serves one engine on this host from one API server (its "
                          "shared memory is theirs); use lru with engines elsewhere, --data-parallel-size or "
                          "--api-server-count above 1 (lru keeps one mirror per rank and API server).")
    engine = flags.engine(**values(flags.engine, args), dtype=None if config.dtype == "auto" else config.dtype)
    return flags.plan(settings, config, parallel, engine, source=source, resolved_model=folder, **values(flags.plan, args))


__all__ = ["DESCRIPTION", "SERVE_FLAGS", "ServeFlags", "add_serve_parser", "plan_from_args", "refuse_unknown",
           "serve_argv", "serve_flag_table"]
