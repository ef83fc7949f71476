"""Requests in, processed inputs and ``EngineCoreRequest``s out.

:class:`ModelPipeline` owns one model's processor, P0 caches, statistics and item executor (the processing lanes),
and is where requests are prepared and committed. Over it, under vLLM's names,
:class:`InputPreprocessor` takes a chat conversation, a prompt string, token ids, or a vLLM
prompt dict, plus multimodal data, and returns vLLM's ``MultiModalInputs``; :class:`InputProcessor`
adds the request-level checks of vLLM's ``InputProcessor`` (empty prompt, model length, encoder
budget, vocabulary) and flattens the items into ``MultiModalFeatureSpec``s sorted by placeholder
offset.

Preparing a request only *reads* the P0 cache. The caches P1 depends on (the mirrored LRU, shared
memory) change only when a request is committed, and a request is committed only by the step
that hands it to the transport (:meth:`InputProcessor.commit`, run by
``mmfront.engine.client.EngineClient`` in its ordered lane). So a request that is processed and
never sent leaves no trace, and ``preprocess`` then ``process_inputs`` on the same messages gives
a request that carries all of its data.

Thread-safety: :meth:`InputPreprocessor.preprocess`, :meth:`InputProcessor.prepare` and
:meth:`InputProcessor.process_inputs` may run on many threads at once (media loading, hashing and
HF processing run in parallel); :meth:`InputProcessor.commit` must be called from one lane at a
time, in the order the requests are sent.
"""

from mmfront.preprocess.input_processor import InputProcessor, PreparedRequest
from mmfront.preprocess.options import PromptInput, RequestOptions
from mmfront.preprocess.pipeline import ModelPipeline
from mmfront.preprocess.preprocessor import InputPreprocessor

__all__ = ["InputPreprocessor", "InputProcessor", "ModelPipeline", "PreparedRequest", "PromptInput", "RequestOptions"]
