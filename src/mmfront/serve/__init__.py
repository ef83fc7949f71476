"""``mmfront serve``: the OpenAI-compatible HTTP server that takes ``vllm serve``'s place, in front
of mmfront's engine link (:mod:`mmfront.engine`). :func:`create_app` is the ASGI app (mount it in
your own, or run it with uvicorn); :class:`ServeSettings` is what it is configured with."""

from mmfront.serve.app import create_app
from mmfront.serve.settings import ServeSettings

__all__ = ["ServeSettings", "create_app"]
