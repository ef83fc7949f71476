"""``mmfront serve``: the OpenAI-compatible HTTP server that takes ``vllm serve``'s place, in front
of mmfront's engine link (:mod:`mmfront.engine`)."""
