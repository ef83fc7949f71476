"""``mmfront serve``: the OpenAI-compatible HTTP server that takes ``vllm serve``'s place, in front
of mmfront's engine link (:mod:`mmfront.engine`). :func:`mmfront.serve.app.create_app` is the ASGI
app; :class:`mmfront.serve.settings.ServeSettings` is what it is configured with. This package
imports nothing itself, so the command line can read the settings without loading the server."""
