"""Offline HF processors for tests, benchmarks and the demo (no model hub, ever).

- :mod:`mmfront.testing.processors`: tiny real HF processors built in memory (Gemma3, Idefics3,
  Emu3, Qwen2-Audio, GLM-ASR) plus Gemma3 at real sizes, and helpers to read their outputs.
- :mod:`mmfront.testing.models`: the same processors saved as model folders that
  ``AutoProcessor.from_pretrained`` loads, and the cached default model of ``make demo``.
- :mod:`mmfront.testing.weights`: random-weight models of the real architectures, saved next to
  the processors (``build_model_folder(..., with_weights=True)``) for tests that run the model.
- :mod:`mmfront.testing.bpe`: the deterministic byte-level BPE tokenizers behind them.
- :mod:`mmfront.testing.media`: seeded sample images and audio, as data URLs and WAV bytes.

Nothing is re-exported here, so importing :mod:`mmfront.testing.media` or
:func:`mmfront.testing.models.default_model_dir` does not pay for importing transformers.
"""
