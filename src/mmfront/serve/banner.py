"""What ``mmfront serve`` logs as it starts, in ``vllm serve``'s order and words: the version and
the model, the options that differ from their defaults (``--api-key`` redacted), the address it
listens on and every route with its methods. vLLM's ASCII logo is vLLM's; mmfront names itself
where vLLM does (``mmfront server version ...``, ``Starting mmfront server on ...``)."""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
from collections.abc import Iterable
from typing import Any

from mmfront import __version__
from mmfront.serve.settings import ServePlan, ServeSettings

logger = logging.getLogger("mmfront.serve.startup")

SENSITIVE = frozenset({"api_key", "hf_token"})
"""Options whose values are never logged (vLLM's ``_SENSITIVE_ARG_FIELDS`` that mmfront takes)."""
DERIVED = frozenset({"vllm_cli", "vllm_args"})
"""Fields the launcher derives, not options: not listed (the vLLM engines' command line repeats
options already listed by their own names, and would show a secret among them unredacted)."""


def non_default_args(plan: ServePlan) -> dict[str, Any]:
    """Every option of ``plan`` that differs from its default, by its field's name (the
    ``argparse`` destination, as vLLM's ``non-default args`` names them); secrets redacted."""
    found: dict[str, Any] = {}
    for part in (plan.settings, plan.config, plan.parallel, plan.engine, plan.source, plan):
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            if (dataclasses.is_dataclass(value) and not isinstance(value, type)) or f.name in DERIVED:
                continue  # a part of the plan, listed field by field; or derived
            default = (f.default if f.default is not dataclasses.MISSING
                       else f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            if value != default:
                found[f.name] = "***" if f.name in SENSITIVE else value
    return found


def log_version_and_args(plan: ServePlan) -> None:
    """vLLM's ``log_version_and_model`` and ``log_non_default_args``."""
    logger.info("mmfront server version %s, serving model %s", __version__, plan.settings.model)
    logger.info("non-default args: %s", non_default_args(plan))


def listen_address(settings: ServeSettings) -> str:
    """Where the server listens, as vLLM writes it (``http[s]://HOST:PORT`` or ``unix:PATH``)."""
    if settings.uds:
        return f"unix:{settings.uds}"
    host = settings.host or "0.0.0.0"
    try:
        if isinstance(ipaddress.ip_address(host), ipaddress.IPv6Address):
            host = f"[{host}]"
    except ValueError:
        pass  # a host name
    scheme = "https" if settings.ssl_keyfile and settings.ssl_certfile else "http"
    return f"{scheme}://{host}:{settings.port}"


def log_routes(address: str, routes: Iterable[Any]) -> None:
    """vLLM's ``Starting vLLM server on ...`` and ``Available routes are:``, one line per route."""
    logger.info("Starting mmfront server on %s", address)
    logger.info("Available routes are:")
    for route in routes:
        methods, path = getattr(route, "methods", None), getattr(route, "path", None)
        if methods is not None and path is not None:
            logger.info("Route: %s, Methods: %s", path, ", ".join(sorted(methods)))


def engines_banner(plan: ServePlan, engine_kind: str) -> str:
    """The launcher's start-up line: the model, the engines (how many are started here, of
    ``engine_kind``, and how many are awaited headless, at which address) and where HTTP is served."""
    settings, parallel = plan.settings, plan.parallel
    local, total = parallel.local_ranks, parallel.data_parallel_size
    engines = [f"{local} local {engine_kind}"] if local else []
    if total > local:
        engines.append(f"{total - local} headless at tcp://{parallel.data_parallel_address}:"
                       f"{parallel.data_parallel_rpc_port}")
    where = f"unix:{settings.uds}" if settings.uds else (
        f"{'https' if settings.ssl_certfile else 'http'}://{settings.host}:{settings.port}")
    return (f"mmfront serve: model {settings.model} (served as {', '.join(settings.model_names)}); engines: "
            f"{' + '.join(engines)}; API on {where}")


__all__ = ["DERIVED", "SENSITIVE", "engines_banner", "listen_address", "log_routes", "log_version_and_args", "logger", "non_default_args"]
