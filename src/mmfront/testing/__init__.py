"""Offline HF processors for tests, benchmarks and the demo (no model hub, ever).

- :mod:`mmfront.testing.api`: the public fixtures API, the only names of this package and of
  :mod:`mmfront.fixtures` that product code calls (``mmfront demo`` and ``mmfront models``).
- :mod:`mmfront.testing.models`: every fixture kind the fixture modules declare (tiny real HF
  processors built in memory by ``mmfront.fixtures.models.<model>``: Gemma3 tiny and at real
  sizes, Idefics3, Emu3, Qwen2-Audio, GLM-ASR, Qwen2.5-VL, LLaVA-OneVision) saved as a model
  folder that ``AutoProcessor.from_pretrained`` loads, and the cached default model of
  ``make demo``.
- :mod:`mmfront.testing.processors`: helpers to read the processors' outputs.
- :mod:`mmfront.testing.weights`: random-weight models of the real architectures, saved next to
  the processors (``build_model_folder(..., with_weights=True)``) for tests that run the model.
- :mod:`mmfront.fixtures`: the fixtures themselves, one module per model, and their building
  blocks (deterministic BPE tokenizers, image processor classes, tower sizes).
- :mod:`mmfront.testing.media`: seeded sample images and audio, as data URLs and WAV bytes.

Nothing is re-exported here, so importing :mod:`mmfront.testing.media` or
:func:`mmfront.testing.models.default_model_dir` does not pay for importing transformers.
"""
