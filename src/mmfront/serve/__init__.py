"""``mmfront serve``: the OpenAI-compatible HTTP server that takes ``vllm serve``'s place, in front
of mmfront's engine link (:mod:`mmfront.engine`). :func:`create_app` is the ASGI app (mount it in
your own, or run it with uvicorn); :class:`ServeSettings` is what it is configured with.

Both are imported on first use (PEP 562): the ``mmfront`` command builds its parser from
:mod:`mmfront.serve.args`, and ``mmfront --help`` must not wait for the app, the engine client
and torch to load.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mmfront.serve.app import create_app
    from mmfront.serve.settings import ServeSettings

_HOMES = {"create_app": "mmfront.serve.app", "ServeSettings": "mmfront.serve.settings"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'mmfront.serve' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = ["ServeSettings", "create_app"]
