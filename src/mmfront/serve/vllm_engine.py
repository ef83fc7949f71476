"""vLLM's own engine cores as ``mmfront serve``'s local engines (``--engine vllm``): where vLLM's CLI
is, and the command line that starts engine rank ``r`` of them.

vLLM is found as its own ``vllm`` command: the one ``--vllm-command`` names (vLLM's CLI, or the
python of a venv holding vLLM), else vLLM importable in this environment (``python -m
vllm.entrypoints.cli.main``, the module behind the ``vllm`` script), else the ``vllm`` on ``PATH``.

Each local rank is one ``vllm serve MODEL --headless`` process, started with the user's MODEL and
engine flags as typed (:attr:`~mmfront.serve.settings.LocalEngineOptions.vllm_args`) and the
data-parallel placement of that rank, meeting this server through vLLM's start-up handshake over
``tcp`` (vLLM's CLI has no other handshake for headless engines): one process per rank, so that
the launcher watches, logs and stops each rank's process group as it does ``mmfront worker``'s.
This module imports nothing heavy: ``mmfront serve --help`` names the engine it finds.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from mmfront.errors import ConfigError

EngineKind = Literal["vllm", "mmfront"]
VLLM_CLI_MODULE = "vllm.entrypoints.cli.main"
VLLM_ENGINE_NAME = "vLLM engine core"
VLLM_ENGINE_KIND = f"{VLLM_ENGINE_NAME} ('vllm serve --headless')"
"""What the local engines are with ``--engine vllm``, as the banner says it."""


def vllm_cli(command: str | None = None) -> tuple[str, ...] | None:
    """vLLM's ``vllm`` command as an argv prefix: ``command`` (a ``vllm`` script, or a python that
    imports vLLM; a :class:`~mmfront.errors.ConfigError` when it is neither a file nor on ``PATH``),
    else vLLM importable here, else ``vllm`` on ``PATH``; ``None`` where there is none."""
    if command is not None:
        found = command if Path(command).is_file() else shutil.which(command)
        if found is None:
            raise ConfigError(f"--vllm-command {command!r} is neither a file nor a command on PATH; give vLLM's CLI "
                              "(VENV/bin/vllm) or the python of the venv that holds vLLM (VENV/bin/python).")
        return (found, "-m", VLLM_CLI_MODULE) if Path(found).name.startswith("python") else (found,)
    if importlib.util.find_spec("vllm") is not None:
        return (sys.executable, "-m", VLLM_CLI_MODULE)
    on_path = shutil.which("vllm")
    return None if on_path is None else (on_path,)


def vllm_engine_command(cli: Sequence[str], args: Sequence[str], rank: int, data_parallel_size: int, *,
                        handshake_host: str, handshake_port: int) -> list[str]:
    """``vllm serve`` as this server starts engine ``rank`` of ``data_parallel_size``: ``args`` (MODEL
    and the engine flags as the user typed them), headless, greeting the handshake at
    ``tcp://handshake_host:handshake_port``."""
    return [*cli, "serve", *args, "--headless", "--data-parallel-size", str(data_parallel_size),
            "--data-parallel-size-local", "1", "--data-parallel-start-rank", str(rank),
            "--data-parallel-address", handshake_host, "--data-parallel-rpc-port", str(handshake_port)]


def tcp_host_port(address: str) -> tuple[str, int]:
    """``tcp://HOST:PORT`` (as zmq reports a bound endpoint; ``[v6]`` unbracketed) as host and port."""
    if not address.startswith("tcp://"):
        raise ConfigError(f"vLLM's headless engines greet a tcp:// handshake address, not {address!r}.")
    host, port = address[len("tcp://"):].rsplit(":", 1)
    return host.strip("[]"), int(port)


__all__ = ["VLLM_CLI_MODULE", "VLLM_ENGINE_KIND", "VLLM_ENGINE_NAME", "EngineKind", "tcp_host_port",
           "vllm_cli", "vllm_engine_command"]
