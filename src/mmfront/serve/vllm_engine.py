"""vLLM's own engine cores as ``mmfront serve``'s local engines (``--engine vllm``): where vLLM's CLI
is, and the command line that starts engine rank ``r`` of them.

vLLM is found as its own ``vllm`` command: the one ``--vllm-command`` names (vLLM's CLI, or the
python of a venv holding vLLM), else vLLM importable in this environment, else the ``vllm`` on
``PATH``.

Each local rank is one ``vllm serve MODEL --headless`` process, started with the user's MODEL and
engine flags as typed (:attr:`~mmfront.serve.settings.LocalEngineOptions.vllm_args`) and the
data-parallel placement of that rank, meeting this server through vLLM's start-up handshake over
``tcp`` (vLLM's CLI has no other handshake for headless engines): one process per rank, so that
the launcher watches, logs and stops each rank's process group as it does ``mmfront worker``'s.

The CLI runs in vLLM's python as :data:`VLLM_CLI_CODE`: vLLM's ``main``, its ``atexit`` handlers,
then the end of the process without the interpreter's teardown. On SIGTERM ``vllm serve
--headless`` stops its engine core as vLLM's API server stops its own (SIGTERM, then the core's
process tree killed once ``--shutdown-timeout`` is over: at once by default) and returns; what is
left is the teardown of an interpreter holding torch and vLLM, whose final garbage collection
releases nothing (the engine core is gone; the resource tracker cleans up when the process ends)
and took 2-7 s of every stop here. ``mmfront serve`` ends its own process the same way. The python
is read from a ``vllm`` script's ``#!`` line; a script whose python cannot be read runs as it is.
This module imports nothing heavy: ``mmfront serve --help`` names the engine it finds.
"""

from __future__ import annotations

import importlib.util
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from mmfront.errors import ConfigError

EngineKind = Literal["vllm", "mmfront"]
VLLM_CLI_MODULE = "vllm.entrypoints.cli.main"
VLLM_CLI_CODE = f"""import atexit, os, sys, traceback
sys.argv[0] = "vllm"
try:
    from {VLLM_CLI_MODULE} import main
    main()
    status = 0
except SystemExit as exit:
    status = exit.code if isinstance(exit.code, int) else int(exit.code is not None)
    if exit.code is not None and not isinstance(exit.code, int):
        print(exit.code, file=sys.stderr)
except BaseException:
    traceback.print_exc()
    status = 1
atexit._run_exitfuncs()
sys.stdout.flush()
sys.stderr.flush()
os._exit(status)
"""
"""What vLLM's python runs (``python -c``; the arguments after it are ``vllm``'s): vLLM's CLI, then the
end of the process after its ``atexit`` handlers, without the interpreter's teardown."""
VLLM_ENGINE_NAME = "vLLM engine core"
VLLM_ENGINE_KIND = f"{VLLM_ENGINE_NAME} ('vllm serve --headless')"
"""What the local engines are with ``--engine vllm``, as the banner says it."""
_SH_EXEC = "'''exec' "
"""How the second line of pip's ``#!/bin/sh`` console script (for a python path too long for ``#!``) begins."""


def vllm_cli(command: str | None = None) -> tuple[str, ...] | None:
    """vLLM's ``vllm`` command as an argv prefix: ``command`` (a ``vllm`` script, or a python that
    imports vLLM; a :class:`~mmfront.errors.ConfigError` when it is neither a file nor on ``PATH``),
    else vLLM importable here, else ``vllm`` on ``PATH``; ``None`` where there is none. It is vLLM's
    python running :data:`VLLM_CLI_CODE`, or the script itself where its python cannot be read."""
    if command is not None:
        found = command if Path(command).is_file() else shutil.which(command)
        if found is None:
            raise ConfigError(f"--vllm-command {command!r} is neither a file nor a command on PATH; give vLLM's CLI "
                              "(VENV/bin/vllm) or the python of the venv that holds vLLM (VENV/bin/python).")
        return _cli_of(found)
    if importlib.util.find_spec("vllm") is not None:
        return (sys.executable, "-c", VLLM_CLI_CODE)
    on_path = shutil.which("vllm")
    return None if on_path is None else _cli_of(on_path)


def _cli_of(program: str) -> tuple[str, ...]:
    """``program`` (a python, or a ``vllm`` script) as the argv prefix that runs vLLM's CLI."""
    python = program if Path(program).name.startswith("python") else script_python(program)
    return (program,) if python is None else (python, "-c", VLLM_CLI_CODE)


def script_python(script: str) -> str | None:
    """The python a console script (``VENV/bin/vllm``, as pip and uv write it) runs under: its ``#!``
    line's, or the one the ``#!/bin/sh`` form ``exec``s; ``None`` unless that names a python file."""
    try:
        with open(script, "rb") as f:
            head = f.read(1024).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    words = shlex.split(head[0][2:])
    if words and Path(words[0]).name == "sh" and len(head) > 1 and head[1].startswith(_SH_EXEC):
        words = shlex.split(head[1][len(_SH_EXEC):])
    python = Path(words[0]) if words else None
    return str(python) if python is not None and python.name.startswith("python") and python.is_file() else None


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


__all__ = ["VLLM_CLI_CODE", "VLLM_CLI_MODULE", "VLLM_ENGINE_KIND", "VLLM_ENGINE_NAME", "EngineKind",
           "script_python", "tcp_host_port", "vllm_cli", "vllm_engine_command"]
