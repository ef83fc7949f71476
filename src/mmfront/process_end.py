"""Ending a process without the interpreter's teardown: with torch and transformers loaded,
tearing the modules down (their final garbage collection) took 1-10 s of every stop here and has
nothing left to release once a server has stopped its engines and closed its sockets and shared
memory. ``mmfront serve``, each of its API server processes and ``vllm serve --headless`` under it
end this way."""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
from collections.abc import Callable
from typing import NoReturn

__all__ = ["end_the_process", "run_and_end_the_process"]


def end_the_process(status: int, *, run_exit_handlers: bool = False) -> NoReturn:
    """Flush the logs and the standard streams, then end with ``status`` at once.
    ``run_exit_handlers``: run the ``atexit`` handlers first (a process that ends here outside
    :func:`run_and_end_the_process`, whose ending is itself one of them)."""
    if run_exit_handlers:
        atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_and_end_the_process(command: Callable[[], int]) -> int:
    """Run ``command`` (a server's whole life), then end the process without the teardown. The
    ``atexit`` handlers registered while the command runs run first (the ending is registered
    before them); the one registered earlier, by importing :mod:`logging`, is the ending's own
    first step. The status is the command's, or the one its exception ends the process with."""
    status = [1]
    atexit.register(lambda: end_the_process(status[0]))
    try:
        status[0] = command()
    except SystemExit as e:
        status[0] = e.code if isinstance(e.code, int) else int(e.code is not None)
        raise
    except KeyboardInterrupt:
        status[0] = 128 + signal.SIGINT
        raise
    return status[0]
